"""How host-side code opens a model in ONNX Runtime on the CPU: corpus runs, the auto precision search's
candidates and the estimate's micro-benchmarks all use :func:`cpu_session`, with threads, graph optimisation
level and denormal handling as arguments. (Bundles on a device load through the runtime's OnnxRuntimeRunner.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit_runtime.backends.onnxruntime import GRAPH_OPTIMIZATION_LEVELS


def cpu_session(model: str | Path | bytes | Any, threads: int | None = None, *, graph_optimization: str = "all",
                denormal_as_zero: bool = True, allow_spinning: bool = True, log_severity_level: int = 3) -> Any:  # fmt: skip
    """An ``onnxruntime.InferenceSession`` of ``model`` on ``CPUExecutionProvider``.

    ``model``: a file path, the serialized model, or an in-memory ``onnx.ModelProto``. ``threads``: intra-op threads
    (inter-op 1); None or 0 keeps ONNX Runtime's default (every core). ``graph_optimization``: a key of
    :data:`~edgekit_runtime.backends.onnxruntime.GRAPH_OPTIMIZATION_LEVELS` (``all`` is ONNX Runtime's default).
    ``denormal_as_zero``: flush denormals to zero, as the runtime runs CPU bundles. ``allow_spinning``: False stops the
    intra-op pool spinning after a run (sessions timed back to back then do not take each other's cores).
    ``log_severity_level``: 3 logs errors only, 2 warnings too (ONNX Runtime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[graph_optimization])
    options.log_severity_level = log_severity_level
    if denormal_as_zero:
        options.add_session_config_entry("session.set_denormal_as_zero", "1")
    if not allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


__all__ = ["cpu_session"]
