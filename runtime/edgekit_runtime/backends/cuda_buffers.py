"""The CUDA layer under the TensorRT runner, on pycuda: a device context, a stream, device buffers,
pinned (page-locked) host buffers, asynchronous copies and CUDA graph capture.

It knows nothing of TensorRT, so it can be tested on any NVIDIA GPU with pycuda alone. pycuda has no
type stubs: its driver module is ``Any`` at this boundary, and everything this module returns is typed.
pycuda is imported when a device is opened, never at module import.

pycuda (up to 2026.1 at least) wraps no stream capture or CUDA graph call, so capture goes straight to the
driver API in ``libcuda.so.1`` through ctypes (:class:`_DriverGraphApi`), on the streams pycuda made.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from edgekit_runtime.tensorrt_engines.errors import CudaUnavailableError
from edgekit_runtime.tensorrt_engines.version import import_pycuda_driver, no_cuda_device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudaDeviceInfo:
    device_id: int
    name: str
    compute_capability: str  # "8.7"
    integrated: bool  # True on Jetson: the GPU shares the system memory
    total_memory_bytes: int
    multiprocessors: int


#: CU_STREAM_CAPTURE_MODE_GLOBAL (cuda.h): while a stream captures, no thread may make an unsafe call
#: (such as a synchronous allocation) that would invalidate it.
_CAPTURE_MODE_GLOBAL = 0
_LIBCUDA = "libcuda.so.1"


class _DriverGraphApi:
    """The CUDA driver's stream-capture and graph calls (CUDA 11.4+), each checked for its CUresult."""

    def __init__(self, library: Any) -> None:
        self._lib = library
        handle, pointer = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        signatures: dict[str, list[Any]] = {
            "cuStreamBeginCapture_v2": [handle, ctypes.c_int],
            "cuStreamEndCapture": [handle, pointer],
            "cuGraphInstantiateWithFlags": [pointer, handle, ctypes.c_ulonglong],
            "cuGraphLaunch": [handle, handle],
            "cuGraphDestroy": [handle],
            "cuGraphExecDestroy": [handle],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int

    def begin_capture(self, stream_handle: int) -> None:
        self._check("cuStreamBeginCapture_v2", ctypes.c_void_p(stream_handle), _CAPTURE_MODE_GLOBAL)

    def end_capture_and_instantiate(self, stream_handle: int) -> int:
        """End the capture on the stream and return the executable graph's handle (the graph is freed)."""
        graph, executable = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuStreamEndCapture", ctypes.c_void_p(stream_handle), ctypes.byref(graph))
        try:
            self._check("cuGraphInstantiateWithFlags", ctypes.byref(executable), graph, 0)
        finally:
            self._check("cuGraphDestroy", graph)
        return int(executable.value or 0)

    def launch(self, executable: int, stream_handle: int) -> None:
        self._check("cuGraphLaunch", ctypes.c_void_p(executable), ctypes.c_void_p(stream_handle))

    def destroy(self, executable: int) -> None:
        self._check("cuGraphExecDestroy", ctypes.c_void_p(executable))

    def _check(self, name: str, *args: Any) -> None:
        result = int(getattr(self._lib, name)(*args))
        if result != 0:
            raise CudaUnavailableError(
                f"CUDA driver call {name} failed: {self._error_name(result)} ({result})",
                hint="a stream being captured must not be synchronised or used with the legacy default stream; "
                "check `nvidia-smi` and that the driver supports CUDA 11.4 or newer",
            )

    def _error_name(self, result: int) -> str:
        name = ctypes.c_char_p()
        if self._lib.cuGetErrorName(result, ctypes.byref(name)) != 0 or name.value is None:
            return "unknown CUresult"
        return name.value.decode("ascii", "replace")


@functools.cache
def _driver_graph_api() -> _DriverGraphApi:
    return _load_driver_graph_api(ctypes.CDLL)  # pycuda has loaded libcuda already: CDLL returns the same library


def _load_driver_graph_api(load: Callable[[str], Any]) -> _DriverGraphApi:
    try:
        library = load(_LIBCUDA)
    except OSError as err:
        raise no_cuda_device(f"{_LIBCUDA} cannot be loaded for CUDA graphs ({err})") from err
    try:
        return _DriverGraphApi(library)
    except AttributeError as err:
        raise CudaUnavailableError(
            f"{_LIBCUDA} lacks a stream-capture or graph call ({err})",
            hint="CUDA graphs need a driver for CUDA 11.4 or newer; run without cuda_graphs",
        ) from err


class CudaGraph:
    """An instantiated CUDA graph captured from a stream; :meth:`launch` replays it on a stream."""

    def __init__(self, api: _DriverGraphApi, executable: int) -> None:
        self._api = api
        self._executable: int | None = executable

    def launch(self, stream: CudaStream) -> None:
        if self._executable is None:
            raise ValueError("the CUDA graph was freed; capture it again")
        self._api.launch(self._executable, stream.handle)

    def free(self) -> None:
        """Destroy the executable graph (while its context is current); launching it afterwards fails."""
        if self._executable is not None:
            executable, self._executable = self._executable, None
            self._api.destroy(executable)


class CudaStream:
    """One CUDA stream; ``handle`` is the integer TensorRT's ``execute_async_v3`` takes."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.raw: Any = driver.Stream()

    @property
    def handle(self) -> int:
        return int(self.raw.handle)

    def synchronize(self) -> None:
        self.raw.synchronize()

    def begin_capture(self) -> None:
        """Record what is queued on this stream from now on, instead of running it, until :meth:`end_capture`."""
        _driver_graph_api().begin_capture(self.handle)

    def end_capture(self) -> CudaGraph:
        api = _driver_graph_api()
        return CudaGraph(api, api.end_capture_and_instantiate(self.handle))


class DeviceBuffer:
    """Linear device memory that grows (reallocates) when a larger tensor needs it."""

    def __init__(self, driver: Any, nbytes: int = 0) -> None:
        self._driver = driver
        self._allocation: Any = None
        self.nbytes = 0
        self.ensure(nbytes)

    @property
    def ptr(self) -> int:
        if self._allocation is None:
            raise ValueError("the device buffer holds no memory yet; call ensure(nbytes) first")
        return int(self._allocation)

    def ensure(self, nbytes: int) -> bool:
        """Make room for ``nbytes``; True when the buffer was reallocated (its address changed)."""
        if nbytes <= self.nbytes and self._allocation is not None:
            return False
        self.free()
        self._allocation = self._driver.mem_alloc(max(nbytes, 1))
        self.nbytes = max(nbytes, 1)
        return True

    def free(self) -> None:
        if self._allocation is not None:
            self._allocation.free()
            self._allocation = None
            self.nbytes = 0


class PinnedBuffer:
    """Page-locked host memory (needed for truly asynchronous copies), viewed as arrays of any shape."""

    def __init__(self, driver: Any, nbytes: int = 0) -> None:
        self._driver = driver
        self._memory: np.ndarray = np.empty(0, dtype=np.uint8)
        self.ensure(nbytes)

    @property
    def nbytes(self) -> int:
        return int(self._memory.nbytes)

    def ensure(self, nbytes: int) -> bool:
        if nbytes <= self.nbytes and self.nbytes:
            return False
        self._memory = self._driver.pagelocked_empty((max(nbytes, 1),), np.uint8)
        return True

    def view(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype.itemsize
        if nbytes > self.nbytes:
            raise ValueError(f"pinned buffer of {self.nbytes} bytes cannot hold {dtype.name}{list(shape)} ({nbytes} bytes)")
        return self._memory[:nbytes].view(dtype).reshape(shape)


class TensorBuffers:
    """A pinned host buffer and a device buffer for one named tensor."""

    def __init__(self, driver: Any, name: str) -> None:
        self._driver = driver
        self.name = name
        self.host = PinnedBuffer(driver)
        self.device = DeviceBuffer(driver)

    def reserve(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
        """Room for one tensor of ``shape``; True when the device address changed."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.host.ensure(nbytes)
        return self.device.ensure(nbytes)

    def upload(self, array: np.ndarray, stream: CudaStream) -> None:
        """Copy ``array`` into the pinned buffer, then to the device asynchronously on ``stream``."""
        self.reserve(array.shape, array.dtype)
        staged = self.host.view(array.shape, array.dtype)
        np.copyto(staged, array, casting="no")
        self._driver.memcpy_htod_async(self.device.ptr, staged, stream.raw)

    def download(self, shape: tuple[int, ...], dtype: np.dtype[Any], stream: CudaStream) -> np.ndarray:
        """Queue the device-to-host copy; the returned pinned view is valid after ``stream.synchronize()``."""
        staged = self.host.view(shape, dtype)
        self._driver.memcpy_dtoh_async(staged, self.device.ptr, stream.raw)
        return staged

    def free(self) -> None:
        self.device.free()


class CudaDevice:
    """A CUDA device's primary context made current (shared with the CUDA runtime that TensorRT uses).

    A CUDA context is current per thread: opening the device makes it current on the opening thread only. Any
    other thread (the agent serves a model from its batching and request threads, and swaps bundles from the OTA
    thread) runs its CUDA calls inside :meth:`current`."""

    def __init__(self, device_id: int = 0, *, driver: Any = None) -> None:
        self.driver: Any = driver if driver is not None else import_pycuda_driver()
        try:
            self.driver.init()
            count = int(self.driver.Device.count())
        except Exception as err:  # pycuda raises its own exception types (e.g. "cuInit failed: no CUDA-capable device")
            raise no_cuda_device(f"CUDA did not initialise ({err})", device_id=device_id) from err
        if not 0 <= device_id < count:
            raise no_cuda_device(f"{count} CUDA device(s) visible", device_id=device_id)
        self.device_id = device_id
        self._device: Any = self.driver.Device(device_id)
        self._context: Any = self._device.retain_primary_context()
        self._context.push()
        self._opened_on = threading.get_ident()
        self._open = True

    @contextlib.contextmanager
    def current(self) -> Iterator[CudaDevice]:
        """The device's context current on the calling thread for the block: pushed (and popped after) unless it
        is current there already."""
        here = self.driver.Context.get_current()
        if here is not None and here.handle == self._context.handle:
            yield self
            return
        self._context.push()
        try:
            yield self
        finally:
            self.driver.Context.pop()

    def info(self) -> CudaDeviceInfo:
        attributes = self.driver.device_attribute
        major, minor = self._device.compute_capability()
        return CudaDeviceInfo(
            device_id=self.device_id,
            name=str(self._device.name()),
            compute_capability=f"{major}.{minor}",
            integrated=bool(self._device.get_attribute(attributes.INTEGRATED)),
            total_memory_bytes=int(self._device.total_memory()),
            multiprocessors=int(self._device.get_attribute(attributes.MULTIPROCESSOR_COUNT)),
        )

    def stream(self) -> CudaStream:
        return CudaStream(self.driver)

    def buffers(self, name: str) -> TensorBuffers:
        return TensorBuffers(self.driver, name)

    def close(self) -> None:
        """Release the context. On the opening thread: popped from its stack, then detached (pycuda releases a
        context its own thread detaches). On another thread: made current there first, since pycuda releases a
        context another thread detaches only while it is current on that thread (else it leaks it silently)."""
        if self._open:
            self._open = False
            if threading.get_ident() == self._opened_on:
                self.driver.Context.pop()
            else:
                self._context.push()
            self._context.detach()

    def __enter__(self) -> CudaDevice:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def describe_device(device_id: int = 0, *, driver: Any = None) -> CudaDeviceInfo:
    """Name, compute capability and memory of CUDA device ``device_id``."""
    with CudaDevice(device_id, driver=driver) as device:
        return device.info()
