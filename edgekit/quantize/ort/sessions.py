"""ONNX Runtime sessions of candidate models on the host CPU, shared by the evaluator and the timer of ``auto``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.engines.ort_session import cpu_session
from edgekit.errors import QuantizationError


#: The last few sessions the evaluator and the timer created, so a candidate is loaded (and optimised by
#: ONNX Runtime) once for both: key (path, size, mtime, threads, optimisation level).
_SESSIONS: dict[tuple[Any, ...], Any] = {}
_SESSIONS_KEPT = 3


def shared_session(path: Path, threads: int | None = None, graph_optimization: str = "all") -> Any:
    """:func:`ort_session`, reused while the file is unchanged (the candidate just built, evaluated then timed)."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, threads, graph_optimization)
    if key in _SESSIONS:
        _SESSIONS[key] = _SESSIONS.pop(key)
        return _SESSIONS[key]
    session = ort_session(path, threads, graph_optimization)
    _SESSIONS[key] = session
    while len(_SESSIONS) > _SESSIONS_KEPT:
        _SESSIONS.pop(next(iter(_SESSIONS)))
    return session


def ort_session(path: Path, threads: int | None = None, graph_optimization: str = "all") -> Any:
    """:func:`~edgekit.engines.ort_session.cpu_session` of a candidate, denormals flushed as CPU bundles run, and its
    intra-op threads parked after each run: the timer runs candidates back to back, and a pool left spinning takes a
    core from the next session (2 cores: YOLOS int8-dynamic timed 0.85x..1.3x FP32 by turns, wav2vec2's rewritten
    FP32 0.22x). A graph ONNX Runtime cannot load is a QuantizationError."""
    try:
        return cpu_session(path, threads, graph_optimization=graph_optimization, allow_spinning=False)
    except Exception as exc:
        raise QuantizationError(f"ONNX Runtime cannot load {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
