"""Which TensorRT is installed, and which of its two API generations edgekit drives.

TensorRT 10 (JetPack 6, JetPack 7) still has *weak typing*: an FP32 network plus builder flags
(``FP16``, ``INT8``, ``FP8``, ...) lets the builder pick lower-precision kernels. TensorRT 11 removed
those flags and the implicit INT8 calibrators: networks are strongly typed, so the precision comes
from the ONNX model itself (FP16 by casting the graph, INT8/FP8/INT4/FP4 by Q/DQ nodes).

``tensorrt`` is imported only by :func:`detect_tensorrt`, never at module import.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.tensorrt_engines.errors import CudaUnavailableError, TensorRTUnavailableError

#: The TensorRT majors whose Python API edgekit drives.
SUPPORTED_MAJORS = (10, 11)
#: Present on every Jetson (Jetson Linux writes it); used only to pick the install hint.
JETSON_RELEASE_FILE = Path("etc/nv_tegra_release")

JETSON_TENSORRT_HINT = (
    "on a Jetson, TensorRT comes with JetPack: `sudo apt install nvidia-jetpack` (or only the Python "
    "bindings: `sudo apt install python3-libnvinfer`); a virtual environment must be created with "
    "--system-site-packages to see them"
)
X86_TENSORRT_HINT = (
    "on x86-64, `pip install tensorrt` (its libraries download from NVIDIA's own package index, which the "
    "machine must reach) or install NVIDIA's TensorRT apt/tar packages; the tensorrt-stubs package alone "
    "holds only type stubs"
)
JETSON_PYCUDA_HINT = (
    "on a Jetson, build pycuda against JetPack's CUDA: `export PATH=/usr/local/cuda/bin:$PATH && "
    "pip install pycuda` (JetPack provides nvcc and the CUDA headers it needs)"
)
X86_PYCUDA_HINT = "install the CUDA toolkit (nvcc on PATH), then `pip install pycuda`"

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[.+-].*)?\s*$")


class TensorRTApi(str, Enum):
    """The API path a build takes (recorded in the bundle manifest)."""

    WEAKLY_TYPED_10 = "tensorrt10"  # builder precision flags allowed where the network is weakly typed
    STRONGLY_TYPED_11 = "tensorrt11"  # strongly typed only; precision comes from the ONNX model

    def __str__(self) -> str:
        return self.value


def api_for_major(major: int) -> TensorRTApi:
    """The API path for TensorRT ``major``; majors older than 10 are refused."""
    if major < min(SUPPORTED_MAJORS):
        raise TensorRTUnavailableError(
            f"TensorRT {major}.x is not supported: edgekit drives the TensorRT {min(SUPPORTED_MAJORS)} and "
            f"{max(SUPPORTED_MAJORS)} Python APIs",
            hint="upgrade to JetPack 6 or newer (TensorRT 10) on Jetson, or TensorRT 10/11 elsewhere",
        )
    return TensorRTApi.WEAKLY_TYPED_10 if major == 10 else TensorRTApi.STRONGLY_TYPED_11


@dataclass(frozen=True, order=True)
class TensorRTVersion:
    """``10.13.0.35`` -> major 10, minor 13, patch 0, build 35."""

    major: int
    minor: int
    patch: int = 0
    build: int | None = None

    @classmethod
    def parse(cls, text: object) -> TensorRTVersion:
        match = _VERSION.match(text) if isinstance(text, str) else None
        if match is None:
            raise TensorRTUnavailableError(
                f"cannot read the TensorRT version {text!r} (expected MAJOR.MINOR.PATCH[.BUILD], e.g. '10.13.0.35')",
                hint="the tensorrt module is not NVIDIA's TensorRT Python bindings; check `python -c 'import tensorrt; "
                "print(tensorrt.__file__)'`",
            )
        major, minor, patch, build = match.groups()
        return cls(int(major), int(minor), int(patch or 0), int(build) if build is not None else None)

    @property
    def api(self) -> TensorRTApi:
        return api_for_major(self.major)

    @property
    def short(self) -> str:
        """``10.13.0``: engines are compatible within one major.minor.patch only."""
        return f"{self.major}.{self.minor}.{self.patch}"

    def __str__(self) -> str:
        return self.short if self.build is None else f"{self.short}.{self.build}"


def on_jetson(root: Path = Path("/")) -> bool:
    """True on NVIDIA Jetson (Jetson Linux), judged from ``root/etc/nv_tegra_release``."""
    return (root / JETSON_RELEASE_FILE).is_file()


def tensorrt_missing(detail: str, *, jetson: bool) -> TensorRTUnavailableError:
    return TensorRTUnavailableError(
        f"TensorRT is not installed: {detail}",
        hint=JETSON_TENSORRT_HINT if jetson else X86_TENSORRT_HINT,
    )


def pycuda_missing(detail: str, *, jetson: bool) -> CudaUnavailableError:
    return CudaUnavailableError(
        f"pycuda is not installed: {detail} (the TensorRT runner moves tensors with it)",
        hint=JETSON_PYCUDA_HINT if jetson else X86_PYCUDA_HINT,
    )


def no_cuda_device(detail: str, *, device_id: int = 0) -> CudaUnavailableError:
    return CudaUnavailableError(
        f"no CUDA device {device_id} can be opened: {detail}",
        hint="check `nvidia-smi` (or `tegrastats` on a Jetson), that the NVIDIA driver is loaded, and that "
        "CUDA_VISIBLE_DEVICES does not hide the GPU; inside a container pass the GPU in (--gpus all / --runtime nvidia)",
    )


def detect_tensorrt(
    import_module: Callable[[str], ModuleType | Any] = importlib.import_module,
    *,
    root: Path = Path("/"),
) -> TensorRTVersion:
    """The installed TensorRT version, or :class:`TensorRTUnavailableError` saying why there is none.

    An importable ``tensorrt`` without ``__version__`` and ``Builder`` is the stub-only namespace package
    that ``tensorrt-stubs`` installs; it counts as not installed.
    """
    jetson = on_jetson(root)
    try:
        module = import_module("tensorrt")
    except ImportError as err:
        raise tensorrt_missing(f"`import tensorrt` failed ({err})", jetson=jetson) from err
    except OSError as err:  # the bindings exist but libnvinfer cannot be loaded
        raise tensorrt_missing(f"`import tensorrt` could not load its libraries ({err})", jetson=jetson) from err
    version = getattr(module, "__version__", None)
    if version is None or not hasattr(module, "Builder"):
        where = ", ".join(str(p) for p in getattr(module, "__path__", [])) or "?"
        raise tensorrt_missing(f"the importable 'tensorrt' ({where}) holds no TensorRT bindings, only type stubs", jetson=jetson)
    parsed = TensorRTVersion.parse(version)
    api_for_major(parsed.major)
    return parsed


def import_pycuda_driver(
    import_module: Callable[[str], ModuleType | Any] = importlib.import_module, *, root: Path = Path("/")
) -> Any:
    """``pycuda.driver``, typed as Any at the boundary (pycuda ships no type stubs)."""
    try:
        return import_module("pycuda.driver")
    except ImportError as err:
        raise pycuda_missing(f"`import pycuda.driver` failed ({err})", jetson=on_jetson(root)) from err


def describe_error(err: BaseException) -> str:
    """The first line of an exception's text (or its type name)."""
    if isinstance(err, EdgekitError):
        return err.message
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
