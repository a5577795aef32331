"""What ``edgekit estimate`` takes: a bundle directory, an ``.onnx`` file or a recipe (exported to ONNX
first, at FP32, then timed at the recipe's precision), resolved to a graph and its benchmark shape."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.estimate.estimate import Estimate, EstimateInput, bundle_input, estimate
from edgekit.estimate.graph_cost import EstimateError
from edgekit.estimate.hardware import needs_measured_peak
from edgekit.target import TargetProfile, get_target


def estimate_path(path: Path | str, target: TargetProfile | str, *, power_mode: str | None = None,
                  calibration: Path | Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None,
                  precision: str | None = None, measure_host: bool | None = None, trust_code: bool = False,
                  layer_model: str | None = None) -> tuple[Estimate, EstimateInput]:  # fmt: skip
    """Estimate a bundle, ``.onnx`` file or recipe on ``target``; ``dims`` override the benchmark shape; ``layer_model``
    as :func:`~edgekit.estimate.estimate.estimate` takes it (default: TensorRT layers where the target builds with TensorRT)."""
    profile = get_target(target) if isinstance(target, str) else target
    path = Path(path)
    measured = None
    if measure_host or (measure_host is None and needs_measured_peak(profile)):
        from edgekit.estimate.host_peak import host_threads, measure_host_peak

        measured = measure_host_peak(host_threads(profile.cpu.cores))
    if path.suffix in (".yaml", ".yml") and path.is_file():
        with tempfile.TemporaryDirectory(prefix="edgekit-estimate-") as workdir:
            source = export_recipe(path, profile, Path(workdir), trust_code=trust_code)
            wanted = {**source.dims, **(dims or {})}
            assume = precision or source.precision
            result = estimate(source.model_path, profile, dims=wanted, batch=wanted.get("batch"), power_mode=power_mode,
                              calibration=calibration, measured_peak=measured, assume_precision=None if assume == "fp32" else assume,
                              layer_model=layer_model)  # fmt: skip
            return result, source
    source = bundle_input(path)
    wanted = {**source.dims, **(dims or {})}
    result = estimate(source.model_path, profile, dims=wanted, batch=wanted.get("batch", source.batch), power_mode=power_mode,
                      calibration=calibration, measured_peak=measured, assume_precision=precision, layer_model=layer_model)  # fmt: skip
    return result, source


def export_recipe(recipe_path: Path, target: TargetProfile, workdir: Path, *, trust_code: bool = False) -> EstimateInput:
    """Export the recipe's model to ONNX (FP32) in ``workdir``, as ``edgekit build`` does, without building a bundle."""
    from edgekit.pipeline import bench_dims, stage_export, stage_load, stage_source

    state = stage_load(recipe_path, target.name, "fp32", workdir / "unused-out", True, trust_code=trust_code)
    state.workdir = workdir
    stage_source(state)
    stage_export(state)
    if not state.fp32_path.is_file():
        raise EstimateError(f"{recipe_path}: the export wrote no ONNX graph", hint="run `edgekit build` on it to see the export error")
    dims = bench_dims(state.recipe)
    precision = state.recipe.build.precision
    chosen = None if precision == "auto" else getattr(precision, "value", str(precision))  # auto: timed as exported (FP32)
    return EstimateInput(state.fp32_path, dims, dims.get("batch"), state.recipe.name, chosen)
