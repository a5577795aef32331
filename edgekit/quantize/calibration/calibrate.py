"""Calibration with a cache: reuse the ranges of an earlier build when model, data and calibrator match."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgekit.quantize.calibration.cache import CacheKey, CalibrationCache
from edgekit.quantize.calibration.collect import Batch, collect_activations
from edgekit.quantize.calibration.observers import CalibratorSpec
from edgekit.quantize.calibration.ranges import TensorRange

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationResult:
    ranges: dict[str, TensorRange]
    key: CacheKey
    from_cache: bool
    #: The cache file holding these ranges (``None`` without a cache); the pipeline copies it into the bundle.
    cache_path: Path | None


def calibrate(
    model_path: Path,
    batches: Sequence[Batch],
    calibrator: CalibratorSpec,
    *,
    tensor_names: Sequence[str] | None = None,
    cache: CalibrationCache | None = None,
    work_dir: Path | None = None,
) -> CalibrationResult:
    """Ranges for ``tensor_names`` (default: activation inputs of MatMul/Gemm/Conv), from ``cache`` when it
    holds them, otherwise computed by :func:`collect_activations` and saved to ``cache``.

    ``batches`` is read twice (hashed for the key, then run), so it must be a sequence, not a generator.
    """
    model_path = Path(model_path)
    batches = list(batches)
    key = CacheKey.create(model_path, batches, calibrator, tensor_names)
    if cache is not None:
        cached = cache.load(key)
        if cached is not None:
            log.info("calibration ranges for %s reused from %s", model_path.name, cache.path_for(key))
            return CalibrationResult(cached, key, True, cache.path_for(key))
    ranges = collect_activations(model_path, tensor_names, batches, calibrator, work_dir=work_dir)
    cache_path = cache.save(key, ranges) if cache is not None else None
    return CalibrationResult(ranges, key, False, cache_path)
