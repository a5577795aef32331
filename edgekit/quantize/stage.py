"""The quantize stage: FP32 ONNX model + plan -> quantized ONNX model, with its calibration recorded.

Calibration ranges are cached by (model hash, data hash, calibrator) under the build cache and copied
into the bundle (``calibration/``), so a later build with the same model and data reuses them.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize import channel_spread, cnn_folding, float_writers
from edgekit.quantize.calibration.from_recipe import calibrator_spec, default_cache_dir
from edgekit.quantize.ort import dynamic, graph_files, int4, static_plan, static_qdq
from edgekit.quantize.plan import QuantizationPlan, make_plan
from edgekit.recipe import QuantizationSpec
from edgekit.target import TargetProfile

log = logging.getLogger(__name__)

#: Precisions this stage writes as ONNX graphs: ONNX Runtime's integer formats, then the floating-point
#: formats of Hopper/Blackwell GPUs (which this host evaluates on a decoded twin, see ``float_writers``).
WRITTEN = (Precision.INT8, Precision.INT8_DYNAMIC, Precision.INT4, *float_writers.WRITTEN)


@dataclass(frozen=True)
class QuantizedModel:
    path: Path
    plan: QuantizationPlan | None  # None when auto chose an unquantized precision (fp32, fp16)
    calibration: dict[str, Any] | None = None  # manifest section: calibrator, key, cache file, from_cache
    calibration_file: Path | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: A graph this host's ONNX Runtime can run in place of ``path`` (same weights, decoded), when it cannot run ``path``.
    host_twin: Path | None = None

    def to_manifest(self) -> dict[str, Any]:
        return {"plan": self.plan.to_manifest() if self.plan else None, "calibration": self.calibration, **self.details}


def calibrate_plan(pre_path: Path, plan: QuantizationPlan, spec: QuantizationSpec, batches: list[dict[str, np.ndarray]],
                   workdir: Path, cache_dir: Path | None = None) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """Ranges for every tensor the static writer needs, from the cache when it has them."""
    from edgekit.quantize.calibration import CalibrationCache, calibrate
    from edgekit.quantize.calibration.errors import CalibrationError

    if spec.calibration_batches:
        batches = batches[: spec.calibration_batches]
    cache = CalibrationCache(cache_dir or default_cache_dir())
    tensor_names = static_plan.calibration_tensors(pre_path, plan)
    if not tensor_names:  # BatchNormalization, Identity, Cast or custom ops only: no activation feeds a quantizable op
        raise CalibrationError(
            f"precision {plan.precision.value} finds nothing to quantize in this model: no MatMul, Gemm, Conv or other "
            "quantizable op takes an activation input",
            hint="build it at fp32 or fp16 (int8 would change nothing), or check that model.path names the intended graph")  # fmt: skip
    result = calibrate(pre_path, batches, calibrator_spec(spec, plan), tensor_names=tensor_names, cache=cache, work_dir=workdir)
    section = {
        "calibrator": spec.calibrator,
        "percentile": spec.percentile if spec.calibrator == "percentile" else None,
        "batches": len(batches),
        "samples": int(sum(next((a.shape[0] for a in b.values() if getattr(a, "ndim", 0) > 0), 1) for b in batches)),
        "tensors": len(result.ranges),
        "key": result.key.digest,
        "from_cache": result.from_cache,
    }
    return result.ranges, section, result.cache_path


def quantize_model(fp32_path: Path, out_path: Path, spec: QuantizationSpec, target: TargetProfile, backend: Backend,
                   precision: Precision, calibration_batches: list[dict[str, np.ndarray]] | None, workdir: Path,
                   plan: QuantizationPlan | None = None, cache_dir: Path | None = None) -> QuantizedModel:
    """Write ``out_path``: ``fp32_path`` quantized for ``precision`` under ``plan`` (default: the precision's plan)."""
    if precision not in WRITTEN:
        raise QuantizationError(
            f"precision {precision.value} has no quantization graph writer: it is not a quantized format",
            hint=f"writers: {', '.join(p.value for p in WRITTEN)}",
        )
    refine = plan is None  # a plan handed in (by the auto search) is used as it is
    plan = plan or make_plan(spec, target, backend, precision)
    if precision is Precision.INT4:  # settings the int4 writer cannot honour (hqq on TensorRT) fail before any work
        int4.check_int4_settings(plan.int4, plan.backend)
    pre = graph_files.preprocess(fp32_path, workdir / "preprocessed.onnx")
    if precision in float_writers.WRITTEN:
        return _write_float_format(pre, out_path, plan, spec, calibration_batches, workdir, cache_dir)
    if precision is Precision.INT8:
        if backend is Backend.ONNXRUNTIME:
            pre, folds = cnn_folding.fold_for_int8(pre, workdir / "folded.onnx")
            if folds.note() and refine:
                plan = replace(plan, notes=(*plan.notes, folds.note()))
        if refine:
            plan = static_plan.static_int8_plan(plan, pre)
        if not calibration_batches:
            raise QuantizationError("static int8 needs calibration data", hint="add data.calibration to the recipe (a callable or an npz_dir)")
        if refine:
            plan = channel_spread.keep_wide_spread_convs_float(pre, plan, calibration_batches)
        ranges, section, cache_file = calibrate_plan(pre, plan, spec, calibration_batches, workdir, cache_dir)
        plan = static_qdq.write_static_qdq_around_failures(pre, out_path, plan, ranges)
        _drop_shape_annotations(out_path, backend)
        return QuantizedModel(out_path, plan, section, cache_file)
    if precision is Precision.INT8_DYNAMIC:
        dynamic.write_dynamic(pre, out_path, plan)
        note = dynamic.dynamic_coverage_note(pre, plan)
        if not graph_files.quantized_ops(out_path):  # never a bundle labelled int8-dynamic that holds a float model
            raise QuantizationError(
                f"{fp32_path.name}: " + (note or f"int8-dynamic quantized nothing: no weights of {'/'.join(plan.op_types) or 'no op type'} "
                f"left to quantize ({len(plan.excluded)} node(s) excluded by the recipe or the plan)"),
                hint="int8-dynamic quantizes the weights of MatMul and Gemm; check quantization.exclude_nodes and "
                     "exclude_op_types, use int8 (static, calibrated) for a convolutional model, or build at fp32/fp16")  # fmt: skip
        _drop_shape_annotations(out_path, backend)
        recurrent = static_plan.recurrent_note(pre)
        plan = replace(plan, notes=(*plan.notes, *([recurrent] if recurrent else []), *([note] if note else [])))
        if note:  # never a silent no-op: the manifest's plan says it, and so does the build's log
            log.warning("%s: %s", fp32_path.name, note)
        return QuantizedModel(out_path, plan, details={"warnings": [note]} if note else {})
    int4.write_int4(pre, out_path, plan)
    note = int4.int4_coverage_note(pre, plan)
    if note:  # never a silent int4 label on a mostly float model: the manifest's plan says it, and so does the build's log
        plan = replace(plan, notes=(*plan.notes, note))
        log.warning("%s: %s", fp32_path.name, note)
    return QuantizedModel(out_path, plan, details={"warnings": [note]} if note else {})


def _drop_shape_annotations(path: Path, backend: Backend) -> None:
    """An ONNX Runtime bundle's model without pre-processing's shape annotations, as auto's candidates are
    timed: ONNX Runtime infers them again and runs 7-13 % faster without them (int8 and int8-dynamic of
    YOLOS, wav2vec2 and SegFormer, interleaved, 2 threads, AVX-512 VNNI host)."""
    if backend is Backend.ONNXRUNTIME:
        graph_files.without_shape_annotations(path, path)


def _write_float_format(pre: Path, out_path: Path, plan: QuantizationPlan, spec: QuantizationSpec,
                        calibration_batches: list[dict[str, np.ndarray]] | None, workdir: Path, cache_dir: Path | None) -> QuantizedModel:
    """FP8 (calibrated activations) or a block format; plus the decoded twin this host evaluates."""
    amax: dict[str, float] | None = None
    section = cache_file = None
    if plan.precision.needs_calibration:  # fp8's activation scales, nvfp4's activation tensor scales
        if not calibration_batches:
            raise QuantizationError(f"{plan.precision.value} needs calibration data for its activation scales",
                                    hint="add data.calibration to the recipe (a callable or an npz_dir)")
        ranges, section, cache_file = calibrate_plan(pre, plan, spec, calibration_batches, workdir, cache_dir)
        amax = {name: max(abs(float(r.min)), abs(float(r.max))) for name, r in ranges.items()}
    written = float_writers.write_float_format(pre, out_path, plan, amax)
    twin = float_writers.fold_weight_dequantize(out_path, out_path.with_name(out_path.stem + ".host-twin.onnx"))
    return QuantizedModel(out_path, plan, section, cache_file, details={"format": written.to_manifest(), "host_evaluation": float_writers.HOST_TWIN},
                          host_twin=twin)


def copy_calibration(model: QuantizedModel, bundle_dir: Path) -> str | None:
    """Put the calibration cache file into the bundle; returns its bundle-relative path."""
    if model.calibration_file is None or not Path(model.calibration_file).is_file():
        return None
    target = bundle_dir / "calibration" / Path(model.calibration_file).name
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(model.calibration_file, target)
    return target.relative_to(bundle_dir).as_posix()


def search_auto_precision(fp32_path: Path, out_path: Path, recipe: Any, target: TargetProfile, backend: Backend,
                          calibration_batches: list[dict[str, np.ndarray]], evaluation_batches: list[dict[str, np.ndarray]],
                          bench_feeds: dict[str, np.ndarray], workdir: Path, threads: int, fixed_s: float = 0.0,
                          backend_reason: str = "", reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
                          reference_source: str = "onnxruntime-fp32") -> tuple[QuantizedModel, Any]:
    """``--precision auto``: the fastest plan this target supports that meets the recipe's budget (see
    :mod:`edgekit.quantize.auto`). Writes the chosen model to ``out_path``; returns it and the search result.
    ``fixed_s``: the seconds the build spent before the search, which a plain int8 build spends too (the
    search's time budget is a multiple of that build). On a target that allows OpenVINO too (and a backend the user did
    not name, ``backend_reason``), OpenVINO's candidates are tried beside ONNX Runtime's (:mod:`edgekit.quantize.ov.auto`)
    and the manifest's ``auto.engines`` says which engines were tried and why the winner won. ``reference``: what candidates
    are judged against, named ``reference_source`` in the manifest's ``auto.reference``; None: ``fp32_path`` itself. A pruned
    build passes the unpruned model, which the evaluate stage checks the budget against, so that the search does not hand
    the whole budget to quantization on top of the pruning's loss."""
    from edgekit.quantize.ort.judges import OrtInterleavedTimer, RecipeEvaluator, recipe_metric_spec
    from edgekit.quantize.ort.planner import plan_auto_onnxruntime
    from edgekit.quantize.calibration import CalibrationCache
    from edgekit.quantize.gating import supported_precisions

    spec = recipe.evaluation
    if spec is None:
        raise QuantizationError(f"{recipe.path}: --precision auto needs an evaluation section with a metric and a budget",
                                hint="add evaluation: {metric: cosine, budget: {min_value: 0.99}} (or choose a precision)")
    if not calibration_batches:
        raise QuantizationError(f"{recipe.path}: --precision auto needs data.calibration", hint="add a calibration data source to the recipe")
    from edgekit.quantize.ov.auto import for_search

    engines = for_search(target, backend, backend_reason, workdir / "auto" / "openvino", threads, spec=recipe.build.quantization)
    # Candidates are judged by the recipe's own metric (task metrics and callables too), as the build's evaluation stage does.
    evaluator: RecipeEvaluator
    if engines is not None:
        evaluator = engines.evaluator(recipe, evaluation_batches, fp32_path, threads=threads)
    else:
        evaluator = RecipeEvaluator(recipe, evaluation_batches, fp32_path, threads=threads)
    if reference is not None:
        from edgekit.evaluate.accuracy import run_reference

        evaluator.reference_outputs = run_reference(recipe, reference, evaluator.batches)
        evaluator.reference_source = reference_source
    else:
        reference_source = "onnxruntime-fp32"
    if getattr(recipe, "state", None):
        # Candidates run each sequence call by call, carrying their own state (the evaluator); the per-batch
        # sensitivity pass sees each chunk with the state FP32 carries into it, as calibration does.
        from edgekit.data import run_batches

        evaluation_batches = run_batches(recipe, evaluator._runner(fp32_path), list(evaluation_batches))[0]
    timer: OrtInterleavedTimer
    if engines is not None:
        timer = engines.timer(bench_feeds, threads=threads, keep_loaded=[fp32_path])
    else:
        timer = OrtInterleavedTimer(bench_feeds, threads=threads, keep_loaded=[fp32_path])
    result = plan_auto_onnxruntime(
        fp32_path, workdir / "auto", spec=recipe.build.quantization, target=target, backend=backend,
        supported=supported_precisions(target, backend), calibration_batches=calibration_batches, evaluation_batches=evaluation_batches,
        metric=recipe_metric_spec(recipe), evaluate=evaluator, time_models=timer,
        cache=CalibrationCache(default_cache_dir()), threads=threads, time_budget_s=recipe.build.quantization.auto_time_budget_s,
        bench_feeds=bench_feeds, fixed_s=fixed_s, engines=engines,
        budget_text="the recipe's evaluation.budget" + ("" if reference is None else f" (measured against {reference_source}, as the evaluate stage does)"),
    )
    shutil.copyfile(result.model_path, out_path)
    plan = result.plan if result.chosen.precision in WRITTEN else None
    details = {"auto": {**result.to_manifest(), "reference": reference_source}}  # what every candidate's value is measured against
    if engines is not None:
        details["auto"]["engines"] = engines.summary(result.table, result.chosen)
        details.update(engines.manifest_extra(result.chosen))  # NNCF's int8 won: its quantizer record, as a plain nncf build's
    return QuantizedModel(out_path, plan, details=details), result
