"""The engine and timing cache keys and layout, shared with the device (they live in the runtime so
the agent computes the same keys without edgekit): see :mod:`edgekit_runtime.tensorrt_engines.cache`."""

from __future__ import annotations

from pathlib import Path

from edgekit_runtime.hashing import sha256_file
from edgekit_runtime.tensorrt_engines.cache import (
    CACHE_ENV,
    DeviceIdentity,
    EngineCache,
    EngineCacheKey,
    TimingCacheKey,
    default_cache_dir,
    engine_mismatch,
)
from edgekit_runtime.tensorrt_engines.materialise import MaterialisedEngine, ShippedEngine, materialise_engine
from edgekit_runtime.tensorrt_engines.plan import TensorRTBuildPlan

__all__ = [
    "CACHE_ENV",
    "DeviceIdentity",
    "EngineCache",
    "EngineCacheKey",
    "MaterialisedEngine",
    "ShippedEngine",
    "TimingCacheKey",
    "default_cache_dir",
    "engine_key",
    "engine_mismatch",
    "materialise_engine",
]


def engine_key(model_path: Path, plan: TensorRTBuildPlan, device: DeviceIdentity) -> EngineCacheKey:
    """The cache key of the engine for the bundle model at ``model_path`` built under ``plan`` on ``device``."""
    return EngineCacheKey.for_device(sha256_file(model_path), plan.digest, device)
