"""A CUDA context is current per thread. The TensorRT runner is loaded on one thread and served from others (the
agent's batching and request threads; a swap closes it from the OTA thread), so every CUDA call runs inside
``CudaDevice.current()``. Checked here against a driver double that keeps a context stack per thread, as CUDA does;
the gpu-marked tests in tests/engines/test_tensorrt_runner.py run the real thing where a GPU is present."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from edgekit_runtime.backends.cuda_buffers import CudaDevice
from edgekit_runtime.errors import BackendError


class _Stacks(threading.local):
    def __init__(self) -> None:
        self.stack: list[Any] = []


class _Driver:
    """pycuda.driver's calls CudaDevice makes, with CUDA's per-thread context stack."""

    def __init__(self) -> None:
        driver = self
        self.stacks = _Stacks()
        self.released = 0

        class Context:
            def __init__(self) -> None:
                self.handle = 0xC0
                self.owner = threading.get_ident()  # pycuda's context remembers the thread that made it

            def push(self) -> None:
                driver.stacks.stack.append(self)

            def detach(self) -> None:
                """As pycuda's: released when current on this thread (and popped) or detached by its own thread;
                from any other thread, leaked without a word."""
                if driver.stacks.stack and driver.stacks.stack[-1] is self:
                    driver.stacks.stack.pop()
                    driver.released += 1
                elif self.owner == threading.get_ident():
                    driver.released += 1

            @staticmethod
            def pop() -> None:
                if not driver.stacks.stack:
                    raise RuntimeError("cuCtxPopCurrent failed: invalid device context")
                driver.stacks.stack.pop()

            @staticmethod
            def get_current() -> Any:
                return driver.stacks.stack[-1] if driver.stacks.stack else None

        class Device:
            @staticmethod
            def count() -> int:
                return 1

            def __init__(self, device_id: int) -> None:
                self.context = Context()

            def retain_primary_context(self) -> Any:
                return self.context

        self.Context, self.Device = Context, Device

    def init(self) -> None:
        pass


def _on_another_thread(work: Any) -> Any:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_the_context_is_current_inside_current_on_any_thread_and_popped_after() -> None:
    driver = _Driver()
    device = CudaDevice(0, driver=driver)
    assert driver.Context.get_current() is not None  # the opening thread: current from the start

    def serve() -> tuple[bool, bool, bool]:
        before = driver.Context.get_current() is None
        with device.current():
            inside = driver.Context.get_current() is device._context
        return before, inside, driver.Context.get_current() is None

    assert _on_another_thread(serve) == (True, True, True)
    with device.current():  # on the opening thread: nothing pushed twice
        assert len(driver.stacks.stack) == 1
    device.close()
    assert driver.stacks.stack == [] and driver.released == 1


def test_closing_from_another_thread_pops_nothing_there_and_releases_the_context() -> None:
    driver = _Driver()
    device = CudaDevice(0, driver=driver)
    _on_another_thread(device.close)  # before: popped an empty stack there ("invalid device context")
    assert driver.released == 1  # made current there first: pycuda releases it (detached elsewhere, it leaked)


def test_the_tensorrt_runner_serves_and_closes_inside_the_devices_context() -> None:
    """The runner's infer and close, with the device double: the CUDA work they do sees the context current."""
    from edgekit_runtime.backends.tensorrt import TensorRTRunner

    driver = _Driver()
    device = CudaDevice(0, driver=driver)
    seen: list[bool] = []
    runner = TensorRTRunner.__new__(TensorRTRunner)
    runner._device, runner._call_lock = device, threading.Lock()
    runner._graph, runner._buffers = None, {}
    runner._infer_locked = lambda feeds: seen.append(driver.Context.get_current() is device._context) or {}  # type: ignore[method-assign]
    _on_another_thread(lambda: runner._infer_impl({}))

    class _Buffers:
        def free(self) -> None:
            seen.append(driver.Context.get_current() is device._context)

    runner._buffers = {"x": _Buffers()}
    _on_another_thread(runner._close_impl)
    assert seen == [True, True] and driver.released == 1 and runner._device is None
    runner.onnx_path = "m.onnx"
    with pytest.raises(BackendError, match="the TensorRT runner of 'm.onnx' was closed"):  # a call that waited out a close
        runner._infer_impl({})
