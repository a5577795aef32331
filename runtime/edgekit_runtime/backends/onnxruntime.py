"""The ONNX Runtime backend: one ``InferenceSession`` per runner.

``onnxruntime`` is imported when a runner loads, not when this module is imported. Requested
execution providers are checked twice: before the session is made (is the provider known to ONNX
Runtime, and built into the installed package?) and after (did it really load, or did ONNX Runtime
fall back to the CPU with only a warning?). Either failure is a :class:`BackendError`, never a
silent fallback.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edgekit_runtime.backends.base import CompiledRun, Runner
from edgekit_runtime.backends.ort_device_io import DEVICE_OF_PROVIDER, DeviceBinding
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature

CPU_PROVIDER = "CPUExecutionProvider"
logger = logging.getLogger(__name__)

#: Manifest ``backend.graph_optimization`` value -> ``onnxruntime.GraphOptimizationLevel`` member.
GRAPH_OPTIMIZATION_LEVELS: Mapping[str, str] = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disable": "ORT_DISABLE_ALL",
}

#: ONNX Runtime's tensor type strings -> numpy dtype names used by :mod:`edgekit_runtime.signature`.
ORT_TYPE_TO_DTYPE: Mapping[str, str] = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "string",
}

# Which package brings which provider, for the hint when one is missing from the installed build.
_PROVIDER_PACKAGES: Mapping[str, str] = {
    "CUDAExecutionProvider": "onnxruntime-gpu (pip install 'edgekit-runtime[gpu]')",
    "TensorrtExecutionProvider": "onnxruntime-gpu (pip install 'edgekit-runtime[gpu]') plus TensorRT",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "DmlExecutionProvider": "onnxruntime-directml",
    "QNNExecutionProvider": "onnxruntime-qnn",
}

#: Provider options edgekit sets unless a manifest names them. The CUDA provider runs FP32 MatMul and Conv
#: in TF32 by default (10-bit mantissa): on an H100 that put an FP32 bundle's outputs 4e-3 from its golden
#: FP32 outputs (1e-3 relative) and failed its self-check, so FP32 means FP32 unless ``use_tf32: true``.
PROVIDER_DEFAULTS: Mapping[str, Mapping[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}

_CONSTRUCTOR_OPTIONS = ("execution_providers", "graph_optimization", "intra_op_threads", "optimized_model_path", "denormal_as_zero",
                        "io_binding", "intra_op_spinning", "intra_op_spin_us")

#: The first ONNX Runtime release that reads ``session.intra_op.spin_duration_us`` (1.25.1's library has no such
#: key; 1.26.0's has). Older ones ignore it and spin for their own default length.
SPIN_DURATION_SINCE = (1, 26)
#: the longest intra-op spin a runner accepts, in microseconds (a tenth of a second)
MAX_SPIN_US = 100_000
#: the most intra-op threads a runner accepts (ONNX Runtime takes a C int, and a pool of more threads than any
#: host has cores only waits for them)
MAX_INTRA_OP_THREADS = 1024


def spin_duration_supported(version: str) -> bool:
    """Whether ONNX Runtime ``version`` (``onnxruntime.__version__``) bounds its intra-op spinning by time."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= SPIN_DURATION_SINCE


@dataclass(frozen=True)
class ExecutionProviderConfig:
    """One requested execution provider and its options, as in the manifest's ``backend`` section."""

    name: str
    options: Mapping[str, str | int | float | bool] = field(default_factory=dict)

    @classmethod
    def parse(cls, entry: object, *, where: str) -> ExecutionProviderConfig:
        """Accept ``"CUDAExecutionProvider"``, ``{"name": ..., "options": {...}}`` or an instance."""
        if isinstance(entry, ExecutionProviderConfig):
            return entry
        if isinstance(entry, str):
            return cls(name=entry)
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            options = entry.get("options") or {}
            if not isinstance(options, Mapping):
                raise BackendError(f"{where}: options of {entry['name']} must be an object, got {options!r}")
            return cls(name=entry["name"], options=dict(options))
        raise BackendError(
            f"{where}: expected a provider name or {{name, options}}, got {entry!r}",
            hint='e.g. [{"name": "CPUExecutionProvider", "options": {}}]',
        )

    def ort_options(self) -> dict[str, str]:
        """Options as ONNX Runtime wants them: strings, booleans as "1"/"0"; with the provider's defaults
        that edgekit sets (:data:`PROVIDER_DEFAULTS`) unless the options name them."""
        given = {str(key): ("1" if value else "0") if isinstance(value, bool) else str(value) for key, value in self.options.items()}
        return {**PROVIDER_DEFAULTS.get(self.name, {}), **given}


