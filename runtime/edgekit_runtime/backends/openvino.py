"""The OpenVINO backend: compiles the bundle's ONNX graph for an OpenVINO device (CPU, GPU, NPU) with the
precision hint the manifest records, and runs it through infer requests: an infer request runs one inference at a
time, so each call takes an idle one from a small pool (made on demand, at most one per thread calling at once), and
calls from several threads (the agent's ``batching.instances``) each get their own answer.

``openvino`` is imported when a runner loads (install ``edgekit-runtime[openvino]``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgekit_runtime.backends.base import Runner
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature

#: Constructor options a caller may override for a device (``create_runner(bundle, device="CPU")``).
_CONSTRUCTOR_OPTIONS = ("device", "inference_precision_hint", "threads", "cache_dir", "shapes")
#: How a runner meets dynamic dims: ``dynamic`` compiles once for all shapes (CPU, GPU); ``per-shape`` compiles the
#: model again for each new input shape it sees, as the NPU plugin compiles static shapes only.
SHAPE_POLICIES = ("dynamic", "per-shape")
#: compiled shapes a ``per-shape`` runner keeps (the oldest is dropped beyond this)
MAX_COMPILED_SHAPES = 8
#: OpenVINO's INFERENCE_PRECISION_HINT values edgekit writes into manifests.
PRECISION_HINTS = ("f32", "bf16", "f16")
#: Environment variable naming an OpenVINO device (``CPU``) that stands in when the bundle's device is absent: a
#: machine without the NPU or iGPU (a CI runner, the build host) can still load, self-check and serve the bundle.
#: Only ever used where it is set, and the runner's providers say which device stood in for which.
STAND_IN_ENV = "EDGEKIT_OPENVINO_STAND_IN"
#: OpenVINO element type names (``ov.Type.get_type_name()``) -> the numpy dtype names of :mod:`edgekit_runtime.signature`.
OV_TYPE_TO_DTYPE = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "boolean": "bool", "string": "string",
}  # fmt: skip
_REBUILD = "the bundle's io section (manifest.json io) does not describe this model: rebuild the bundle"


class _RequestPool:
    """One compiled model and its infer requests. An OpenVINO infer request runs one inference at a time (a second
    caller gets "Infer Request is busy", or reads the other's outputs), so each call takes an idle request, or makes
    one when every request is busy, and gives it back after copying its outputs out."""

    def __init__(self, compiled: Any, outputs: list[tuple[str, Any]]) -> None:
        self.compiled = compiled
        self.outputs = outputs
        self._idle = [compiled.create_infer_request()]  # list.pop and append are atomic: no lock needed

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            request = self._idle.pop()
        except IndexError:
            request = self.compiled.create_infer_request()
        try:
            request.infer(feeds)
            # the request's tensors are reused by its next call: copy them out before it goes back
            return {name: np.array(request.get_tensor(port).data) for name, port in self.outputs}
        finally:
            self._idle.append(request)

    @property
    def requests(self) -> int:
        """Idle requests (all of them when no call is running)."""
        return len(self._idle)


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise BackendError(
            "the bundle's backend is openvino (manifest.json backend.name), but OpenVINO is not installed",
            hint="pip install 'edgekit-runtime[openvino]'",
        ) from None
    return openvino


class OpenVinoRunner(Runner):
    """Runs a bundle's ONNX graph on an OpenVINO device; calls from several threads run at once (one infer request
    each), so :attr:`concurrent_calls_safe` is true."""

    backend_name = "openvino"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        signature: IOSignature,
        device: str = "CPU",
        inference_precision_hint: str = "f32",
        threads: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        shapes: str = "dynamic",
    ) -> None:
        super().__init__(signature)
        if shapes not in SHAPE_POLICIES:
            raise BackendError(f"openvino shapes {shapes!r} is not a policy edgekit knows",
                               hint=f"use one of: {', '.join(SHAPE_POLICIES)} (manifest.json backend.openvino.shapes)")
        self.shapes = shapes
        if inference_precision_hint not in PRECISION_HINTS:
            raise BackendError(
                f"openvino inference_precision_hint {inference_precision_hint!r} is not one edgekit writes",
                hint=f"use one of: {', '.join(PRECISION_HINTS)} (manifest.json backend.openvino.inference_precision_hint)",
            )
        self.model_path = Path(model_path)
        self.device = device
        self.inference_precision_hint = inference_precision_hint
        self.threads = threads
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._pool: _RequestPool | None = None  # the dynamic policy's one compiled model
        self._per_shape: dict[tuple[tuple[int, ...], ...], _RequestPool] = {}
        self._per_shape_lock = threading.Lock()  # the per-shape table changes under concurrent calls
        self.stands_in_for: str | None = None  # the manifest's device when another one stands in for it

    @classmethod
    def from_bundle(cls, bundle: Any, **overrides: Any) -> OpenVinoRunner:
        unknown = sorted(set(overrides) - set(_CONSTRUCTOR_OPTIONS))
        if unknown:
            raise BackendError(
                f"unknown openvino runner option(s): {', '.join(unknown)}",
                hint=f"known options: {', '.join(_CONSTRUCTOR_OPTIONS)}",
            )
        record = bundle.backend.get("openvino") or {}
        if "device" not in record:
            raise BackendError(
                f"bundle '{bundle.root}': manifest.json backend.openvino.device is missing",
                hint="rebuild the bundle with edgekit build --backend openvino",
            )
        options: dict[str, Any] = {
            "device": record["device"],
            "inference_precision_hint": record.get("inference_precision_hint", "f32"),
            "threads": bundle.backend.get("intra_op_threads"),
            "shapes": record.get("shapes", "dynamic"),
        }
        options.update(overrides)
        return cls(bundle.model_path, bundle.io, **options)

    @property
    def concurrent_calls_safe(self) -> bool:
        return True

    # -- implementation ------------------------------------------------------------------------

    def compile_config(self) -> dict[str, str]:
        """The properties the model compiles with: the precision hint (strict for f32), latency mode, threads on CPU, and
        no CPU pinning: with its threads pinned, OpenVINO ran the digits CNN 2.2-7.8x slower than ONNX Runtime FP32 on a
        2-core host that another process loaded, and 0.60-0.77x unpinned (bf16, same builds, interleaved)."""
        config = {"INFERENCE_PRECISION_HINT": self.inference_precision_hint, "PERFORMANCE_HINT": "LATENCY"}
        if self.device == "CPU":
            config["ENABLE_CPU_PINNING"] = "NO"
        if self.device == "CPU" and self.threads:
            config["INFERENCE_NUM_THREADS"] = str(self.threads)
        if self.cache_dir is not None:
            config["CACHE_DIR"] = str(self.cache_dir)
        return config

    def _load_impl(self) -> None:
        ov = _import_openvino()
        core = ov.Core()
        self._stand_in(core.available_devices)
        if self.device not in core.available_devices:
            raise BackendError(
                f"OpenVINO device {self.device} (manifest.json backend.openvino.device) is not present on this machine; "
                f"OpenVINO {ov.__version__} sees: {', '.join(core.available_devices) or 'none'}",
                hint="install the device's driver (Intel NPU: linux-npu-driver; iGPU: intel-opencl-icd), or check the bundle on "
                f"the CPU as a stand-in: create_runner(bundle, device='CPU'), or {STAND_IN_ENV}=CPU for the agent",
            )
        if not self.model_path.is_file():
            raise BackendError(f"model file '{self.model_path}' does not exist",
                               hint="check the bundle directory; open_bundle(root, verify=True) lists missing files")
        self._core, self._version = core, ov.__version__
        model = self._read_model()
        self._check_model_matches_signature(model)
        if self.shapes == "dynamic":
            self._pool = self._compile(model, None)

    def _stand_in(self, available: list[str]) -> None:
        """Switch to the device named by ``EDGEKIT_OPENVINO_STAND_IN`` when the bundle's device is not here (an f16
        hint runs as f32 on a CPU stand-in: OpenVINO's CPU plugin would quietly turn it into bf16, and the build host
        made the golden outputs at f32 the same way). Nothing changes where the variable is unset or the device is here."""
        stand_in = os.environ.get(STAND_IN_ENV, "").strip()
        if not stand_in or self.device in available or self.stands_in_for is not None:
            return
        if stand_in not in available:
            raise BackendError(f"{STAND_IN_ENV}={stand_in} names an OpenVINO device this machine lacks (it sees: "
                               f"{', '.join(available) or 'none'})", hint=f"set {STAND_IN_ENV}=CPU, or unset it")
        self.stands_in_for, self.device = self.device, stand_in
        if stand_in == "CPU" and self.inference_precision_hint == "f16":
            self.inference_precision_hint = "f32"

    def _read_model(self) -> Any:
        try:
            return self._core.read_model(str(self.model_path))
        except RuntimeError as exc:
            raise BackendError(f"OpenVINO {self._version} could not read '{self.model_path}': {_openvino_message(exc)}",
                               hint="the file is truncated or corrupt: open_bundle(root, verify=True) checks every file's hash") from None

    def _check_model_matches_signature(self, model: Any) -> None:
        """The model's inputs and outputs against the bundle's io section: names, element types and ranks (as the ONNX
        Runtime runner checks them), so a mismatch is named at load rather than failing, or converting, at a call."""
        where = f"model '{self.model_path}' and manifest.json io"
        by_name = {name: port for port in model.inputs for name in port.get_names()}
        absent = [name for name in self.signature.input_names if name not in by_name]
        unnamed = [port.get_any_name() for port in model.inputs if not port.get_names() & set(self.signature.input_names)]
        if absent or unnamed:
            raise BackendError(f"{where} disagree on the inputs: the model's are "
                               f"{sorted(port.get_any_name() for port in model.inputs)}, io lists {list(self.signature.input_names)}",
                               hint=_REBUILD)  # fmt: skip
        outputs = {name: port for port in model.outputs for name in port.get_names()}
        absent = [name for name in self.signature.output_names if name not in outputs]
        if absent:
            raise BackendError(f"{where}: the model has no output(s) {absent}; its outputs: "
                               f"{sorted(port.get_any_name() for port in model.outputs)}", hint=_REBUILD)  # fmt: skip
        for tensor in (*self.signature.inputs, *self.signature.outputs):
            port = by_name.get(tensor.name) or outputs[tensor.name]
            dtype = OV_TYPE_TO_DTYPE.get(port.get_element_type().get_type_name())
            if dtype is not None and dtype != tensor.dtype:
                raise BackendError(f"{where}: tensor '{tensor.name}' is {dtype} in the model but {tensor.dtype} in io",
                                   hint=_REBUILD)
            rank = port.get_partial_shape().rank
            if rank.is_static and rank.get_length() != tensor.rank:
                raise BackendError(f"{where}: tensor '{tensor.name}' has rank {rank.get_length()} in the model but "
                                   f"{tensor.rank} in io {tensor.describe()}", hint=_REBUILD)  # fmt: skip

    def _compile(self, model: Any, shapes: dict[str, tuple[int, ...]] | None) -> _RequestPool:
        """``model`` compiled, with its infer requests and output ports; ``shapes`` fixes every input (static)."""
        try:
            if shapes is not None:
                model.reshape(shapes)
            compiled = self._core.compile_model(model, self.device, self.compile_config())
            outputs = [(name, compiled.output(name)) for name in self.signature.output_names]
            return _RequestPool(compiled, outputs)
        except RuntimeError as exc:
            at = f" at input shapes {shapes}" if shapes else ""
            raise BackendError(f"OpenVINO {self._version} could not compile '{self.model_path}' for {self.device}{at}: {exc}",
                               hint="an operator the error names is missing in this OpenVINO release or device plugin") from None

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        pool = self._pool if self.shapes == "dynamic" else self._pool_for(feeds)
        assert pool is not None  # loaded runners only (Runner.infer checks)
        try:
            return pool.run(dict(feeds))
        except RuntimeError as exc:
            raise BackendError(f"OpenVINO {self._version} failed to run '{self.model_path}' on {self.device}: {_openvino_message(exc)}",
                               hint="the inputs passed the signature check; a value-dependent op (Reshape, Gather indices) may "
                               "reject them, or the model may need a newer OpenVINO") from None

    def _pool_for(self, feeds: Mapping[str, np.ndarray]) -> _RequestPool:
        key = tuple(tuple(np.shape(feeds[name])) for name in self.signature.input_names)
        found = self._per_shape.get(key)
        if found is None:
            with self._per_shape_lock:
                found = self._per_shape.get(key)  # another thread may have compiled it meanwhile
                if found is None:
                    if len(self._per_shape) >= MAX_COMPILED_SHAPES:
                        self._per_shape.pop(next(iter(self._per_shape)))
                    found = self._per_shape[key] = self._compile(self._read_model(), dict(zip(self.signature.input_names, key)))
        return found

    def _close_impl(self) -> None:
        self._pool = None
        self._per_shape.clear()

    def _providers_impl(self) -> tuple[str, ...]:
        standing = f" standing in for {self.stands_in_for}" if self.stands_in_for else ""
        return (f"OpenVINO {self.device}{standing} ({self.inference_precision_hint})",)


def _openvino_message(exc: BaseException) -> str:
    """OpenVINO's message without the ``Exception from src/...`` lines that only locate its source."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(line for line in lines if not line.startswith("Exception from src/")) or type(exc).__name__
