"""An OpenVINO compiled model on this host's CPU behind the small part of ONNX Runtime's session API the host tools
use (``get_inputs()``, ``get_outputs()``, ``run(names, feeds)``), so that ``auto``'s timer and evaluator and the
corpus can run OpenVINO candidates beside ONNX Runtime ones in one interleaved loop.

It compiles as the device runner does (:meth:`edgekit_runtime.backends.openvino.OpenVinoRunner.compile_config`):
``INFERENCE_PRECISION_HINT`` (``None``: OpenVINO's own default, bf16 on a CPU with AVX-512 BF16 or AMX), the latency
performance hint and the intra-op thread count. ``openvino`` is imported when a session is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.engines.openvino import openvino_version


@dataclass(frozen=True)
class PortName:
    """What ``get_inputs()`` / ``get_outputs()`` items carry (ONNX Runtime's ``NodeArg`` has ``name`` too)."""

    name: str


def compile_config(hint: str | None, threads: int | None) -> dict[str, str]:
    """The CPU plugin's compile properties: those of the device runner (threads not pinned: pinned, OpenVINO ran 2-8x
    slower on this shared host), with no precision hint for OpenVINO's default."""
    config = {"PERFORMANCE_HINT": "LATENCY"}
    if hint is not None:
        config["INFERENCE_PRECISION_HINT"] = hint
    config["ENABLE_CPU_PINNING"] = "NO"
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    return config


class OpenVinoSession:
    """``path`` compiled for OpenVINO's CPU plugin at ``hint`` (``f32`` strict, ``bf16``, or ``None``: the default)."""

    def __init__(self, path: Path | str, hint: str | None = "f32", threads: int | None = None) -> None:
        import onnx

        openvino_version()  # a BuildError naming the extra when OpenVINO is not installed
        import openvino as ov

        graph = onnx.load(str(path), load_external_data=False).graph
        initializers = {tensor.name for tensor in graph.initializer}
        self.input_names = [value.name for value in graph.input if value.name not in initializers]
        self.output_names = [value.name for value in graph.output]
        self.path, self.hint, self.threads = Path(path), hint, threads
        self.config = compile_config(hint, threads)
        self._compiled = ov.Core().compile_model(str(path), "CPU", self.config)
        self._request = self._compiled.create_infer_request()
        self._ports = {name: self._compiled.output(name) for name in self.output_names}

    def get_inputs(self) -> list[PortName]:
        return [PortName(name) for name in self.input_names]

    def get_outputs(self) -> list[PortName]:
        return [PortName(name) for name in self.output_names]

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._request.infer({name: feeds[name] for name in self.input_names})
        # the request's tensors are reused by the next call: copy them out
        return [np.array(self._request.get_tensor(self._ports[name]).data) for name in (names or self.output_names)]

    def describe(self) -> str:
        return f"OpenVINO CPU ({self.hint or 'default'})"


def available() -> bool:
    """OpenVINO is installed and its CPU plugin is present on this host."""
    try:
        import openvino as ov
    except ImportError:
        return False
    return "CPU" in ov.Core().available_devices


def default_precision() -> str:
    """The CPU plugin's own default INFERENCE_PRECISION_HINT on this host (``bf16`` where the CPU has it)."""
    import openvino as ov

    value: Any = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    return str(value.to_string()) if hasattr(value, "to_string") else str(value)
