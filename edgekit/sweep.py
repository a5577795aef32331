"""``edgekit sweep``: build every precision (and pruning option) a target allows, side by side.

Every precision the target's chosen backend runs is built as a real bundle; those ONNX Runtime can run
here are re-timed interleaved at the end, so machine noise hits them alike. FP8 and the block formats
(built for a GPU target's TensorRT) are evaluated on their decoded host twin: accuracy and size, latency
only on the device. Those only another backend of the target runs are written the same way and estimated
on their twin, without a bundle.
A variant that fails (over budget, a refusal, an internal error: its trace logged) is a row with its reason, not the
end of the sweep (its progress line ends as failed); sweep.json and sweep.html are written even when the final timing
fails. A folder that already holds a sweep is replaced only with ``force``: a re-run would fail every variant ("already
holds a bundle") and write those failures over the good rows.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.bundle.leftovers import work_folder
from edgekit.errors import EdgekitError
from edgekit.precision import Precision
from edgekit.progress import StageReporter
from edgekit.quantize import float_writers
from edgekit.quantize.gating import supported_precisions
from edgekit.recipe import load_recipe
from edgekit.target import get_target

log = logging.getLogger(__name__)
HOST_TIMED = (Precision.FP32, Precision.FP16, Precision.BF16, Precision.INT8, Precision.INT8_DYNAMIC, Precision.INT4)
BUILT = (*HOST_TIMED, *float_writers.WRITTEN)


@dataclass(frozen=True)
class SweepResult:
    out_dir: Path
    rows: list[dict[str, Any]]
    metric: str | None
    recipe: str | None = None  # the recipe's name
    target: str | None = None  # the target's display name
    batch: int | None = None  # the batch every variant was timed at

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out_dir), "metric": self.metric, "recipe": self.recipe, "target": self.target,
                "batch": self.batch, "variants": self.rows}  # fmt: skip


def _variants(recipe: Any, target: Any, backend: Any) -> list[tuple[str, Precision, bool, bool]]:
    """(label, precision, pruned, buildable here): every precision any of the target's backends runs."""
    buildable = set(supported_precisions(target, backend))
    everything: list[Precision] = []
    for support in target.backends:
        for precision in supported_precisions(target, support.name):
            if precision not in everything:
                everything.append(precision)
    prune_options = [False, True] if recipe.build.prune is not None else [False]
    return [(precision.value + ("+pruned" if pruned else ""), precision, pruned, precision in buildable and precision in BUILT)
            for pruned in prune_options for precision in everything]


def sweep(recipe_path: Path | str, target_name: str, out: Path | str, force: bool = False, iterations: int = 30,
          progress: StageReporter | None = None, trust_code: bool = False) -> SweepResult:
    from edgekit.bench.compare import time_bundles_interleaved
    from edgekit.pipeline import build, choose_backend

    progress = progress or StageReporter()
    recipe = load_recipe(recipe_path, trust_code=trust_code)
    target = get_target(target_name)
    recipe_t = recipe.for_target(target.name)
    backend, _ = choose_backend(recipe_t, target)
    if iterations < 1:
        raise EdgekitError(f"--iterations must be 1 or more, not {iterations}", hint="pass --iterations N with N >= 1, e.g. --iterations 30")
    out_dir = Path(out)
    variants = _variants(recipe_t, target, backend)
    _check_out(out_dir, [label for label, _, _, buildable in variants if buildable], force)
    metric = recipe_t.evaluation.metric if recipe_t.evaluation else None
    rows: list[dict[str, Any]] = []
    built: dict[str, Path] = {}
    for label, precision, pruned, buildable in variants:
        row: dict[str, Any] = {"variant": label, "precision": precision.value, "pruned": pruned}
        with progress.stage(label):
            try:
                if force:  # a variant that fails now must not leave the previous run's bundle looking like its result
                    _remove_old_variant(out_dir / label)
                if buildable:
                    result = build(recipe.path, target_name, precision=precision, out=out_dir / label, force=force,
                                   trust_code=trust_code, prune=pruned)
                    manifest = result.manifest
                    accuracy = manifest.get("accuracy") or {}
                    row.update(status="built", size_bytes=manifest["model"]["size_bytes"], metric_value=accuracy.get("value"),
                               metric_reference=accuracy.get("reference"), cosine_min=accuracy.get("cosine_min"), passed=accuracy.get("passed"),
                               bundle=str(result.bundle_dir), batch=manifest["benchmark"].get("batch"))
                    row.update(_estimated_columns(manifest, result.bundle_dir))
                    if accuracy.get("note"):  # e.g. measured on data.samples, or on the FP32 graph TensorRT converts on the device
                        row.update(reason=accuracy["note"])
                    if precision in HOST_TIMED:
                        built[label] = result.bundle_dir
                    else:
                        row.update(reason="accuracy on the decoded host twin; latency needs the device")
                elif precision in float_writers.WRITTEN and not pruned:
                    row.update(status="estimated", **_estimate(recipe_t, target, precision))
                else:
                    why = "with pruning is not estimated" if pruned else f"runs on {target.name}'s other backend; no estimate for it here"
                    row.update(status="skipped", reason=f"{precision.value} {why}")
            except EdgekitError as exc:
                row.update(status="failed", reason=exc.message.splitlines()[0])
            except Exception as exc:  # an internal error in one variant (a runtime's, a bug): a failed row, the trace logged
                log.error("sweep variant %s failed with an internal error", label, exc_info=True)
                first = (str(exc).splitlines() or [""])[0]
                row.update(status="failed", reason=f"internal error {type(exc).__name__}: {first} (trace in the log)")
            if row["status"] == "failed":  # the stage ends as what the row says, not with a tick
                progress.fail(row["reason"])
            elif row["status"] == "skipped":
                progress.skip(row["reason"])
        rows.append(row)
    try:
        if built:
            with progress.stage("timing", f"{len(built)} bundles interleaved"):
                timings = time_bundles_interleaved(list(built.values()), iterations=iterations)
            fp32 = timings.get(str(built.get("fp32", "")))
            for row in rows:
                timing = timings.get(row.get("bundle", ""))
                if timing:
                    row.update(p50_ms=timing["p50_ms"], p99_ms=timing["p99_ms"], latency_vs_fp32=timing["p50_ms"] / fp32["p50_ms"] if fp32 else None)
                if timing and row["variant"] != "fp32" and "fp32" in built and _same_graph(Path(row["bundle"]), built["fp32"]):
                    why = (f"{row['precision']} bundle holds the same model.onnx as fp32 (the target applies {row['precision']} on the device): "
                           "no speed-up measured here")
                    row.update(latency_vs_fp32=None, reason="; ".join(r for r in (row.get("reason"), why) if r))
    finally:  # the rows built so far are written even when the timing fails
        result = _finish(rows, recipe_t, target, out_dir, metric)
    return result


