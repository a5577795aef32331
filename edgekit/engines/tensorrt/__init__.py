"""The TensorRT engine builder: a portable bundle (ONNX + ``tensorrt/plan.json``), with the engine built
on this host only when its GPU matches the target; otherwise the device builds it at first load.

Importing this package does not import TensorRT; see ``docs/engine-portability.md``.
"""

from __future__ import annotations

from edgekit.engines.tensorrt.builder import (
    ENGINE_PATH,
    EnginePlacement,
    HostEngine,
    build_engine,
    build_tensorrt,
    decide_engine_placement,
    write_bundle_onnx,
)
from edgekit.engines.tensorrt.plan import TensorRTOptions, plan_tensorrt_build
from edgekit.engines.tensorrt.version import HostGpu, HostProbe, probe_host
from edgekit_runtime.tensorrt_engines.plan import PLAN_PATH, TensorRTBuildPlan

__all__ = [
    "ENGINE_PATH",
    "PLAN_PATH",
    "EnginePlacement",
    "HostEngine",
    "HostGpu",
    "HostProbe",
    "TensorRTBuildPlan",
    "TensorRTOptions",
    "build_engine",
    "build_tensorrt",
    "decide_engine_placement",
    "plan_tensorrt_build",
    "probe_host",
    "write_bundle_onnx",
]
