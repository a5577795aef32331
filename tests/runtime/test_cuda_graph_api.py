"""CUDA graph capture through the driver API (pycuda wraps none), against a fake ``libcuda``: the calls,
their order and arguments, and the error text of a failing CUresult. The real driver is exercised by
``test_cuda_graph_replays_a_captured_copy`` (marked gpu) in tests/engines/test_tensorrt_runner.py."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from edgekit_runtime.backends.cuda_buffers import CudaGraph, _DriverGraphApi, _load_driver_graph_api
from edgekit_runtime.tensorrt_engines.errors import CudaUnavailableError

GRAPH, EXECUTABLE, STREAM = 0x1000, 0x2000, 0x3000
ERROR_NAMES = {901: b"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}


class _Function:
    """A ctypes-function stand-in: records its calls; ``argtypes`` and ``restype`` can be set on it."""

    def __init__(self, name: str, library: FakeLibcuda) -> None:
        self.name, self.library = name, library
        self.argtypes: list[Any] = []
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        return self.library.answer(self.name, args)


class FakeLibcuda:
    def __init__(self, failing: dict[str, int] | None = None) -> None:
        self.failing = failing or {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        names = ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
                 "cuGraphDestroy", "cuGraphExecDestroy", "cuGetErrorName")
        for name in names:
            setattr(self, name, _Function(name, self))

    def answer(self, name: str, args: tuple[Any, ...]) -> int:
        if name == "cuGetErrorName":
            code, out = args
            if code not in ERROR_NAMES:
                return 1
            out._obj.value = ERROR_NAMES[code]
            return 0
        self.calls.append((name, tuple(_plain(a) for a in args)))
        if name == "cuStreamEndCapture":
            args[1]._obj.value = GRAPH
        if name == "cuGraphInstantiateWithFlags":
            args[0]._obj.value = EXECUTABLE
        return self.failing.get(name, 0)


def _plain(value: Any) -> Any:
    """Handles as ints, out-pointers as 'out', so that calls compare as plain tuples."""
    if isinstance(value, ctypes.c_void_p):
        return value.value
    if type(value).__name__ == "CArgObject":
        return "out"
    return value


def test_capture_instantiate_launch_and_free_call_the_driver_in_order() -> None:
    library = FakeLibcuda()
    api = _DriverGraphApi(library)
    api.begin_capture(STREAM)
    graph = CudaGraph(api, api.end_capture_and_instantiate(STREAM))
    stream = type("Stream", (), {"handle": STREAM})()
    graph.launch(stream)  # type: ignore[arg-type]
    graph.free()
    graph.free()  # once only
    assert library.calls == [
        ("cuStreamBeginCapture_v2", (STREAM, 0)),
        ("cuStreamEndCapture", (STREAM, "out")),
        ("cuGraphInstantiateWithFlags", ("out", GRAPH, 0)),
        ("cuGraphDestroy", (GRAPH,)),
        ("cuGraphLaunch", (EXECUTABLE, STREAM)),
        ("cuGraphExecDestroy", (EXECUTABLE,)),
    ]
    assert library.cuGraphLaunch.argtypes == [ctypes.c_void_p, ctypes.c_void_p]
    assert library.cuGraphLaunch.restype is ctypes.c_int
    with pytest.raises(ValueError, match="the CUDA graph was freed; capture it again"):
        graph.launch(stream)  # type: ignore[arg-type]


def test_a_failing_call_names_the_call_and_the_cuda_error() -> None:
    api = _DriverGraphApi(FakeLibcuda(failing={"cuStreamEndCapture": 901}))
    with pytest.raises(CudaUnavailableError) as caught:
        api.end_capture_and_instantiate(STREAM)
    assert "CUDA driver call cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)" in str(caught.value)
    assert "must not be synchronised" in str(caught.value)


def test_the_graph_is_freed_when_instantiation_fails() -> None:
    library = FakeLibcuda(failing={"cuGraphInstantiateWithFlags": 2})
    with pytest.raises(CudaUnavailableError, match=r"cuGraphInstantiateWithFlags failed: unknown CUresult \(2\)"):
        _DriverGraphApi(library).end_capture_and_instantiate(STREAM)
    assert library.calls[-1] == ("cuGraphDestroy", (GRAPH,))


def test_a_missing_or_too_old_driver_library_is_a_cuda_error() -> None:
    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    with pytest.raises(CudaUnavailableError, match=r"libcuda.so.1 cannot be loaded for CUDA graphs \(libcuda.so.1: cannot open"):
        _load_driver_graph_api(missing)
    old = FakeLibcuda()
    del old.cuGraphInstantiateWithFlags  # drivers before CUDA 11.4
    with pytest.raises(CudaUnavailableError, match="libcuda.so.1 lacks a stream-capture or graph call") as caught:
        _load_driver_graph_api(lambda name: old)
    assert "cuGraphInstantiateWithFlags" in str(caught.value) and "run without cuda_graphs" in str(caught.value)
