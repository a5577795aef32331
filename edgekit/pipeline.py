"""The build pipeline: recipe + target profile -> checked, evaluated, benchmarked bundle directory.

Each stage is a small function from artifact to artifact (see the modules it calls); this module only
composes them, times them for the manifest and reports progress. Everything is written into a staging
directory that is renamed into place at the end, so a failed or interrupted build leaves nothing behind.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bundle.golden import write_golden
from edgekit.bundle.manifest import SCHEMA_VERSION, host_description, toolchain_versions, write_manifest
from edgekit.bundle.staging import BundleStaging, check_destination
from edgekit.data import Batch, dims_at, fit_batch, load_batches, model_inputs
from edgekit.engines import BUILDERS
from edgekit.evaluate import check_budget, evaluate_accuracy
from edgekit.export import check_parity, export_onnx
from edgekit.export.parity import row_cosines
from edgekit.io_signature import io_section
from edgekit.precision import Backend, Precision
from edgekit.progress import StageReporter
from edgekit.recipe import Recipe, load_recipe
from edgekit.sources import load_source
from edgekit.target import TargetProfile, get_target
from edgekit.torch_reference import TorchReference
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.timing import benchmark_runner

log = logging.getLogger(__name__)

#: Providers this host can run when the target's own are elsewhere (a Jetson EP on an x86 dev host).
HOST_PROVIDERS = [{"name": "CPUExecutionProvider", "options": {}}]


@dataclass(frozen=True)
class BuildResult:
    bundle_dir: Path
    manifest: dict[str, Any]


def default_output(recipe: Recipe, target: TargetProfile, precision: Precision) -> Path:
    return Path("bundles") / f"{recipe.name}-{target.name}-{precision.value}"


def host_providers(target_providers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target's providers that can load on this host, else the CPU provider."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    usable = [p for p in target_providers if p["name"] in available]
    return usable or HOST_PROVIDERS


def choose_backend(recipe: Recipe, target: TargetProfile) -> tuple[Backend, str]:
    """The recipe's backend if it names one (an error if it cannot be built here), else the target's
    most preferred backend that this edgekit can build; the reason goes into the manifest."""
    from edgekit.errors import BuildError

    if recipe.build.backend is not None:
        backend = Backend(recipe.build.backend)
        target.backend(backend)  # raises when the target has no such backend
        if backend not in BUILDERS:
            raise BuildError(
                f"{recipe.path}: build.backend {backend.value} has no builder in this edgekit version (target '{target.name}')",
                hint=f"use build.backend: {' or '.join(b.value for b in BUILDERS)}",
            )
        return backend, "recipe build.backend"
    for support in target.backends:
        if support.name in BUILDERS:
            skipped = [b.name.value for b in target.backends[: target.backends.index(support)]]
            reason = "target preference" if not skipped else f"target preference; {', '.join(skipped)} has no builder in this edgekit version"
            return support.name, reason
    raise BuildError(
        f"target '{target.name}' lists no backend this edgekit can build ({', '.join(b.name.value for b in target.backends)})",
        hint=f"builders available: {', '.join(b.value for b in BUILDERS)}",
    )


def build(
    recipe_path: Path | str,
    target_name: str,
    precision: Precision | str | None = None,
    out: Path | str | None = None,
    force: bool = False,
    progress: StageReporter | None = None,
) -> BuildResult:
    """``edgekit build``: everything from a recipe file to a bundle directory."""
    progress = progress or StageReporter()
    with progress.stage("load", str(recipe_path)):
        base_recipe = load_recipe(recipe_path)
        target = get_target(target_name)
        recipe = base_recipe.for_target(target.name)
        backend, backend_reason = choose_backend(recipe, target)
        precision = Precision(precision or recipe.build.precision)
        out_dir = Path(out) if out else default_output(recipe, target, precision)
        check_destination(out_dir.resolve(), force)
        samples = load_batches(recipe, recipe.data.samples, "samples")
        evaluation = load_batches(recipe, recipe.data.evaluation, "evaluation") if recipe.evaluation and recipe.data.evaluation else None
        progress.note(f"recipe {recipe.name} → target {target.name} ({backend.value}: {backend_reason}; {precision.value})")

    with tempfile.TemporaryDirectory(prefix="edgekit-build-") as work, BundleStaging(out_dir, force) as staging:
        workdir = Path(work)
        with progress.stage("source", recipe.model.kind):
            loaded = load_source(recipe, workdir)
        reference = TorchReference(loaded.module, recipe) if loaded.module is not None else None
        opset = recipe.export.opset or target.build.opset

        with progress.stage("export", f"opset {opset}"):
            if loaded.onnx_path is None:
                exported = export_onnx(loaded.module, recipe, model_inputs(recipe, samples[0]), opset, workdir / "exported.onnx")
                exporter, fp32_path, export_seconds, fallback = exported.exporter, exported.path, exported.seconds, exported.fallback_reason
                opset = exported.opset
            else:
                from edgekit.export import check_and_infer

                fp32_path = workdir / "exported.onnx"
                _copy_model(loaded.onnx_path, fp32_path)
                check_and_infer(fp32_path)
                exporter, export_seconds, fallback = loaded.exporter or "none", 0.0, None
        signature_dict = io_section(recipe, fp32_path)
        signature = IOSignature.from_manifest(signature_dict)
        threads = recipe.build.benchmark.threads or min(os.cpu_count() or 1, target.cpu.cores)

        fp32_runner = OnnxRuntimeRunner(fp32_path, signature, execution_providers=HOST_PROVIDERS, graph_optimization="all", intra_op_threads=threads).load()
        parity_manifest: dict[str, Any] | None = None
        with progress.stage("parity", "PyTorch vs ONNX at min/opt/max"):
            if reference is not None:
                parity = check_parity(recipe, reference, fp32_runner.infer, samples)
                parity_manifest = parity.to_manifest()
                progress.note(f"parity max abs diff {parity.max_abs_diff:.2e}, cosine min {parity.cosine_min:.6f}")
            else:
                parity_manifest = {"passed": None, "skipped": "the source is an ONNX file: no PyTorch reference"}

        with progress.stage("build", f"{backend.value} {precision.value}"):
            engine = BUILDERS[backend](fp32_path, staging.path / "model.onnx", target, recipe, precision)
            runner = OnnxRuntimeRunner(engine.model_path, signature, execution_providers=host_providers(engine.execution_providers),
                                       graph_optimization=engine.graph_optimization, intra_op_threads=threads).load()

        reference_run = reference if reference is not None else fp32_runner.infer
        reference_source = "pytorch-fp32" if reference is not None else "onnxruntime-fp32"
        accuracy = None
        with progress.stage("evaluate", recipe.evaluation.metric if recipe.evaluation else "no metric"):
            if recipe.evaluation is not None:
                batches = evaluation or samples
                ref_outputs = [reference_run(model_inputs(recipe, b)) for b in batches]
                accuracy = evaluate_accuracy(recipe, runner.infer, ref_outputs, batches, reference_source)
                progress.note(f"{accuracy.metric} {accuracy.value:.4f} (reference {accuracy.reference:.4f})")
                check_budget(recipe, accuracy, precision.value)

        with progress.stage("golden"):
            golden = _golden(recipe, samples, reference_run, runner.infer, staging.path, precision)

        bench_dims = {**dims_at(recipe, "opt"), **recipe.build.benchmark.dims}
        with progress.stage("bench", ", ".join(f"{k}={v}" for k, v in bench_dims.items())):
            feeds = fit_batch(recipe, samples[0], bench_dims)
            result = benchmark_runner(runner, feeds, recipe.build.benchmark.warmup, recipe.build.benchmark.iterations)
            batch_size = next(iter(feeds.values())).shape[0]
            progress.note(f"p50 {result.stats.p50_ms:.2f} ms, p99 {result.stats.p99_ms:.2f} ms at {bench_dims}")
        bench_providers = list(runner.providers)
        runner.close()
        fp32_runner.close()

        model_bytes = sum(p.stat().st_size for p in staging.path.glob("model.onnx*"))
        manifest: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "name": f"{recipe.name}-{target.name}-{precision.value}",
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "recipe": {"name": recipe.name, "path": str(recipe.path), "sha256": recipe.sha256},
            "target": target.to_json(),
            "backend": {**engine.to_manifest(threads), "selected_because": backend_reason},
            "precision": precision.value,
            "model": {
                "path": "model.onnx",
                "external_data": "model.onnx.data" if (staging.path / "model.onnx.data").exists() else None,
                "opset": opset,
                "size_bytes": model_bytes,
                "source": {"kind": loaded.kind, "description": loaded.description, "sha256": loaded.file_sha256},
            },
            "io": signature_dict,
            "toolchain": toolchain_versions(),
            "export": {"exporter": exporter, "opset": opset, "seconds": round(export_seconds, 3), "fallback_reason": fallback, "parity": parity_manifest},
            "accuracy": accuracy.to_manifest() if accuracy else None,
            "benchmark": {
                "host": host_description(),
                "batch": batch_size,
                "shape": bench_dims,
                "warmup": recipe.build.benchmark.warmup,
                "iterations": recipe.build.benchmark.iterations,
                **{k: round(v, 4) for k, v in result.stats.to_dict().items() if k.endswith("_ms")},
                "throughput_per_s": round(result.throughput_per_s, 2),
                "peak_rss_mb": round(result.peak_rss_mb, 1),
                "threads": threads,
                "providers": bench_providers,
            },
            "golden": golden,
            "stages": list(progress.times.entries),
        }
        with progress.stage("bundle"):
            from edgekit.bundle.manifest import file_hashes
            from edgekit.report import write_report

            manifest["files"] = file_hashes(staging.path)  # model and golden files; the report is added below
            manifest["model"]["sha256"] = manifest["files"]["model.onnx"]
            write_report(staging.path, manifest, result.samples_ms, staging.path / "model.onnx")
            manifest["stages"] = list(progress.times.entries)
            manifest = write_manifest(staging.path, manifest)
            bundle_dir = staging.commit()
    return BuildResult(bundle_dir=bundle_dir, manifest=manifest)


def _copy_model(src: Path, dst: Path) -> None:
    import onnx

    model = onnx.load(str(src), load_external_data=True)
    onnx.save(model, str(dst))


def _golden(recipe: Recipe, samples: list[Batch], reference: Any, candidate: Any, root: Path, precision: Precision) -> dict[str, Any]:
    """Golden inputs with FP32 reference outputs; tolerances cover what this precision really deviates
    on the host (with margin), never less than the recipe's parity tolerance."""
    pairs = []
    worst_abs = 0.0
    worst_cos = 1.0
    for batch in samples[: recipe.build.golden_batches]:
        feeds = model_inputs(recipe, batch)
        expected = reference(feeds)
        got = candidate(feeds)
        pairs.append((feeds, {name: np.asarray(expected[name]) for name in recipe.outputs}))
        for name in recipe.outputs:
            e, g = np.asarray(expected[name], dtype=np.float64), np.asarray(got[name], dtype=np.float64)
            worst_abs = max(worst_abs, float(np.abs(e - g).max(initial=0.0)))
            if e.size and e.dtype.kind == "f":
                worst_cos = min(worst_cos, float(row_cosines(e, g).min()))
    parity = recipe.export.parity
    atol = max(parity.atol, 4 * worst_abs) if precision is not Precision.FP32 else max(parity.atol, 2 * worst_abs)
    min_cosine = min(parity.min_cosine, 1 - 4 * (1 - worst_cos))
    return write_golden(root, pairs, atol=atol, rtol=parity.rtol, min_cosine=min_cosine)
