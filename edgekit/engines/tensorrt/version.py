"""Host-side TensorRT detection: which TensorRT and which GPU this machine has, for deciding whether the
engine can be built here. Detection itself lives in the runtime (the device needs it too)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.tensorrt_engines.cache import DeviceIdentity
from edgekit_runtime.tensorrt_engines.version import (
    SUPPORTED_MAJORS,
    TensorRTApi,
    TensorRTVersion,
    api_for_major,
    detect_tensorrt,
    no_cuda_device,
    on_jetson,
    pycuda_missing,
    tensorrt_missing,
)

log = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_MAJORS",
    "HostGpu",
    "HostProbe",
    "TensorRTApi",
    "TensorRTVersion",
    "api_for_major",
    "detect_tensorrt",
    "no_cuda_device",
    "on_jetson",
    "probe_host",
    "pycuda_missing",
    "tensorrt_missing",
]


@dataclass(frozen=True)
class HostGpu:
    """This machine's CUDA device and TensorRT."""

    name: str  # as CUDA reports it, e.g. "NVIDIA H100 80GB HBM3" or "Orin"
    compute_capability: str
    multiprocessors: int
    integrated: bool
    tensorrt: TensorRTVersion

    @property
    def identity(self) -> DeviceIdentity:
        return DeviceIdentity.from_cuda(self.name, self.compute_capability, self.multiprocessors, self.tensorrt.short)


@dataclass(frozen=True)
class HostProbe:
    """What :func:`probe_host` found: a GPU with TensorRT, or why there is none."""

    gpu: HostGpu | None
    reason: str = ""


def probe_host(device_id: int = 0) -> HostProbe:
    """TensorRT and CUDA device ``device_id`` of this machine, or the reason the engine cannot be built here."""
    try:
        version = detect_tensorrt()
        from edgekit_runtime.backends.cuda_buffers import describe_device

        info = describe_device(device_id)
    except EdgekitError as err:
        log.debug("no TensorRT build on this host: %s", err.message)
        return HostProbe(None, err.message)
    return HostProbe(HostGpu(info.name, info.compute_capability, info.multiprocessors, info.integrated, version))
