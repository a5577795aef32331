"""Calibration with a cache: reuse the ranges of an earlier build when model, data and calibrator match."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgekit.quantize.calibration.cache import CacheKey, CalibrationCache
from edgekit.quantize.calibration.collect import Batch, collect_activations
from edgekit.quantize.calibration.observers import CalibratorSpec, MinMaxObserver, Observer
from edgekit.quantize.calibration.ranges import TensorRange

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationResult:
    ranges: dict[str, TensorRange]
    key: CacheKey
    from_cache: bool
    #: The cache file holding these ranges (``None`` without a cache); the pipeline copies it into the bundle.
    cache_path: Path | None
    #: Plain running min/max of the ``also_minmax`` tensors, from the same pass or the cache (``None`` when not
    #: asked for).
    minmax: dict[str, TensorRange] | None = None
    #: Seconds the calibration pass took; for ranges from the cache, what it took when it ran (0: not recorded).
    #: ``--precision auto`` counts them in its estimate of a plain int8 build, which calibrates.
    seconds: float = 0.0
    #: Seconds of a MinMax-only pass run because the ranges came from the cache without the ``also_minmax`` ones
    #: (a plain int8 build calibrated first): work a plain int8 build does not do.
    minmax_only_seconds: float = 0.0


def calibrate(
    model_path: Path,
    batches: Sequence[Batch],
    calibrator: CalibratorSpec,
    *,
    tensor_names: Sequence[str] | None = None,
    cache: CalibrationCache | None = None,
    work_dir: Path | None = None,
    also_minmax: Sequence[str] = (),
) -> CalibrationResult:
    """Ranges for ``tensor_names`` (default: activation inputs of MatMul/Gemm/Conv), from ``cache`` when it
    holds them, otherwise computed by :func:`collect_activations` and saved to ``cache``.

    ``batches`` is read twice (hashed for the key, then run), so it must be a sequence, not a generator.
    ``also_minmax`` names tensors whose plain min/max (asymmetric, no clipping) are collected in the same
    pass, for a second plan on the same graph (auto's ONNX Runtime default plan), and cached beside; when the
    ranges come from the cache without them (a plain int8 build calibrated the same model and data first), a
    MinMax-only pass collects them and caches them beside.
    """
    model_path = Path(model_path)
    batches = list(batches)
    key = CacheKey.create(model_path, batches, calibrator, tensor_names)
    minmax_key = (replace(key, calibrator=MINMAX.method, options=tuple(sorted(MINMAX.options_json().items())), tensor_names=tuple(also_minmax))
                  if also_minmax else None)  # the same model and data, hashed once
    if cache is not None:
        cached = cache.load(key)
        if cached is not None:
            log.info("calibration ranges for %s reused from %s", model_path.name, cache.path_for(key))
            minmax, minmax_s = cache.load(minmax_key) if minmax_key else None, 0.0
            if minmax_key is not None and minmax is None:
                started = time.perf_counter()
                minmax = collect_activations(model_path, list(dict.fromkeys(also_minmax)), batches, MINMAX, work_dir=work_dir)
                minmax_s = time.perf_counter() - started
                cache.save(minmax_key, minmax, minmax_s)
            return CalibrationResult(cached, key, True, cache.path_for(key), minmax, cache.recorded_seconds(key) or 0.0, minmax_s)
    started = time.perf_counter()
    if not also_minmax:
        ranges = collect_activations(model_path, tensor_names, batches, calibrator, work_dir=work_dir)
        seconds = time.perf_counter() - started
        cache_path = cache.save(key, ranges, seconds) if cache is not None else None
        return CalibrationResult(ranges, key, False, cache_path, seconds=seconds)
    names = list(tensor_names) if tensor_names is not None else None
    if names is None:
        from edgekit.quantize.calibration.collect import default_activation_tensors
        from edgekit.quantize.calibration.onnx_files import load_model_proto

        names = default_activation_tensors(load_model_proto(model_path))
    wanted = set(names)
    minmax_names = set(also_minmax)
    minmax_observers: dict[str, Observer] = {}

    def observers(name: str) -> Observer | _Both:
        if name not in minmax_names:
            return calibrator(name)
        minmax_observers[name] = MINMAX(name)
        return _Both(calibrator(name), minmax_observers[name]) if name in wanted else minmax_observers[name]

    collected = collect_activations(model_path, list(dict.fromkeys([*names, *also_minmax])), batches, observers, work_dir=work_dir)  # type: ignore[arg-type]
    ranges = {name: collected[name] for name in names}
    minmax = {name: minmax_observers[name].compute() for name in dict.fromkeys(also_minmax)}
    seconds = time.perf_counter() - started
    cache_path = cache.save(key, ranges, seconds) if cache is not None else None
    if cache is not None and minmax_key is not None:
        cache.save(minmax_key, minmax)
    return CalibrationResult(ranges, key, False, cache_path, minmax, seconds)


#: The calibrator of ``also_minmax``: running min and max, asymmetric (ONNX Runtime's MinMax default).
MINMAX = CalibratorSpec.create("minmax", symmetric=False)


class _Both:
    """Feeds one tensor to two observers; its range is the first's (the plan's calibrator)."""

    def __init__(self, primary: Observer, minmax: Observer) -> None:
        self.primary, self.minmax = primary, minmax

    def update(self, array: object) -> None:
        self.primary.update(array)  # type: ignore[arg-type]
        self.minmax.update(array)  # type: ignore[arg-type]

    def compute(self) -> TensorRange:
        return self.primary.compute()