def _remove_old_variant(folder: Path) -> None:
    """With ``force``: the previous sweep's folder of this variant, removed before the variant is built again."""
    try:
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)
    except OSError as exc:
        raise EdgekitError(f"{folder}: cannot remove the previous sweep's variant ({exc.strerror or exc})",
                           hint="remove that folder by hand, or choose another --out") from exc


def _same_graph(bundle: Path, fp32_bundle: Path) -> bool:
    """Whether a bundle's model.onnx (and its external data) is fp32's, by the sha256 each manifest lists: timing it
    here times FP32 again."""
    def graph_hashes(folder: Path) -> dict[str, Any]:
        files = json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("files") or {}
        return {name: files.get(name) for name in ("model.onnx", "model.onnx.data")}

    mine = graph_hashes(bundle)
    return mine["model.onnx"] is not None and mine == graph_hashes(fp32_bundle)


def _check_out(out_dir: Path, labels: list[str], force: bool) -> None:
    """Create ``out_dir``, refusing a file and, without ``force``, a folder that already holds a sweep (its sweep.json
    or a variant's bundle): a re-run would otherwise fail every variant and write those failures over the good rows."""
    if out_dir.is_file():
        raise EdgekitError(f"--out {out_dir} is a file, not a folder", hint="choose another --out")
    held = [name for name in ("sweep.json", *(f"{label}/manifest.json" for label in labels)) if (out_dir / name).is_file()]
    if held and not force:
        raise EdgekitError(f"--out {out_dir} already holds a sweep ({held[0]})", hint="pass --force to replace it, or choose another --out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file on the way, no permission
        raise EdgekitError(f"--out {out_dir}: cannot create the folder ({exc.strerror or exc})", hint="choose another --out") from exc


def _finish(rows: list[dict[str, Any]], recipe_t: Any, target: Any, out_dir: Path, metric: str | None) -> SweepResult:
    """The sweep's result from its rows (the budget line on each), with sweep.json and sweep.html written."""
    budget = recipe_t.evaluation.budget if recipe_t.evaluation else None
    budget_line = None
    if budget is not None:
        fp32_row = next((r for r in rows if r["variant"] == "fp32" and r.get("metric_reference") is not None), None)
        if budget.min_value is not None:
            budget_line = budget.min_value
        elif budget.max_drop is not None and fp32_row:
            budget_line = fp32_row["metric_reference"] - budget.max_drop if recipe_t.evaluation.better_is_higher else fp32_row["metric_reference"] + budget.max_drop
    for row in rows:
        row["budget_line"] = budget_line
    batches = [manifest_batch for row in rows if (manifest_batch := row.pop("batch", None)) is not None]
    result = SweepResult(out_dir, rows, metric, recipe=recipe_t.name, target=target.display_name,
                         batch=batches[0] if batches else None)
    write_sweep_report(result, recipe_t.evaluation.better_is_higher if recipe_t.evaluation else True)
    return result


def _estimated_columns(manifest: dict[str, Any], bundle_dir: Path) -> dict[str, Any]:
    """A built variant's ESTIMATE on the target when the target is another device (edgekit.estimate), else nothing."""
    from edgekit.estimate.summary import estimate_for_bundle

    estimate, _ = estimate_for_bundle(manifest, bundle_dir)
    if estimate is None:
        return {}
    energy = next((e.energy_per_inference_mj for e in estimate.energy if e.power_mode == estimate.power_mode), None)
    return {"estimate_p50_ms": estimate.p50_ms, "estimate_throughput_per_s": estimate.throughput_per_s,
            "estimate_energy_mj": energy, "estimate_power_mode": estimate.power_mode}  # fmt: skip


def _estimate(recipe: Any, target: Any, precision: Precision) -> dict[str, Any]:
    """Accuracy and size of ``precision`` on this host: the graph its writer would put in a TensorRT bundle,
    evaluated on the codec-decoded twin (see :mod:`edgekit.quantize.float_writers`)."""
    import onnxruntime as ort

    from edgekit.data import accuracy_batches, load_batches, model_inputs, samples_accuracy_note
    from edgekit.evaluate.metrics import METRICS
    from edgekit.export import export_onnx
    from edgekit.precision import Backend
    from edgekit.quantize.plan import make_plan
    from edgekit.sources import load_source
    from edgekit.torch_reference import TorchReference

    with work_folder("edgekit-sweep-") as tmp:
        work = Path(tmp)
        loaded = load_source(recipe, work)
        samples = load_batches(recipe, recipe.data.samples, "samples")
        if loaded.onnx_path is None:
            fp32 = export_onnx(loaded.module, recipe, model_inputs(recipe, samples[0]), recipe.export.opset or target.build.opset, work / "fp32.onnx").path
        else:
            fp32 = loaded.onnx_path
        amax: dict[str, float] | None = None
        if recipe.data.calibration is not None and precision.needs_calibration:
            from edgekit.quantize.calibration import CalibratorSpec, collect_activations

            batches = [model_inputs(recipe, b) for b in load_batches(recipe, recipe.data.calibration, "calibration")]
            ranges = collect_activations(fp32, None, batches, CalibratorSpec.create("minmax"), work_dir=work)
            amax = {name: r.amax for name, r in ranges.items()}
        written_path = work / "estimate.onnx"
        plan = make_plan(recipe.build.quantization, target, Backend.TENSORRT, precision)
        written = float_writers.write_float_format(fp32, written_path, plan, amax)
        twin = float_writers.fold_weight_dequantize(written_path, work / "estimate.host-twin.onnx")
        size = sum(p.stat().st_size for p in work.glob("estimate.onnx*"))
        if recipe.evaluation is None:
            return {"size_bytes": size, "metric_value": None, "reason": "no evaluation in the recipe"}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # keeps FP8 Q/DQ rounding
        session = ort.InferenceSession(str(twin), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        output = recipe.evaluation.output or recipe.outputs[0]
        evaluation = load_batches(recipe, recipe.data.evaluation, "evaluation") if recipe.data.evaluation else samples
        if recipe.data.evaluation is None:
            accuracy_batches(recipe, None, samples)  # the warning that the accuracy is measured on the samples
        reference_fn = TorchReference(loaded.module, recipe) if loaded.module is not None else None
        got, ref, labels = [], [], []
        for batch in evaluation:
            feeds = model_inputs(recipe, batch)
            got.append(dict(zip(names, session.run(None, feeds)))[output])
            ref.append(reference_fn(feeds)[output] if reference_fn else got[-1])
            labels.append(batch.get(recipe.evaluation.labels))
        metric = METRICS.get(recipe.evaluation.metric)
        value = float(metric(got, ref, labels)) if metric else None
        reference = float(metric(ref, ref, labels)) if metric else None
        on_samples = f"; {samples_accuracy_note(recipe)}" if recipe.data.evaluation is None else ""
        return {"size_bytes": size, "metric_value": value, "metric_reference": reference,
                "reason": "estimated with the exact codec: " + ("weights and activations" if written.activations else "weights only")
                + "; latency needs the device" + on_samples, "passed": None, "cosine_min": None, "p50_ms": None}


def write_sweep_report(result: SweepResult, higher_is_better: bool) -> Path:
    from edgekit.report.sweep_plot import render_sweep_html

    (result.out_dir / "sweep.json").write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    page = render_sweep_html(result.rows, result.metric, higher_is_better, recipe=result.recipe, target=result.target,
                             batch=result.batch)  # fmt: skip
    path = result.out_dir / "sweep.html"
    path.write_text(page, encoding="utf-8")
    return path

