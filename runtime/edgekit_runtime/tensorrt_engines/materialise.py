"""Getting a usable engine on this device: the bundle's engine if it was built for exactly this device,
else the cached one, else a fresh build from the bundle's ONNX and plan (then cached).

An engine that fails to deserialize (a corrupt cache file, an engine from another TensorRT build) is
never fatal: it is evicted and rebuilt, and the reason is logged and returned in ``notes``. The
TensorRT calls are passed in (``deserialize``, ``build``), so this logic is the same on the host and on
the device, and is tested without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from edgekit_runtime.tensorrt_engines.cache import EngineCache, EngineCacheKey, TimingCacheKey
from edgekit_runtime.tensorrt_engines.errors import EngineBuildError
from edgekit_runtime.tensorrt_engines.plan import TimingCachePolicy

logger = logging.getLogger(__name__)

Engine = TypeVar("Engine")


@dataclass(frozen=True)
class BuildOutput:
    """What one engine build produced."""

    engine: bytes
    timing_cache: bytes | None = None
    seconds: float = 0.0
    dla_fallback_layers: tuple[str, ...] = ()
    details: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ShippedEngine:
    """An engine the host built into the bundle, with the key it recorded."""

    path: Path
    key: EngineCacheKey | None


@dataclass(frozen=True)
class MaterialisedEngine(Generic[Engine]):
    engine: Engine
    source: str  # "bundle" | "cache" | "built"
    key: EngineCacheKey
    path: Path | None
    notes: tuple[str, ...] = ()
    build: BuildOutput | None = None


def _try_deserialize(deserialize: Callable[[bytes], Engine | None], data: bytes) -> tuple[Engine | None, str | None]:
    try:
        engine = deserialize(data)
    except Exception as err:  # TensorRT raises its own pybind exception types
        return None, f"{type(err).__name__}: {err}"
    return engine, None if engine is not None else "TensorRT returned no engine"


def materialise_engine(
    key: EngineCacheKey,
    *,
    cache: EngineCache,
    deserialize: Callable[[bytes], Engine | None],
    build: Callable[[bytes | None], BuildOutput],
    timing_policy: TimingCachePolicy = TimingCachePolicy.SHARED,
    shipped: ShippedEngine | None = None,
) -> MaterialisedEngine[Engine]:
    """A deserialized engine for ``key``: from the bundle, the cache, or built (and cached) now."""
    notes: list[str] = []
    if shipped is not None:
        if shipped.key == key:
            engine, failure = _try_deserialize(deserialize, shipped.path.read_bytes())
            if engine is not None:
                return MaterialisedEngine(engine, "bundle", key, shipped.path)
            notes.append(f"the bundle's engine '{shipped.path}' failed to deserialize ({failure}); building one here")
        elif shipped.key is None:
            notes.append(f"the bundle's engine '{shipped.path}' records no cache key; building one here")
        else:
            notes.append(f"the bundle's engine '{shipped.path}' was not made for this device ("
                         + "; ".join(shipped.key.differences(key)) + "); building one here")

    cached = cache.load_engine(key)
    if cached is not None:
        engine, failure = _try_deserialize(deserialize, cached)
        if engine is not None:
            for note in notes:
                logger.info("%s", note)
            return MaterialisedEngine(engine, "cache", key, cache.engine_path(key), tuple(notes))
        cache.evict_engine(key)
        notes.append(f"cached engine '{cache.engine_path(key)}' failed to deserialize ({failure}); evicted and rebuilt")

    for note in notes:
        logger.warning("%s", note)
    timing_key = TimingCacheKey(key.gpu_name, key.compute_capability, key.tensorrt_version)
    timing = cache.load_timing(timing_key) if timing_policy is not TimingCachePolicy.OFF else None
    started = time.perf_counter()
    output = build(timing)
    seconds = output.seconds or time.perf_counter() - started
    path = cache.store_engine(key, output.engine, {"build_seconds": round(seconds, 3), "timing_cache_used": timing is not None,
                                                   "dla_fallback_layers": list(output.dla_fallback_layers)})
    if timing_policy is TimingCachePolicy.SHARED and output.timing_cache:
        cache.store_timing(timing_key, output.timing_cache)
    engine, failure = _try_deserialize(deserialize, output.engine)
    if engine is None:
        cache.evict_engine(key)
        raise EngineBuildError(
            f"the engine just built for {key.device.describe()} failed to deserialize ({failure})",
            hint="this points at a TensorRT installation problem: check that the Python bindings and libnvinfer "
            "come from the same TensorRT release (`dpkg -l | grep nvinfer` on Jetson)",
        )
    logger.info("built TensorRT engine %s in %.1f s", path, seconds)
    return MaterialisedEngine(engine, "built", key, path, tuple(notes), output)
