"""The OpenVINO backend: compiles the bundle's ONNX graph for an OpenVINO device (CPU, GPU, NPU) with the
precision hint the manifest records, and runs it through one infer request.

``openvino`` is imported when a runner loads (install ``edgekit-runtime[openvino]``).
"""

from __future__ import annotations

import os
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
        self._compiled: Any = None
        self._request: Any = None
        self._outputs: list[tuple[str, Any]] = []
        self._per_shape: dict[tuple[tuple[int, ...], ...], tuple[Any, list[tuple[str, Any]]]] = {}
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
        if self.shapes == "dynamic":
            self._compiled, self._request, self._outputs = self._compile(None)

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

    def _compile(self, shapes: dict[str, tuple[int, ...]] | None) -> tuple[Any, Any, list[tuple[str, Any]]]:
        """The compiled model, its infer request and output ports; ``shapes`` fixes every input (static)."""
        try:
            model = self._core.read_model(str(self.model_path))
            if shapes is not None:
                model.reshape(shapes)
            compiled = self._core.compile_model(model, self.device, self.compile_config())
        except RuntimeError as exc:
            at = f" at input shapes {shapes}" if shapes else ""
            raise BackendError(f"OpenVINO {self._version} could not compile '{self.model_path}' for {self.device}{at}: {exc}",
                               hint="an operator the error names is missing in this OpenVINO release or device plugin") from None
        return compiled, compiled.create_infer_request(), [(name, compiled.output(name)) for name in self.signature.output_names]

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.shapes == "dynamic":
            request, outputs = self._request, self._outputs
        else:
            request, outputs = self._request_for(feeds)
        request.infer(dict(feeds))
        # the request's tensors are reused by the next call: copy them out
        return {name: np.array(request.get_tensor(port).data) for name, port in outputs}

    def _request_for(self, feeds: Mapping[str, np.ndarray]) -> tuple[Any, list[tuple[str, Any]]]:
        key = tuple(tuple(np.shape(feeds[name])) for name in self.signature.input_names)
        found = self._per_shape.get(key)
        if found is None:
            if len(self._per_shape) >= MAX_COMPILED_SHAPES:
                self._per_shape.pop(next(iter(self._per_shape)))
            _, request, outputs = self._compile(dict(zip(self.signature.input_names, key)))
            found = self._per_shape[key] = (request, outputs)
        return found

    def _close_impl(self) -> None:
        self._request = None
        self._compiled = None
        self._per_shape.clear()

    def _providers_impl(self) -> tuple[str, ...]:
        standing = f" standing in for {self.stands_in_for}" if self.stands_in_for else ""
        return (f"OpenVINO {self.device}{standing} ({self.inference_precision_hint})",)
