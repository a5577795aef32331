"""TensorRT engines made where they run: the build plan a bundle carries, version detection, the engine
and timing caches, the build itself, and ONNX Runtime TensorRT-EP options keyed the same way.

Everything here imports without TensorRT, pycuda or CUDA: ``tensorrt`` is imported only inside the
functions that build or deserialize an engine. The host (``edgekit.engines.tensorrt``) and the device
(``edgekit_runtime.backends.tensorrt``) share this code, so both compute the same cache keys.
See ``docs/engine-portability.md``.
"""

from __future__ import annotations

from edgekit_runtime.tensorrt_engines.cache import (
    DeviceIdentity,
    EngineCache,
    EngineCacheKey,
    TimingCacheKey,
    default_cache_dir,
)
from edgekit_runtime.tensorrt_engines.errors import (
    CudaUnavailableError,
    EngineBuildError,
    EngineMismatchError,
    PlanError,
    TensorRTUnavailableError,
)
from edgekit_runtime.tensorrt_engines.plan import (
    DlaPolicy,
    NetworkTyping,
    OnnxPrecision,
    OptimizationProfile,
    ShapeRange,
    TensorRTBuildPlan,
    TimingCachePolicy,
)
from edgekit_runtime.tensorrt_engines.version import TensorRTApi, TensorRTVersion, api_for_major, detect_tensorrt

__all__ = [
    "CudaUnavailableError",
    "DeviceIdentity",
    "DlaPolicy",
    "EngineBuildError",
    "EngineCache",
    "EngineCacheKey",
    "EngineMismatchError",
    "NetworkTyping",
    "OnnxPrecision",
    "OptimizationProfile",
    "PlanError",
    "ShapeRange",
    "TensorRTApi",
    "TensorRTBuildPlan",
    "TensorRTUnavailableError",
    "TensorRTVersion",
    "TimingCacheKey",
    "TimingCachePolicy",
    "api_for_major",
    "default_cache_dir",
    "detect_tensorrt",
]
