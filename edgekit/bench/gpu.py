"""``edgekit bench --device cuda``: a bundle's graph on this host's NVIDIA GPU through onnxruntime-gpu.

Three ways to call it, timed side by side (and beside PyTorch on the same GPU with ``--vs-pytorch``):

- ``bundle``: numpy in, numpy out, as the agent serves a request (IOBinding: the feeds are copied into
  device buffers kept per shape, the outputs copied back);
- ``bundle_device_io``: inputs already on the GPU and outputs left there (no host copies);
- ``bundle_cuda_graph``: as ``bundle``, with the CUDA provider's ``enable_cuda_graph`` (one graph per
  shape, replayed: no per-kernel launch cost).

Each variant's energy per inference (per item, one sample; and per call of the whole batch) comes from NVML's
board energy counter over a few seconds of back-to-back calls (``energy``), where NVML and the counter are there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import Bundle
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature

CUDA_PROVIDER = "CUDAExecutionProvider"
#: Seconds of back-to-back calls behind one energy figure: NVML's energy counter moves in steps of
#: tens of milliseconds, so shorter windows give a coarse number.
ENERGY_WINDOW_S = 3.0


def cuda_runner(bundle: Bundle, signature: IOSignature, *, cuda_graph: bool = False, device_id: int = 0) -> OnnxRuntimeRunner:
    """The bundle's graph on the CUDA provider (CPU for the ops it leaves), loaded; an error says what is missing."""
    import onnxruntime as ort

    if CUDA_PROVIDER not in ort.get_available_providers():
        raise EdgekitError(
            f"--device cuda needs onnxruntime-gpu's {CUDA_PROVIDER}; this onnxruntime {ort.__version__} has "
            f"{', '.join(ort.get_available_providers())}",
            hint="pip install 'edgekit[gpu]' (onnxruntime-gpu in place of onnxruntime) on a machine with an NVIDIA GPU",
        )
    options: dict[str, Any] = {"device_id": device_id, **({"enable_cuda_graph": True} if cuda_graph else {})}
    graph_optimization = bundle.manifest["backend"].get("graph_optimization", "all")
    return OnnxRuntimeRunner(bundle.model_path, signature, execution_providers=[{"name": CUDA_PROVIDER, "options": options}, "CPUExecutionProvider"],
                             graph_optimization=graph_optimization, io_binding=True).load()  # fmt: skip


def cuda_contenders(bundle: Bundle, signature: IOSignature, feeds: dict[str, np.ndarray]) -> tuple[dict[str, Callable[[], Any]], list[OnnxRuntimeRunner], list[str]]:
    """The GPU variants as no-argument calls, the runners to close afterwards, and notes on a variant that
    could not run (a model with nodes left on the CPU cannot be captured as a CUDA graph)."""
    plain = cuda_runner(bundle, signature)
    runners = [plain]
    binding = plain.device_binding
    assert binding is not None  # io_binding=True
    resident = {name: binding.to_device(array) for name, array in feeds.items()}
    contenders: dict[str, Callable[[], Any]] = {
        "bundle": lambda: plain.infer(feeds, validate=False),
        "bundle_device_io": lambda: binding.run_resident(resident),
    }
    try:
        graph = cuda_runner(bundle, signature, cuda_graph=True)
    except BackendError as error:
        return contenders, runners, [f"bundle_cuda_graph: not timed: {error}"]
    runners.append(graph)
    contenders["bundle_cuda_graph"] = lambda: graph.infer(feeds, validate=False)
    return contenders, runners, []


def providers_of(runners: list[OnnxRuntimeRunner]) -> list[str]:
    return list(runners[0].providers) if runners else []


def energy_per_inference(contenders: dict[str, Callable[[], Any]], batch: int, window_s: float = ENERGY_WINDOW_S) -> dict[str, dict[str, float]] | str:
    """NVML board energy per inference (``mj_per_inference``: per item, one sample of the batch), per call of ``batch``
    items (``mj_per_call``) and mean power, for each contender over ``window_s`` of back-to-back calls; or why there is
    no figure (no NVML, no energy counter)."""
    from edgekit_runtime.sensors.nvml import NvmlPowerSensor

    sensor = NvmlPowerSensor()
    if not sensor.available():
        return f"no energy figures: {sensor.unavailable_reason}"
    try:
        if sensor.read().energy_mj is None:
            return "no energy figures: this GPU's NVML has no total-energy counter"
        out = {}
        for name, fn in contenders.items():
            fn()
            before, calls, started = sensor.read(), 0, time.perf_counter()
            while time.perf_counter() - started < window_s:
                fn()
                calls += 1
            after = sensor.read()
            seconds = after.timestamp_s - before.timestamp_s
            joules = (after.energy_mj - before.energy_mj) / 1000.0  # type: ignore[operator]
            # per inference is per item (one sample), as edgekit estimate's "mJ / inference"; a call runs ``batch`` of them
            out[name] = {"mj_per_inference": round(1000.0 * joules / (calls * batch), 4), "mj_per_call": round(1000.0 * joules / calls, 4),
                         "batch": batch, "mean_w": round(joules / seconds, 1), "calls": calls, "seconds": round(seconds, 2)}  # fmt: skip
        return out
    finally:
        sensor.close()