def _import_onnxruntime() -> ModuleType:
    try:
        import onnxruntime
    except ImportError as err:
        raise BackendError(
            f"the onnxruntime backend needs the onnxruntime package, which cannot be imported: {err}",
            hint="pip install onnxruntime (or onnxruntime-gpu on a CUDA device)",
        ) from err
    return onnxruntime


#: ``(output_names, feeds, run_options)`` -> the outputs in the order of ``output_names``.
SessionRun = Callable[[list[str], dict[str, Any], Any], list[Any]]


def _session_run(session: Any) -> tuple[SessionRun, tuple[type[BaseException], ...]]:
    """How to run ``session`` on validated feeds: ``session.run``, or the compiled call behind it.

    ``InferenceSession.run`` checks in Python, before its compiled call, that every input is named
    (the signature check has done that), that ``OrtValue`` feeds belong to this session's device
    (validated feeds are numpy arrays) and that WebGPU graph capture is off; that costs about a
    microsecond per call, over 1 % of a small model's run. So the compiled call is used directly
    whenever graph capture is off, with the exception types it must hand back to ``session.run``:
    on ``EPFail`` that method retries on the fallback providers (and replaces the compiled session),
    which this runner leaves to it. Builds without these internals get ``session.run`` itself.
    """
    compiled = getattr(session, "_sess", None)
    run = getattr(compiled, "run", None)
    capture = getattr(compiled, "is_webgpu_graph_capture_enabled", None)
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import EPFail
    except ImportError:
        return session.run, ()
    if run is None or (capture is not None and capture()):
        return session.run, ()
    return run, (EPFail,)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class OnnxRuntimeRunner(Runner):
    """Runs an ONNX model with ``onnxruntime.InferenceSession``.

    ``denormal_as_zero`` flushes denormal floats to zero in the session's threads (ONNX Runtime's
    ``session.set_denormal_as_zero``). CPUs slow down by an order of magnitude on denormal arithmetic,
    which masked softmax over padding produces: MiniLM int8 on padded sentences ran 60 ms without it and
    40 ms with it on the dev host. Values below 1.2e-38 become zero, far under any model's tolerance.

    ``io_binding`` keeps inputs and outputs in the device memory of a GPU provider (see
    :mod:`edgekit_runtime.backends.ort_device_io`): ``None`` (the default) turns it on when the session's
    first provider is a GPU one (CUDA, TensorRT) and off on the CPU; ``True`` forces it (on the CPU too,
    where it binds host buffers), ``False`` turns it off. The CUDA provider's ``enable_cuda_graph`` option
    needs it, and a runner with that option refuses ``io_binding=False``.

    ``intra_op_spinning`` sets whether the intra-op pool's threads spin-wait for work after a run
    (``session.intra_op.allow_spinning``): ``None`` (the default) leaves ONNX Runtime's choice, which is to
    spin; ``False`` parks them. Spinning saves a wake-up when calls come back to back from one thread; in a
    server that does other work between calls the spinning threads burn a core the rest of the process (and
    its clients) lack.

    ``intra_op_spin_us`` bounds that spinning in time where spinning is allowed (``intra_op_spinning`` true or
    ``None``; with ``False`` it has no effect): after a parallel section, a thread spins for about that many
    microseconds, then sleeps (``session.intra_op.spin_duration_us``, ONNX Runtime 1.26 and later). A few
    microseconds keep the pool awake between the operators of one run and between calls made back to back,
    and cost little CPU when calls are far apart: the agent's serving default (``runner.intra_op_spin_us``).
    An ONNX Runtime older than 1.26 ignores the key and would spin its full default length, so there the
    threads are parked instead (``intra_op_spinning`` taken as false) and the log says so.
    """

    backend_name = "onnxruntime"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        signature: IOSignature,
        execution_providers: Sequence[object] | None = None,
        graph_optimization: str = "all",
        intra_op_threads: int | None = None,
        optimized_model_path: str | os.PathLike[str] | None = None,
        denormal_as_zero: bool = False,
        io_binding: bool | None = None,
        intra_op_spinning: bool | None = None,
        intra_op_spin_us: int | None = None,
    ) -> None:
        super().__init__(signature)
        self.model_path = Path(model_path)
        if execution_providers is None:
            execution_providers = [CPU_PROVIDER]
        if isinstance(execution_providers, (str, Mapping)) or not isinstance(execution_providers, Sequence) or not execution_providers:
            raise BackendError(
                f"execution_providers must be a non-empty list, got {execution_providers!r}",
                hint='e.g. [{"name": "CPUExecutionProvider", "options": {}}] (manifest.json backend.execution_providers)',
            )
        self.execution_providers = tuple(
            ExecutionProviderConfig.parse(entry, where=f"execution_providers[{index}]")
            for index, entry in enumerate(execution_providers)
        )
        if not isinstance(graph_optimization, str) or graph_optimization not in GRAPH_OPTIMIZATION_LEVELS:
            raise BackendError(
                f"graph_optimization {graph_optimization!r} is not one of {', '.join(GRAPH_OPTIMIZATION_LEVELS)}",
                hint='use one of those names, e.g. "all" (manifest.json backend.graph_optimization)',
            )
        self.graph_optimization = graph_optimization
        if intra_op_threads is not None and (
            not isinstance(intra_op_threads, int) or isinstance(intra_op_threads, bool) or intra_op_threads < 0
        ):
            raise BackendError(
                f"intra_op_threads must be an int >= 0 or null, got {intra_op_threads!r}",
                hint="0 or null lets ONNX Runtime choose (one thread per physical core) (manifest.json backend.intra_op_threads)",
            )
        if intra_op_threads is not None and intra_op_threads > MAX_INTRA_OP_THREADS:
            raise BackendError(
                f"intra_op_threads must be at most {MAX_INTRA_OP_THREADS}, got {intra_op_threads!r}",
                hint="use the device's core count, or 0 or null to let ONNX Runtime choose (manifest.json backend.intra_op_threads)",
            )
        self.intra_op_threads = intra_op_threads
        self.optimized_model_path = None if optimized_model_path is None else Path(optimized_model_path)
        if not isinstance(denormal_as_zero, bool):
            raise BackendError(f"denormal_as_zero must be true or false, got {denormal_as_zero!r}")
        self.denormal_as_zero = denormal_as_zero
        if io_binding is not None and not isinstance(io_binding, bool):
            raise BackendError(f"io_binding must be true, false or null, got {io_binding!r}")
        if io_binding is False and self._cuda_graph_requested():
            raise BackendError("CUDAExecutionProvider option enable_cuda_graph needs io_binding, which is set to false",
                               hint="drop io_binding: false, or the enable_cuda_graph option")  # fmt: skip
        self.io_binding = io_binding
        if intra_op_spinning is not None and not isinstance(intra_op_spinning, bool):
            raise BackendError(f"intra_op_spinning must be true, false or null, got {intra_op_spinning!r}",
                               hint="null keeps ONNX Runtime's default (spinning)")  # fmt: skip
        self.intra_op_spinning = intra_op_spinning
        if intra_op_spin_us is not None and (not isinstance(intra_op_spin_us, int) or isinstance(intra_op_spin_us, bool)
                                             or not 1 <= intra_op_spin_us <= MAX_SPIN_US):  # fmt: skip
            raise BackendError(f"intra_op_spin_us must be an int from 1 to {MAX_SPIN_US} or null, got {intra_op_spin_us!r}",
                               hint="a few microseconds keep the pool awake between operators; null keeps ONNX Runtime's spin length")  # fmt: skip
        self.intra_op_spin_us = intra_op_spin_us
        self._binding: DeviceBinding | None = None
        self.providers_that_failed: tuple[str, ...] = ()  # requested, built in, but not loaded (a later one ran)
        self._session: Any = None
        self._run: SessionRun | None = None
        self._retry_publicly: tuple[type[BaseException], ...] = ()  # errors of _run that session.run handles
        self._output_names = list(signature.output_names)  # made once: the signature does not change

    @classmethod
    def from_bundle(cls, bundle: Any, **overrides: Any) -> OnnxRuntimeRunner:
        unknown = sorted(set(overrides) - set(_CONSTRUCTOR_OPTIONS))
        if unknown:
            raise BackendError(
                f"unknown onnxruntime runner option(s): {', '.join(unknown)}",
                hint=f"known options: {', '.join(_CONSTRUCTOR_OPTIONS)}",
            )
        section = bundle.backend
        options: dict[str, Any] = {
            "execution_providers": section.get("execution_providers") or [CPU_PROVIDER],
            "graph_optimization": section.get("graph_optimization") or "all",
            "intra_op_threads": section.get("intra_op_threads"),
            "denormal_as_zero": section.get("denormal_as_zero", False),
            "io_binding": section.get("io_binding"),
            "intra_op_spinning": section.get("intra_op_spinning"),
            "intra_op_spin_us": section.get("intra_op_spin_us"),
        }
        options.update(overrides)
        try:
            return cls(bundle.model_path, bundle.io, **options)
        except BackendError as err:  # say where the options came from: the manifest, or the caller's overrides
            given = f", with {', '.join(sorted(overrides))} from the runner options" if overrides else ""
            raise BackendError(f"bundle '{bundle.root}' (manifest.json backend{given}): {err.message}", hint=err.hint) from err

    @property
    def concurrent_calls_safe(self) -> bool:
        """True for ``session.run`` (ONNX Runtime's ``Run`` is thread-safe); False through an IOBinding, whose
        device buffers one call at a time uses (:class:`DeviceBinding` serialises them)."""
        return self._session is not None and self._binding is None

    @property
    def session(self) -> Any:
        """The underlying ``onnxruntime.InferenceSession`` (loaded runners only)."""
        self._require_loaded("session")
        return self._session

    # -- implementation ------------------------------------------------------------------------

    def _load_impl(self) -> None:
        ort = _import_onnxruntime()
        self._check_providers_installed(ort)
        if not self.model_path.is_file():
            raise BackendError(
                f"model file '{self.model_path}' does not exist",
                hint="check the bundle directory; open_bundle(root, verify=True) lists missing files",
            )
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[self.graph_optimization]
        )
        if self.intra_op_threads is not None:
            options.intra_op_num_threads = self.intra_op_threads
        if self.optimized_model_path is not None:
            options.optimized_model_filepath = str(self.optimized_model_path)
        if self.denormal_as_zero:
            options.add_session_config_entry("session.set_denormal_as_zero", "1")
        spinning = self.intra_op_spinning
        if self.intra_op_spin_us is not None and spinning is not False:
            if spin_duration_supported(ort.__version__):
                options.add_session_config_entry("session.intra_op.spin_duration_us", str(self.intra_op_spin_us))
            else:
                spinning = False
                logger.info("onnxruntime %s cannot bound intra-op spinning to %d us (1.26 and later can): the intra-op "
                            "threads of '%s' sleep between runs instead", ort.__version__, self.intra_op_spin_us, self.model_path)  # fmt: skip
        if spinning is not None:
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        session = self._new_session(ort, options, self.execution_providers)
        self._check_providers_loaded(ort, session)
        session = self._without_providers_that_failed(ort, options, session)
        self._check_model_matches_signature(session)
        self._session = session
        self._run, self._retry_publicly = _session_run(session)
        self._binding = self._device_binding(ort, session)
        if self._binding is not None:
            self._run, self._retry_publicly = self._bound_run, ()

    def _new_session(self, ort: ModuleType, options: Any, requested: Sequence[ExecutionProviderConfig]) -> Any:
        providers = [(provider.name, provider.ort_options()) for provider in requested]
        try:
            return ort.InferenceSession(str(self.model_path), sess_options=options, providers=providers)
        except Exception as err:  # ONNX Runtime raises its own pybind exception types
            raise self._load_error(err) from err

    def _without_providers_that_failed(self, ort: ModuleType, options: Any, session: Any) -> Any:
        """Some requested accelerators loaded and some did not (TensorRT's libraries missing beside CUDA's):
        ONNX Runtime's own retry drops every provider option, so the session is made again with the
        providers that did load and the manifest's options for them, and the log names what fell away."""
        loaded = set(session.get_providers())
        missing = [p.name for p in self.execution_providers if p.name != CPU_PROVIDER and p.name not in loaded]
        if not missing:
            return session
        kept = [p for p in self.execution_providers if p.name in loaded]
        logger.warning("%s: execution provider(s) %s did not load (their libraries are missing or failed); running on %s, "
                       "the next in the bundle's list, with its options", self.model_path, ", ".join(missing),
                       ", ".join(p.name for p in kept))  # fmt: skip
        self.providers_that_failed = tuple(missing)
        return self._new_session(ort, options, kept)

    @property
    def device_binding(self) -> DeviceBinding | None:
        """The IOBinding this runner runs through (loaded runners only; None when it runs ``session.run``)."""
        self._require_loaded("device_binding")
        return self._binding

    def _cuda_graph_requested(self) -> bool:
        return any(provider.name == "CUDAExecutionProvider" and provider.ort_options().get("enable_cuda_graph") in ("1", "true", "True")
                   for provider in self.execution_providers)  # fmt: skip

    def _device_binding(self, ort: ModuleType, session: Any) -> DeviceBinding | None:
        first = session.get_providers()[0]
        device = DEVICE_OF_PROVIDER.get(first)
        if self.io_binding is False or (device is None and not self.io_binding):
            return None
        options = next((p.ort_options() for p in self.execution_providers if p.name == first), {})
        return DeviceBinding(ort, session, self._output_names, device=device or "cpu", device_id=int(options.get("device_id", 0)),
                             cuda_graph=first == "CUDAExecutionProvider" and self._cuda_graph_requested())  # fmt: skip

    def _bound_run(self, names: list[str], feeds: dict[str, Any], run_options: Any) -> list[Any]:
        assert self._binding is not None
        return self._binding.run(feeds)

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._run is not None  # loaded runners only (Runner.infer checks)
        names = self._output_names
        if type(feeds) is not dict:
            feeds = dict(feeds)
        try:
            outputs = self._run(names, feeds, None)
        except Exception as err:  # ONNX Runtime raises its own pybind exception types
            outputs = self._after_failed_run(feeds, err)
        return dict(zip(names, outputs))

    def compiled_run(self) -> CompiledRun:
        """The compiled session call itself (see :func:`_session_run`), with :meth:`_after_failed_run` to
        recover: a server calls ONNX Runtime with no frame of this runner in between. After an
        execution-provider fallback the compiled call is a new one: ask again."""
        self._require_loaded("compiled_run")
        assert self._run is not None  # set while loaded
        return CompiledRun(self._run, self._output_names, self._after_failed_run)

    def _after_failed_run(self, feeds: dict[str, np.ndarray], err: Exception) -> list[Any]:
        """The compiled call raised ``err``: an EPFail is ``session.run``'s to handle (it retries on the
        fallback providers and replaces the compiled session, see :func:`_session_run`); anything else,
        or a retry that fails too, is a BackendError."""
        try:
            if not isinstance(err, self._retry_publicly):
                raise err
            outputs = self._session.run(self._output_names, feeds)
        except Exception as failure:
            raise BackendError(
                f"ONNX Runtime failed to run '{self.model_path}': {_first_line(failure)}",
                hint="the inputs passed the signature check; a value-dependent op (Reshape, Gather "
                "indices) may reject them, or the model may need a newer onnxruntime",
            ) from failure
        self._run, self._retry_publicly = _session_run(self._session)
        return outputs

    def _close_impl(self) -> None:
        self._session = self._run = self._binding = None
        self._retry_publicly = ()

    def _providers_impl(self) -> tuple[str, ...]:
        return tuple(self._session.get_providers())

    # -- checks --------------------------------------------------------------------------------

    def _check_providers_installed(self, ort: ModuleType) -> None:
        known = list(ort.get_all_providers())
        available = list(ort.get_available_providers())
        for provider in self.execution_providers:
            if provider.name not in known:
                close = difflib.get_close_matches(provider.name, known, n=1)
                raise BackendError(
                    f"unknown execution provider '{provider.name}' for '{self.model_path}'",
                    hint=(f"did you mean '{close[0]}'? " if close else "")
                    + f"providers this onnxruntime knows: {', '.join(known)}",
                )
            if provider.name not in available:
                package = _PROVIDER_PACKAGES.get(provider.name, "an onnxruntime build that includes it")
                raise BackendError(
                    f"execution provider '{provider.name}' is not in the installed onnxruntime "
                    f"{ort.__version__} (available: {', '.join(available)})",
                    hint=f"install {package} in place of onnxruntime; for CUDA providers also check "
                    "that the CUDA and cuDNN versions match that build",
                )

    def _check_providers_loaded(self, ort: ModuleType, session: Any) -> None:
        """At least one requested accelerator must have loaded: ONNX Runtime falling back to the CPU alone
        (with only a warning) is an error. Later accelerators in the list are fallbacks for earlier ones."""
        loaded = list(session.get_providers())
        accelerators = [provider for provider in self.execution_providers if provider.name != CPU_PROVIDER]
        if any(provider.name in loaded for provider in accelerators):
            return
        for provider in accelerators:
            if provider.name not in loaded:
                raise BackendError(
                    f"execution provider '{provider.name}' was requested for '{self.model_path}' but did "
                    f"not load; ONNX Runtime fell back to {', '.join(loaded)}",
                    hint="the provider is built into onnxruntime but its libraries failed to load: check "
                    "that CUDA, cuDNN (and TensorRT) match the onnxruntime-gpu build and are on the "
                    "library path, and that a GPU is visible (nvidia-smi)",
                )

    def _check_model_matches_signature(self, session: Any) -> None:
        fix = "the bundle's io section does not describe this model: rebuild the bundle"
        model_inputs = {node.name: node for node in session.get_inputs()}
        if set(model_inputs) != set(self.signature.input_names):
            raise BackendError(
                f"model '{self.model_path}' has inputs {sorted(model_inputs)} but the signature lists "
                f"{list(self.signature.input_names)}",
                hint=fix,
            )
        model_outputs = {node.name: node for node in session.get_outputs()}
        absent = [name for name in self.signature.output_names if name not in model_outputs]
        if absent:
            raise BackendError(
                f"model '{self.model_path}' has no output(s) {absent}; its outputs: {sorted(model_outputs)}",
                hint=fix,
            )
        for tensor in (*self.signature.inputs, *self.signature.outputs):
            node = model_inputs.get(tensor.name) or model_outputs[tensor.name]
            dtype = ORT_TYPE_TO_DTYPE.get(node.type)
            if dtype is not None and dtype != tensor.dtype:
                raise BackendError(
                    f"model '{self.model_path}': tensor '{tensor.name}' is {dtype} in the model but "
                    f"{tensor.dtype} in the signature",
                    hint=fix,
                )
            # ONNX Runtime reports an unknown rank as []; only a known, different rank is an error.
            if isinstance(node.shape, list) and node.shape and len(node.shape) != tensor.rank:
                raise BackendError(
                    f"model '{self.model_path}': tensor '{tensor.name}' has rank {len(node.shape)} in the "
                    f"model but {tensor.rank} in the signature {tensor.describe()}",
                    hint=fix,
                )

    def _load_error(self, err: BaseException) -> BackendError:
        message = _first_line(err)
        if type(err).__name__ == "InvalidProtobuf" or "Protobuf parsing failed" in message:
            return BackendError(
                f"model file '{self.model_path}' is not a valid ONNX model: {message}",
                hint="the file is truncated or corrupt: copy the bundle again and open it with "
                "open_bundle(root, verify=True) to check every file's hash",
            )
        if "graph capture" in message:
            return BackendError(
                f"ONNX Runtime cannot capture '{self.model_path}' as a CUDA graph: {message}",
                hint="a CUDA graph needs every node on the CUDA provider; this model leaves some on the CPU (shape "
                "arithmetic on int64, for instance): drop the enable_cuda_graph option for this bundle",
            )
        return BackendError(
            f"ONNX Runtime cannot load model '{self.model_path}': {message}",
            hint="check the execution provider options, and that the model's opset and ops are "
            "supported by the installed onnxruntime",
        )
