"""The build pipeline: recipe + target profile -> checked, evaluated, benchmarked bundle directory.

Each stage below is a small function that reads the artifacts earlier stages left in a
:class:`BuildState` and adds its own; the real work lives in the stage's package (``sources``,
``prune``, ``export``, ``quantize``, ``engines``, ``evaluate``, ``bundle``, ``report``). This module
composes them, times them for the manifest and reports progress. Everything is written into a staging
directory renamed into place at the end, so a failed or interrupted build leaves nothing behind.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.bench.counts import bench_counts, recipe_sets_counts
from edgekit.bundle.golden import derive_tolerances, golden_batches, margin_for, output_batch_axes, write_golden
from edgekit.bundle.disk_full import build_places, disk_full_as_error
from edgekit.bundle.leftovers import work_folder
from edgekit.bundle.manifest import SCHEMA_VERSION, file_hashes, host_description, model_constant_args, model_opset, toolchain_versions, write_manifest
from edgekit.bundle.staging import BundleStaging, check_destination
from edgekit.data import Batch, accuracy_batches, dims_at, fit_batch, load_batches, model_inputs, run_batches, sequence_steps, with_accuracy_data
from edgekit.engines import BUILDERS, EngineBuild
from edgekit.engines.onnxruntime import device_threads
from edgekit.engines.openvino_nncf import check_quantizer
from edgekit.errors import BuildError
from edgekit.evaluate import AccuracyResult, check_budget, evaluate_accuracy
from edgekit.evaluate.accuracy import run_reference
from edgekit.export import check_and_infer, check_parity, export_onnx
from edgekit.io_signature import check_inputs, io_section
from edgekit.precision import Backend, Precision
from edgekit.progress import SKIPPED, StageReporter
from edgekit.quantize import float_writers
from edgekit.quantize.gating import PrecisionDecision, decide_precision
from edgekit.recipe import Recipe, load_recipe
from edgekit.sources import LoadedModel, load_source
from edgekit.target import TargetProfile, get_target
from edgekit.torch_reference import TorchReference
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.signature import STRING_DTYPE, IOSignature
from edgekit_runtime.timing import BenchmarkResult, benchmark_runner, time_calls

log = logging.getLogger(__name__)

#: Precisions that need no quantize stage: FP16 is a conversion (ONNX Runtime) or a builder flag / cast
#: (TensorRT), BF16 a TensorRT builder flag.
UNQUANTIZED = (Precision.FP32, Precision.FP16, Precision.BF16)
#: Self-check tolerance (relative, min cosine) for precisions a TensorRT builder applies on the device.
DEVICE_APPLIED_TOLERANCE = {Precision.FP16: (0.02, 0.999), Precision.BF16: (0.05, 0.99)}
#: Providers this host can run when the target's own are elsewhere (a Jetson EP on an x86 dev host).
HOST_PROVIDERS = [{"name": "CPUExecutionProvider", "options": {}}]
RunFn = Callable[[Batch], dict[str, np.ndarray]]


@dataclass(frozen=True)
class BuildResult:
    bundle_dir: Path
    manifest: dict[str, Any]


@dataclass
class BuildState:
    """The artifacts of one build, filled in stage by stage."""

    recipe: Recipe
    target: TargetProfile
    backend: Backend
    backend_reason: str
    decision: PrecisionDecision
    out_dir: Path
    samples: list[Batch]
    evaluation: list[Batch] | None
    calibration: list[Batch] | None
    threads: int
    workdir: Path = Path()
    staging_dir: Path = Path()
    loaded: LoadedModel | None = None
    reference: RunFn | None = None  # the FP32 truth: the unpruned PyTorch model, or the FP32 graph
    reference_source: str = "pytorch-fp32"
    export_module: Any = None  # what is exported: the source module, pruned if the recipe prunes
    open_runners: list[OnnxRuntimeRunner] = field(default_factory=list)
    auto: bool = False  # --precision auto: the quantize stage searches for the precision
    prune_left_out: bool = False  # built with prune=False from a recipe that prunes (the manifest's recipe says so)
    prune: dict[str, Any] | None = None
    fp32_path: Path = Path()
    opset: int = 0
    export: dict[str, Any] = field(default_factory=dict)
    signature_dict: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    model_path: Path = Path()  # the graph the engine builder takes (FP32 export or quantized)
    host_twin: Path | None = None  # what this host runs instead when it cannot run the bundle's graph (FP4 weights)
    engine: EngineBuild | None = None
    accuracy: AccuracyResult | None = None
    golden: dict[str, Any] = field(default_factory=dict)
    bench: BenchmarkResult | None = None
    bench_dims: dict[str, int] = field(default_factory=dict)
    bench_providers: list[str] = field(default_factory=list)
    bench_counts: str = "recipe build.benchmark"  # where the bench's warm-up and timed call counts came from

    @property
    def precision(self) -> Precision:
        return self.decision.used

    @property
    def signature(self) -> IOSignature:
        return IOSignature.from_manifest(self.signature_dict)

    def runner(self, model_path: Path, providers: list[dict[str, Any]] | None = None, graph_optimization: str = "all",
               denormal_as_zero: bool = False) -> OnnxRuntimeRunner:
        return OnnxRuntimeRunner(model_path, self.signature, execution_providers=providers or HOST_PROVIDERS,
                                 graph_optimization=graph_optimization, intra_op_threads=self.threads,
                                 denormal_as_zero=denormal_as_zero).load()


def default_output(recipe: Recipe, target: TargetProfile, precision: Precision) -> Path:
    return Path("bundles") / f"{recipe.name}-{target.name}-{precision.value}"


def host_providers(target_providers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target's providers that can load on this host, else the CPU provider."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    usable = [p for p in target_providers if p["name"] in available]
    return usable or HOST_PROVIDERS


#: Backends whose engines have no string tensors (a TensorRT network's are numeric).
NO_STRING_TENSORS = frozenset({Backend.TENSORRT})


def choose_backend(recipe: Recipe, target: TargetProfile) -> tuple[Backend, str]:
    """The recipe's backend if it names one (an error if it cannot be built here), else the target's
    most preferred backend that this edgekit can build; the reason goes into the manifest."""
    strings = [spec.name for spec in recipe.inputs if spec.dtype == STRING_DTYPE]
    if recipe.build.backend is not None:
        backend = Backend(recipe.build.backend)
        target.backend(backend)  # raises when the target has no such backend
        if backend not in BUILDERS:
            raise BuildError(
                f"{recipe.path}: build.backend {backend.value} has no builder in this edgekit version (target '{target.name}')",
                hint=f"use build.backend: {' or '.join(b.value for b in BUILDERS)}",
            )
        if strings and backend in NO_STRING_TENSORS:
            raise BuildError(f"{recipe.path}: build.backend {backend.value} has no string tensors, and input '{strings[0]}' is one",
                             hint="use build.backend: onnxruntime, which runs string tensors (tokenizer-in-graph models, labels)")  # fmt: skip
        return backend, "recipe build.backend"
    passed: list[str] = []
    for support in target.backends:
        if support.name in BUILDERS and not (strings and support.name in NO_STRING_TENSORS):
            reason = "target preference" + "".join(f"; {why}" for why in passed)
            return support.name, reason
        passed.append(f"{support.name.value} has no builder in this edgekit version" if support.name not in BUILDERS
                      else f"{support.name.value} has no string tensors (input '{strings[0]}')")  # fmt: skip
    raise BuildError(
        f"target '{target.name}' lists no backend this edgekit can build ({', '.join(b.name.value for b in target.backends)})",
        hint=f"builders available: {', '.join(b.value for b in BUILDERS)}",
    )


# ---------------------------------------------------------------------------------------------- stages


def stage_load(recipe_path: Path | str, target_name: str, precision: Precision | str | None, out: Path | str | None, force: bool,
               backend_name: Backend | str | None = None, trust_code: bool = False, prune: bool = True) -> BuildState:
    recipe = load_recipe(recipe_path, trust_code=trust_code)
    target = get_target(target_name)
    recipe = recipe.for_target(target.name)
    prune_left_out = not prune and recipe.build.prune is not None
    if prune_left_out:  # the recipe's build without its prune section (a sweep's unpruned variant)
        recipe = recipe.model_copy(update={"build": recipe.build.model_copy(update={"prune": None})})
    if backend_name is not None:
        recipe = recipe.model_copy(update={"build": recipe.build.model_copy(update={"backend": Backend(backend_name)})})
    check_max_batch(recipe, target)
    backend, backend_reason = choose_backend(recipe, target)
    if backend_name is not None:
        backend_reason = "--backend"
    requested = precision or recipe.build.precision
    auto = str(requested) == "auto"
    if auto and backend is not Backend.ONNXRUNTIME:
        raise BuildError(f"--precision auto searches ONNX Runtime plans; the {backend.value} backend needs an explicit precision",
                         hint="pass --backend onnxruntime, or a precision such as int8")
    use_dla = backend is Backend.TENSORRT and recipe.build.tensorrt.dla_core is not None
    if auto:  # the search decides; FP32 until it has
        decision = PrecisionDecision(Precision.FP32, Precision.FP32, None, "auto")
    else:
        decision = decide_precision(target, backend, Precision(requested), recipe.build.precision_fallback, use_dla=use_dla)
    check_quantizer(recipe.build.quantization, backend, "auto" if auto else decision.used, recipe.path)
    out_dir = Path(out) if out else default_output(recipe, target, decision.used)
    check_destination(out_dir.resolve(), force)
    samples = load_batches(recipe, recipe.data.samples, "samples")
    evaluation = load_batches(recipe, recipe.data.evaluation, "evaluation") if recipe.evaluation and recipe.data.evaluation else None
    if auto and (recipe.evaluation is None or evaluation is None):
        raise BuildError(f"{recipe.path}: --precision auto needs evaluation data and a metric with a budget",
                         hint="add data.evaluation and an evaluation section (metric and budget) to the recipe")
    needs_calibration = auto or decision.used.needs_calibration
    if needs_calibration and recipe.data.calibration is None:
        raise BuildError(f"{recipe.path}: precision {decision.used.value} needs calibration data", hint="add data.calibration (a callable or an npz_dir) to the recipe")
    calibration = load_batches(recipe, recipe.data.calibration, "calibration") if needs_calibration and recipe.data.calibration else None
    threads = recipe.build.benchmark.threads or min(os.cpu_count() or 1, target.cpu.cores)
    state = BuildState(recipe, target, backend, backend_reason, decision, out_dir, samples, evaluation, calibration, threads)
    state.auto, state.prune_left_out = auto, prune_left_out
    return state


def check_max_batch(recipe: Recipe, target: TargetProfile) -> None:
    """The recipe's batch dim (:attr:`Recipe.batch_dim`) stays within the target's ``build.max_batch``."""
    limit, dim = target.build.max_batch, recipe.batch_dim
    if limit is None or dim is None or recipe.dims[dim].max <= limit:
        return
    raise BuildError(f"{recipe.path}: dims.{dim}.max is {recipe.dims[dim].max}, above target '{target.name}' build.max_batch {limit}",
                     hint=f"lower dims.{dim}.max (and opt) to {limit} or less, or raise build.max_batch in the target profile")


def stage_source(state: BuildState) -> None:
    state.loaded = load_source(state.recipe, state.workdir, opset=state.target.build.opset)
    if state.loaded.module is not None:
        state.reference = TorchReference(state.loaded.module, state.recipe)
        state.export_module = state.loaded.module


def stage_prune(state: BuildState) -> None:
    """Prune a copy of the PyTorch model (the unpruned one stays the accuracy reference), then fine-tune."""
    from edgekit.prune.stage import prune_for_build

    assert state.loaded is not None
    state.export_module, state.prune = prune_for_build(state.recipe, state.loaded, state.samples)


def stage_export(state: BuildState) -> str | None:
    recipe, loaded = state.recipe, state.loaded
    assert loaded is not None
    state.opset = recipe.export.opset or state.target.build.opset
    state.fp32_path = state.workdir / "exported.onnx"
    note = ""
    if loaded.onnx_path is None or state.prune is not None:
        if loaded.kind == "exported_program":  # a .pt2 saved with static shapes, named before torch's constraint error
            from edgekit.sources.torch_files import check_dynamic_dims

            check_dynamic_dims(loaded.details["program"], recipe, loaded.description)
        result = export_onnx(state.export_module, recipe, model_inputs(recipe, state.samples[0]), state.opset, state.fp32_path)
        state.opset = result.opset
        state.export = {"exporter": result.exporter, "opset": result.opset, "seconds": round(result.seconds, 3), "fallback_reason": result.fallback_reason,
                        **({"warnings": list(result.warnings)} if result.warnings else {})}
        if result.warnings:  # the legacy tracer froze a data-dependent branch (or the like): the build output says so
            note = f"{result.exporter} exporter warned ({len(result.warnings)}, see manifest export.warnings): {result.warnings[0]}"
    else:
        import onnx

        from edgekit.sources.onnx_file import save_onnx

        save_onnx(onnx.load(str(loaded.onnx_path), load_external_data=True), state.fp32_path)  # past 2 GiB with its .data
        state.export = {"exporter": loaded.exporter or "none", "opset": loaded.details.get("opset", state.opset), "seconds": 0.0, "fallback_reason": None}
        passthrough = loaded.details.get("passthrough_outputs") or []
        if passthrough and (state.auto or state.precision is not Precision.FP32):
            what = "--precision auto" if state.auto else f"precision {state.precision.value}"
            raise BuildError(f"{recipe.path}: model.path: output '{passthrough[0]}' is input '{passthrough[0]}' passed through "
                             f"unchanged; {what} gives every output a node of its own and cannot keep that name twice",
                             hint=f"build it at fp32, or leave '{passthrough[0]}' out of the graph's and the recipe's outputs "
                                  "(the caller has it already)")  # fmt: skip
        if loaded.kind == "onnx":  # a file from another toolchain: named dims, true output shapes, the opset the precision needs
            from edgekit.sources.onnx_file import convert_to_target_opset, needed_opset, upgrade_source_opset
            from edgekit.sources.onnx_outputs import repair_declared_outputs

            check_inputs(recipe, state.fp32_path)  # names, ranks, dtypes: said as such, before the graph first runs
            output_notes = repair_declared_outputs(state.fp32_path, recipe, state.samples[0])
            feeds = [model_inputs(recipe, batch) for batch in state.samples]
            limit = max(state.opset, needed_opset(state.precision, state.auto))  # never below what the precision writes
            conversion = convert_to_target_opset(state.fp32_path, recipe, limit, state.target.name, feeds)
            state.recipe, upgrade = upgrade_source_opset(state.fp32_path, recipe, state.precision, state.auto, feeds)
            conversion = upgrade or conversion
            state.export.update(source_notes=[*(loaded.details.get("notes") or []), *output_notes],
                                opset_conversion=conversion.to_manifest() if conversion else None)
            note = "; ".join([*state.export["source_notes"], *([conversion.describe()] if conversion else [])])
        check_and_infer(state.fp32_path)
    state.signature_dict = io_section(state.recipe, state.fp32_path)
    string_outputs = [o["name"] for o in state.signature_dict.get("outputs", []) if o.get("dtype") == STRING_DTYPE]
    if string_outputs and state.backend in NO_STRING_TENSORS:
        raise BuildError(f"{recipe.path}: output '{string_outputs[0]}' is a string tensor, which the {state.backend.value} backend "
                         f"has no type for (target '{state.target.name}')",
                         hint="pass --backend onnxruntime (or build.backend: onnxruntime), which runs string tensors")  # fmt: skip
    state.model_path = state.fp32_path
    return note or None


def stage_parity(state: BuildState) -> str | None:
    fp32 = state.runner(state.fp32_path)
    state.open_runners.append(fp32)
    if state.export_module is None:
        state.export["parity"] = {"passed": None, "skipped": "the source is an ONNX file: no PyTorch reference"}
        state.reference, state.reference_source = fp32.infer, "onnxruntime-fp32"
        return f"{SKIPPED}the source is an ONNX file, with no PyTorch reference to compare it with"
    parity = check_parity(state.recipe, TorchReference(state.export_module, state.recipe), fp32.infer, state.samples)
    state.export["parity"] = parity.to_manifest()
    return f"parity max abs diff {parity.max_abs_diff:.2e}, cosine min {parity.cosine_min:.6f}"


def stage_auto(state: BuildState, fixed_s: float = 0.0) -> str:
    """``--precision auto``: search, then carry on with the chosen plan's model and precision. ``fixed_s``: the
    seconds of the stages before it, which a plain int8 build spends too (the search's budget is a multiple of
    that build)."""
    from edgekit.quantize.stage import search_auto_precision

    recipe = state.recipe
    assert state.calibration is not None and state.evaluation is not None
    feeds = fit_batch(recipe.inputs, state.samples[0], bench_dims(recipe))
    calibration = [model_inputs(recipe, b) for b in state.calibration]
    if recipe.state:  # state inputs as the FP32 model carries them through each sequence, as for --precision int8
        calibration = run_batches(recipe, _model_being_built(state), state.calibration)[0]
    quantized, result = search_auto_precision(
        state.fp32_path, state.workdir / "auto-chosen.onnx", recipe, state.target, state.backend,
        calibration, state.evaluation, feeds, state.workdir, state.threads, fixed_s=fixed_s, backend_reason=state.backend_reason,
        # A pruned build's budget is measured from the unpruned model (as stage_evaluate does), not from the pruned graph.
        reference=state.reference if state.prune is not None else None, reference_source=f"{state.reference_source} (unpruned model)",
    )
    chosen = result.chosen.precision
    if result.chosen.engine:  # another engine's candidate won (OpenVINO on x86-64-cpu): the bundle is built for it
        state.backend = Backend(result.chosen.engine)
        state.backend_reason = f"--precision auto: {quantized.details['auto'].get('engines', {}).get('why', result.chosen.name)}"
    # FP32/FP16 choices go through the engine builder from the FP32 export, like an explicit fp16 build; the
    # float-rewrite FP32 candidate ("fp32 (rewritten)") from the rewritten graph it was timed as.
    rewritten = chosen is Precision.FP32 and result.chosen.graph != "exported" and not result.chosen.engine
    state.model_path = state.fp32_path if chosen in UNQUANTIZED and not rewritten else quantized.path
    state.quantization = quantized.to_manifest()
    state.decision = PrecisionDecision(chosen, chosen, None, f"auto: {result.chosen.name} ({result.rule})")
    ratio = result.chosen_result.to_manifest().get("latency_ratio")
    return f"auto chose {result.chosen.name} ({chosen.value}); {len(result.kept)} nodes kept in higher precision" + (f"; {ratio:.2f}× FP32 here" if ratio else "")


def _model_being_built(state: BuildState) -> RunFn:
    """The FP32 model the bundle runs: the pruned PyTorch model when the recipe prunes (its state, not the unpruned
    model's, is what the quantized graph sees in each sequence), else the reference."""
    if state.prune is not None:
        return TorchReference(state.export_module, state.recipe)
    assert state.reference is not None
    return state.reference


def stage_quantize(state: BuildState) -> str:
    from edgekit.quantize.stage import copy_calibration, quantize_model

    calibration = state.calibration
    if state.recipe.state and calibration:  # state inputs as the FP32 model carries them through each sequence
        calibration = run_batches(state.recipe, _model_being_built(state), calibration)[0]
    if state.recipe.build.quantization.quantizer == "nncf":  # checked at load: int8 on openvino
        from edgekit.engines.openvino_nncf import quantize_with_nncf

        state.model_path = state.workdir / "quantized.onnx"
        record = quantize_with_nncf(state.fp32_path, state.model_path, state.recipe.build.quantization, state.target, calibration)
        state.quantization = {"plan": None, "calibration": None, "quantizer": record}
        return f"int8: NNCF {record['version']} post-training quantization ({record['samples']} calibration samples)"
    quantized = quantize_model(state.fp32_path, state.workdir / "quantized.onnx", state.recipe.build.quantization, state.target,
                               state.backend, state.precision, calibration, state.workdir)
    state.model_path = quantized.path
    state.host_twin = quantized.host_twin
    state.quantization = quantized.to_manifest()
    relative = copy_calibration(quantized, state.staging_dir)
    if relative and state.quantization.get("calibration"):
        state.quantization["calibration"]["file"] = relative
    plan = quantized.plan
    return f"{state.precision.value}: {plan.activation_type} activations, {plan.weight_type} weights" if plan else state.precision.value


def stage_build(state: BuildState) -> None:
    options: dict[str, Any] = {}
    if state.backend is Backend.TENSORRT:
        from edgekit.engines.tensorrt import TensorRTOptions
        from edgekit_runtime.tensorrt_engines.plan import TimingCachePolicy

        spec = state.recipe.build.tensorrt
        options = {
            "prune": state.prune,
            "options": TensorRTOptions(dla_core=spec.dla_core, gpu_fallback=spec.gpu_fallback, builder_optimization_level=spec.builder_optimization_level,
                                       timing_cache=TimingCachePolicy(spec.timing_cache), min_shape_profile=spec.min_shape_profile),
        }
    state.engine = BUILDERS[state.backend](state.model_path, state.staging_dir / "model.onnx", state.target, state.recipe, state.precision, **options)


def host_runner(state: BuildState) -> OnnxRuntimeRunner:
    """What evaluate, golden and bench run on this host: the bundle's graph, or its decoded twin (at ``basic``
    optimisation, where ONNX Runtime keeps FP8 Q/DQ rounding) when the graph holds formats ONNX Runtime's CPU
    provider cannot run."""
    engine = state.engine
    assert engine is not None
    if state.backend is Backend.OPENVINO:  # the bundle's OpenVINO device, or the CPU plugin standing in for it
        from edgekit.engines.openvino import host_runner as openvino_runner

        return openvino_runner(engine, engine.model_path, state.signature, state.threads)
    denormal_as_zero = bool(engine.details.get("denormal_as_zero"))
    if state.host_twin is not None:
        return state.runner(state.host_twin, HOST_PROVIDERS, "basic", denormal_as_zero)
    return state.runner(engine.model_path, host_providers(engine.execution_providers), engine.graph_optimization, denormal_as_zero)


def stage_evaluate(state: BuildState, runner: OnnxRuntimeRunner) -> str | None:
    recipe = state.recipe
    if recipe.evaluation is None:
        return f"{SKIPPED}the recipe has no evaluation section (metric and budget)"
    assert state.reference is not None
    batches, data = accuracy_batches(recipe, state.evaluation, state.samples)  # the samples, with a warning and a note, without data.evaluation
    reference_outputs = run_reference(recipe, state.reference, batches)  # sequences call by call for a stateful recipe
    state.accuracy = with_accuracy_data(recipe, evaluate_accuracy(recipe, runner.infer, reference_outputs, batches, state.reference_source), data)
    check_budget(recipe, state.accuracy, state.precision.value)
    trt = (state.engine.details.get("tensorrt") if state.engine else None) or {}
    if state.host_twin is not None:
        activations = ("activations run the graph's own FP8 Q/DQ" if state.precision is Precision.FP8 else
                       "activations stay float here, while TensorRT block-quantizes them on the device")
        state.accuracy = replace(state.accuracy, note=f"measured on {float_writers.HOST_TWIN}; {activations}")
    elif trt and trt.get("engine_built_on") != "host" and trt.get("onnx_precision") == "as-exported" and state.precision is not Precision.FP32:
        note = (f"measured with ONNX Runtime on this host on the bundle's FP32 graph: TensorRT applies {state.precision.value} "
                "through builder flags on the device, so the device's accuracy can differ; its self-check compares against the golden outputs")
        state.accuracy = replace(state.accuracy, note=note)
    advice = (state.accuracy.details or {}).get("advice")  # e.g. binary_decision on rare positives: budget F1, not agreement
    return f"{state.accuracy.metric} {state.accuracy.value:.4f} (reference {state.accuracy.reference:.4f})" + (f"; {advice}" if advice else "")


def stage_golden(state: BuildState, runner: OnnxRuntimeRunner) -> str | None:
    """Golden inputs with FP32 reference outputs (the pruned model's when the recipe prunes); tolerances per output
    cover what this precision really deviates on the host (with margin), never less than the recipe's parity tolerance."""
    recipe = state.recipe
    assert state.reference is not None
    pairs, built = [], []
    batches = golden_batches(recipe, state.samples)
    # The bundle runs the pruned model: its golden outputs are that model's, not the unpruned accuracy reference's.
    reference = _model_being_built(state)
    # A stateful model's sequences run call by call; the runner carries its own state, as the device will.
    feeds_used, expected_all = run_batches(recipe, reference, batches)
    for feeds, expected, got in zip(feeds_used, expected_all, run_batches(recipe, runner.infer, batches)[1]):
        pairs.append((feeds, {name: np.asarray(expected[name]) for name in recipe.outputs}))
        built.append({name: np.asarray(got[name]) for name in recipe.outputs})
    trt = (state.engine.details.get("tensorrt") if state.engine else None) or {}
    # A precision the engine applies on the device (builder flags) deviates in ways this host cannot measure:
    # the self-check then allows at least the format's own tolerance.
    device_applied = DEVICE_APPLIED_TOLERANCE.get(state.precision) if trt and trt.get("onnx_precision") == "as-exported" else None
    tolerances, measured = derive_tolerances([out for _, out in pairs], built, recipe.export.parity, device_applied=device_applied,
                                             margin=margin_for(state.precision), batch_axes=output_batch_axes(recipe, state.signature_dict),
                                             state_outputs=[pair.output for pair in recipe.state])
    state.golden = write_golden(state.staging_dir, pairs, tolerances, measured=measured, steps=sequence_steps(batches), state=recipe.state)
    for warning in state.golden.get("warnings", []):
        log.warning("golden: %s", warning)
    return "; ".join(state.golden.get("warnings", [])) or None


def bench_dims(recipe: Recipe) -> dict[str, int]:
    """The dynamic dims the benchmark (and the auto search's timing) run at: opt, unless the recipe says."""
    return {**dims_at(recipe, "opt"), **recipe.build.benchmark.dims}


def stage_bench(state: BuildState, runner: OnnxRuntimeRunner) -> str:
    recipe = state.recipe
    state.bench_dims = bench_dims(recipe)
    feeds = fit_batch(recipe.inputs, state.samples[0], state.bench_dims)
    spec = recipe.build.benchmark
    probe_ms = 0.0 if recipe_sets_counts(spec) else time_calls(lambda: runner.infer(feeds), 0, 1)[0]  # also a warm-up call
    warmup, iterations, state.bench_counts = bench_counts(spec, probe_ms)
    batch_dim = recipe.batch_dim  # throughput counts items along it, whatever its name (1 per call without one)
    state.bench = benchmark_runner(runner, feeds, warmup, iterations, batch=state.bench_dims[batch_dim] if batch_dim else 1)
    state.bench_providers = list(runner.providers)
    bounded = f"; {state.bench_counts}" if state.bench_counts.startswith("time-bounded") else ""
    return f"p50 {state.bench.stats.p50_ms:.2f} ms, p99 {state.bench.stats.p99_ms:.2f} ms at {state.bench_dims}{bounded}"


def assemble_manifest(state: BuildState, stages: list[dict[str, Any]]) -> dict[str, Any]:
    recipe, target, loaded, engine, bench = state.recipe, state.target, state.loaded, state.engine, state.bench
    assert loaded is not None and engine is not None and bench is not None
    return {
        "schema_version": SCHEMA_VERSION,
        "name": f"{recipe.name}-{target.name}-{state.precision.value}",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "recipe": {"name": recipe.name, "path": str(recipe.path), "sha256": recipe.sha256,
                   **({"prune_left_out": True} if state.prune_left_out else {})},
        "target": target.to_json(),
        "backend": {**engine.to_manifest(device_threads(recipe, target)), "selected_because": state.backend_reason},
        "precision": state.precision.value,
        "precision_decision": {**state.decision.to_manifest(), **({"requested": "auto"} if state.auto else {})},
        "model": {
            "path": "model.onnx",
            "external_data": "model.onnx.data" if (state.staging_dir / "model.onnx.data").exists() else None,
            "opset": model_opset(state.staging_dir / "model.onnx") or state.opset,  # the bundle's graph, not the one asked for
            "size_bytes": sum(p.stat().st_size for p in state.staging_dir.glob("model.onnx*")),
            "fp32_size_bytes": sum(p.stat().st_size for p in state.workdir.glob("exported.onnx*")),
            "source": {"kind": loaded.kind, "description": loaded.description, "sha256": loaded.file_sha256},
            **model_constant_args(recipe),
        },
        "io": state.signature_dict,
        "toolchain": toolchain_versions(),
        "export": state.export,
        "prune": state.prune,
        "quantization": state.quantization,
        "accuracy": state.accuracy.to_manifest() if state.accuracy else None,
        "benchmark": {
            "host": host_description(),
            "batch": bench.batch,
            "shape": state.bench_dims,
            "warmup": bench.warmup,
            "iterations": bench.iterations,
            "counts": state.bench_counts,  # the recipe's, the defaults, or time-bounded (edgekit.bench.counts)
            **{k: round(v, 4) for k, v in bench.stats.to_dict().items() if k.endswith("_ms")},
            "throughput_per_s": round(bench.throughput_per_s, 2),
            "peak_rss_mb": round(bench.peak_rss_mb, 1), "peak_rss_scope": bench.peak_rss_scope,
            "threads": state.threads,  # this host's run: the target's thread count, capped at this host's cores
            "providers": state.bench_providers,
        },
        "golden": state.golden,
        "stages": stages,
    }


# ---------------------------------------------------------------------------------------------- build


def build(
    recipe_path: Path | str,
    target_name: str,
    precision: Precision | str | None = None,
    out: Path | str | None = None,
    force: bool = False,
    progress: StageReporter | None = None,
    backend: Backend | str | None = None,
    trust_code: bool = False,
    prune: bool = True,
) -> BuildResult:
    """``edgekit build``: everything from a recipe file to a bundle directory.

    ``trust_code`` lets the recipe name callables outside its own folder (``edgekit.code_trust``); ``prune=False``
    builds it as if it had no ``build.prune`` section.
    """
    progress = progress or StageReporter()
    with progress.stage("load", str(recipe_path)):
        state = stage_load(recipe_path, target_name, precision, out, force, backend, trust_code, prune)
        decision = state.decision
        used = decision.used.value if decision.used is decision.requested else f"{decision.used.value} (fallback from {decision.requested.value}: {decision.reason})"
        progress.note(f"recipe {state.recipe.name} → target {state.target.name} ({state.backend.value}: {state.backend_reason}; {used})")

    with work_folder("edgekit-build-") as work, BundleStaging(state.out_dir, force) as staging:
        with disk_full_as_error("the build", build_places(state.out_dir)):  # said while the partial files still fill it
            state.workdir, state.staging_dir = Path(work), staging.path
            with progress.stage("source", state.recipe.model.kind):
                stage_source(state)
            if state.recipe.build.prune is not None:
                with progress.stage("prune", state.recipe.build.prune.method):
                    stage_prune(state)
            export_what = "ONNX file" if state.recipe.model.kind == "onnx" else f"opset {state.recipe.export.opset or state.target.build.opset}"
            with progress.stage("export", export_what):
                _note(progress, stage_export(state))
            with progress.stage("parity", "PyTorch vs ONNX at min/opt/max"):
                _note(progress, stage_parity(state))
            if state.auto:
                with progress.stage("auto", "sensitivity + fastest plan inside the budget"):
                    _note(progress, stage_auto(state, fixed_s=sum(float(entry["seconds"]) for entry in progress.times.entries)))
            elif state.precision not in UNQUANTIZED:
                with progress.stage("quantize", state.precision.value):
                    _note(progress, stage_quantize(state))
            with progress.stage("build", f"{state.backend.value} {state.precision.value}"):
                stage_build(state)
                assert state.engine is not None
                runner = host_runner(state)
                state.open_runners.append(runner)
            try:
                with progress.stage("evaluate", state.recipe.evaluation.metric if state.recipe.evaluation else "no metric"):
                    _note(progress, stage_evaluate(state, runner))
                with progress.stage("golden"):
                    _note(progress, stage_golden(state, runner))
                with progress.stage("bench", ", ".join(f"{k}={v}" for k, v in bench_dims(state.recipe).items())):
                    _note(progress, stage_bench(state, runner))
            finally:
                for open_runner in state.open_runners:
                    open_runner.close()
            with progress.stage("bundle"):
                from edgekit.estimate.summary import estimate_for_bundle
                from edgekit.report import write_report

                manifest = assemble_manifest(state, list(progress.times.entries))
                manifest["files"] = file_hashes(staging.path)  # model and golden files; the report is added below
                manifest["model"]["sha256"] = manifest["files"]["model.onnx"]
                assert state.bench is not None
                target_estimate, _ = estimate_for_bundle(manifest, staging.path)  # None for this host: its numbers are measured
                write_report(staging.path, manifest, state.bench.samples_ms, staging.path / "model.onnx", estimate=target_estimate)
                manifest["stages"] = list(progress.times.entries)
                manifest = write_manifest(staging.path, manifest)
                bundle_dir = staging.commit()
    return BuildResult(bundle_dir=bundle_dir, manifest=manifest)


def _note(progress: StageReporter, message: str | None) -> None:
    if message and message.startswith(SKIPPED):  # the stage did nothing: the reporter says so instead of a tick
        progress.skip(message[len(SKIPPED):])
    elif message:
        progress.note(message)
