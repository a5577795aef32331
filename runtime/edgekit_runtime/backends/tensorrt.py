"""The TensorRT backend: a serialized engine run through pycuda buffers on one CUDA stream.

At load the runner gets an engine built for exactly this device (the bundle's own when its key matches,
else the cache, else a build from the bundle's ONNX and ``tensorrt/plan.json``, cached for next time;
see :mod:`edgekit_runtime.tensorrt_engines.materialise`). Each call validates the feeds against the
bundle's signature (the same errors as the ONNX Runtime backend), picks the narrowest optimisation
profile that covers the input shapes, sets them on the context (``set_input_shape``), copies inputs
through pinned buffers asynchronously, enqueues the engine and copies the outputs back. With
``cuda_graphs=True`` and static shapes, the enqueue is captured once into a CUDA graph and replayed.

``tensorrt`` and ``pycuda`` are imported when a runner loads, never at import.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit_runtime.backends.base import Runner
from edgekit_runtime.backends.cuda_buffers import CudaDevice, CudaGraph, CudaStream, TensorBuffers
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.tensorrt_engines.build import build_serialized_engine
from edgekit_runtime.tensorrt_engines.cache import DeviceIdentity, EngineCache, EngineCacheKey, default_cache_dir
from edgekit_runtime.tensorrt_engines.materialise import MaterialisedEngine, ShippedEngine, materialise_engine
from edgekit_runtime.tensorrt_engines.plan import PLAN_PATH, OptimizationProfile, TensorRTBuildPlan
from edgekit_runtime.tensorrt_engines.version import TensorRTVersion, detect_tensorrt

if TYPE_CHECKING:
    import tensorrt as trt

logger = logging.getLogger(__name__)

_CONSTRUCTOR_OPTIONS = ("cache_dir", "device_id", "cuda_graphs", "use_bundle_engine")


def choose_profile(profiles: Sequence[OptimizationProfile], shapes: Mapping[str, Sequence[int]]) -> int:
    """Index of the narrowest profile covering ``shapes`` (a batch-1 profile wins for batch-1 calls)."""
    covering = [(profile.span(), index) for index, profile in enumerate(profiles) if profile.covers(shapes)]
    if not covering:
        described = ", ".join(f"{name}{list(shape)}" for name, shape in shapes.items())
        raise BackendError(
            f"no optimisation profile of the engine covers the input shapes {described}",
            hint="the profiles come from the recipe's dims min/opt/max: rebuild the bundle with wider dims",
        )
    return min(covering)[1]


def _dims_tuple(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _numpy_dtype(dtype: trt.DataType) -> np.dtype[Any]:
    import tensorrt as trt

    names = {
        trt.DataType.FLOAT: "float32",
        trt.DataType.HALF: "float16",
        trt.DataType.INT8: "int8",
        trt.DataType.INT32: "int32",
        trt.DataType.INT64: "int64",
        trt.DataType.BOOL: "bool",
        trt.DataType.UINT8: "uint8",
    }
    if dtype not in names:
        raise BackendError(f"engine tensor type {dtype} has no numpy equivalent in this runner",
                           hint="keep the model's inputs and outputs float32, float16 or integer")
    return np.dtype(names[dtype])


class TensorRTRunner(Runner):
    """Runs a bundle's TensorRT engine on CUDA device ``device_id``. Calls share one stream, its buffers and the
    execution contexts, so they run one at a time (a lock; :attr:`concurrent_calls_safe` is false)."""

    backend_name = "tensorrt"

    def __init__(
        self,
        onnx_path: str | Path,
        signature: IOSignature,
        plan: TensorRTBuildPlan,
        model_sha256: str,
        *,
        shipped_engine: ShippedEngine | None = None,
        cache_dir: str | Path | None = None,
        device_id: int = 0,
        cuda_graphs: bool = False,
        use_bundle_engine: bool = True,
    ) -> None:
        super().__init__(signature)
        self.onnx_path = Path(onnx_path)
        self.plan = plan
        self.model_sha256 = model_sha256
        self.shipped_engine = shipped_engine if use_bundle_engine else None
        self.cache = EngineCache(Path(cache_dir) if cache_dir is not None else default_cache_dir())
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise BackendError(f"device_id must be an int >= 0, got {device_id!r}")
        self.device_id = device_id
        self.cuda_graphs = cuda_graphs
        self.materialised: MaterialisedEngine[trt.ICudaEngine] | None = None
        self.version: TensorRTVersion | None = None
        self._device: CudaDevice | None = None
        self._stream: CudaStream | None = None
        self._runtime: trt.Runtime | None = None
        self._trt_logger: trt.ILogger | None = None
        self._contexts: list[trt.IExecutionContext] = []
        self._buffers: dict[str, TensorBuffers] = {}
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self._graph: CudaGraph | None = None
        self._calls = 0
        self._call_lock = threading.Lock()  # one call at a time on the shared stream, buffers and contexts

    @classmethod
    def from_bundle(cls, bundle: Any, **overrides: Any) -> TensorRTRunner:
        unknown = sorted(set(overrides) - set(_CONSTRUCTOR_OPTIONS))
        if unknown:
            raise BackendError(f"unknown tensorrt runner option(s): {', '.join(unknown)}",
                               hint=f"known options: {', '.join(_CONSTRUCTOR_OPTIONS)}")
        section = bundle.backend.get("tensorrt") or {}
        plan = TensorRTBuildPlan.read(bundle.root / str(section.get("plan") or PLAN_PATH))
        engine = section.get("engine")
        shipped = None
        if isinstance(engine, Mapping) and isinstance(engine.get("path"), str):
            shipped = ShippedEngine(bundle.root / engine["path"], EngineCacheKey.from_dict(engine.get("key")))
        return cls(bundle.model_path, bundle.io, plan, str(bundle.manifest["model"].get("sha256") or ""),
                   shipped_engine=shipped, **overrides)

    # -- implementation ------------------------------------------------------------------------

    def _load_impl(self) -> None:
        version = detect_tensorrt()
        import tensorrt as trt

        device = CudaDevice(self.device_id)
        try:
            info = device.info()
            identity = DeviceIdentity.from_cuda(info.name, info.compute_capability, info.multiprocessors, version.short)
            key = EngineCacheKey.for_device(self.model_sha256, self.plan.digest, identity)
            self._trt_logger = trt.Logger(trt.Logger.WARNING)  # must outlive the runtime and its engines
            runtime = trt.Runtime(self._trt_logger)
            if self.plan.dla is not None:
                runtime.DLA_core = self.plan.dla.core
            self._runtime = runtime
            self.materialised = materialise_engine(
                key,
                cache=self.cache,
                deserialize=runtime.deserialize_cuda_engine,
                build=lambda timing: build_serialized_engine(self.onnx_path, self.plan, timing_cache=timing),
                timing_policy=self.plan.timing_cache,
                shipped=self.shipped_engine,
            )
            engine = self.materialised.engine
            self._check_engine_matches_signature(engine)
            self._stream = device.stream()
            self._contexts = []
            for index in range(engine.num_optimization_profiles):
                context = engine.create_execution_context()
                if index and not context.set_optimization_profile_async(index, self._stream.handle):
                    raise BackendError(f"TensorRT could not select optimisation profile {index} for '{self.onnx_path}'")
                self._contexts.append(context)
            self._buffers = {name: device.buffers(name) for name in (*self.signature.input_names, *self.signature.output_names)}
        except BaseException:
            device.close()
            raise
        self._device, self.version = device, version

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._call_lock:
            device = self._device
            if device is None:  # closed by a swap while this call waited for the lock
                raise BackendError(f"the TensorRT runner of '{self.onnx_path}' was closed", hint="load it again")
            with device.current():  # serving threads are not the loading thread
                return self._infer_locked(feeds)

    def _infer_locked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._stream is not None  # loaded runners only (Runner.infer checks)
        stream = self._stream
        shapes = {name: tuple(int(s) for s in feeds[name].shape) for name in self.signature.input_names}
        profile = choose_profile(self.plan.profiles, shapes) if len(self._contexts) > 1 else 0
        context = self._contexts[profile]
        for name in self.signature.input_names:
            array = np.ascontiguousarray(feeds[name])
            if not context.set_input_shape(name, shapes[name]):
                raise BackendError(f"TensorRT refused shape {list(shapes[name])} for input '{name}' of '{self.onnx_path}'",
                                   hint="the shape passed the signature check; the engine's profiles are narrower than io.dims")
            moved = self._buffers[name].reserve(array.shape, array.dtype)
            self._buffers[name].upload(array, stream)
            if moved or self._graph is None:
                context.set_tensor_address(name, self._buffers[name].device.ptr)
        output_shapes: dict[str, tuple[int, ...]] = {}
        for name in self.signature.output_names:
            output_shapes[name] = _dims_tuple(context.get_tensor_shape(name))
            if self._buffers[name].reserve(output_shapes[name], self._dtypes[name]) or self._graph is None:
                context.set_tensor_address(name, self._buffers[name].device.ptr)
        self._enqueue(context, stream)
        staged = {name: self._buffers[name].download(output_shapes[name], self._dtypes[name], stream) for name in output_shapes}
        stream.synchronize()
        self._calls += 1
        return {name: np.array(view, copy=True) for name, view in staged.items()}

    def _enqueue(self, context: trt.IExecutionContext, stream: CudaStream) -> None:
        if self._graph is not None:
            self._graph.launch(stream)
            return
        if not context.execute_async_v3(stream.handle):
            raise BackendError(f"TensorRT failed to enqueue '{self.onnx_path}'", hint="run with logging at DEBUG for TensorRT's messages")
        # A CUDA graph is captured after one normal run (TensorRT finishes lazy setup on the first enqueue),
        # and only for static shapes, whose buffer addresses never change.
        if self.cuda_graphs and self._calls == 1 and self.plan.profiles[0].static and len(self._contexts) == 1:
            try:
                stream.synchronize()
                stream.begin_capture()
                context.execute_async_v3(stream.handle)
                self._graph = stream.end_capture()
            except Exception as err:  # pycuda raises its own exception types
                logger.warning("CUDA graph capture failed, running without it: %s", err)
                self._graph = None

    def _close_impl(self) -> None:
        with self._call_lock:  # after the call in flight, if any
            self._close_locked()

    def _close_locked(self) -> None:
        device, self._device = self._device, None
        with device.current() if device is not None else contextlib.nullcontext():  # closed from any thread
            if self._graph is not None:
                self._graph.free()
            for buffers in self._buffers.values():
                buffers.free()
            self._buffers, self._contexts, self._graph, self._stream, self._calls = {}, [], None, None, 0
            self.materialised, self._runtime, self._trt_logger = None, None, None
        if device is not None:
            device.close()

    def _providers_impl(self) -> tuple[str, ...]:
        source = self.materialised.source if self.materialised else "?"
        return (f"TensorRT {self.version} (engine from {source})",)

    def _check_engine_matches_signature(self, engine: trt.ICudaEngine) -> None:
        import tensorrt as trt

        fix = "the bundle's io section does not describe this engine: rebuild the bundle"
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if sorted(inputs) != sorted(self.signature.input_names):
            raise BackendError(f"engine for '{self.onnx_path}' has inputs {sorted(inputs)} but the signature lists "
                               f"{list(self.signature.input_names)}", hint=fix)
        missing = [n for n in self.signature.output_names if n not in names]
        if missing:
            raise BackendError(f"engine for '{self.onnx_path}' has no output(s) {missing}; its tensors: {names}", hint=fix)
        for tensor in (*self.signature.inputs, *self.signature.outputs):
            dtype = _numpy_dtype(engine.get_tensor_dtype(tensor.name))
            if dtype.name != tensor.dtype:
                raise BackendError(f"engine for '{self.onnx_path}': tensor '{tensor.name}' is {dtype.name} in the engine "
                                   f"but {tensor.dtype} in the signature", hint=fix)
            rank = len(engine.get_tensor_shape(tensor.name))
            if rank != tensor.rank:
                raise BackendError(f"engine for '{self.onnx_path}': tensor '{tensor.name}' has rank {rank} in the engine "
                                   f"but {tensor.rank} in the signature {tensor.describe()}", hint=fix)
            self._dtypes[tensor.name] = dtype
