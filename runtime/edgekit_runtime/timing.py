"""Latency measurement shared by ``edgekit bench`` on the host and the build's benchmark stage.

Samples are wall-clock milliseconds from ``time.perf_counter_ns``; percentiles use numpy's default
(linear) interpolation; ``std_ms`` is the population standard deviation.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.signature import validate_feeds

if TYPE_CHECKING:
    from edgekit_runtime.backends.base import Runner

_NS_PER_MS = 1_000_000
_BYTES_PER_MIB = 1024 * 1024


@dataclass(frozen=True)
class LatencyStats:
    """Summary of latency samples, all in milliseconds."""

    count: int
    mean_ms: float
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    std_ms: float

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float]) -> LatencyStats:
        samples = np.asarray(samples_ms, dtype=np.float64)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(f"need a non-empty 1-D sequence of latency samples, got shape {samples.shape}")
        if not np.all(np.isfinite(samples)) or np.any(samples < 0):
            raise ValueError("latency samples must be finite and >= 0 ms")
        p50, p90, p99 = np.percentile(samples, [50, 90, 99])
        return cls(
            count=int(samples.size),
            mean_ms=float(samples.mean()),
            min_ms=float(samples.min()),
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            max_ms=float(samples.max()),
            std_ms=float(samples.std()),
        )

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _check_counts(warmup: int, iterations: int) -> None:
    for label, value, low in (("warmup", warmup, 0), ("iterations", iterations, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise EdgekitError(
                f"benchmark {label} must be an int >= {low}, got {value!r}",
                hint="e.g. warmup=10, iterations=100",
            )


def time_calls(fn: Callable[[], object], warmup: int, iterations: int, *, pause_gc: bool = True) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``iterations`` times; return each call's ms.

    With ``pause_gc`` (the default) Python's cyclic garbage collector is paused during the timed
    calls, so its pauses do not land in the tail percentiles; it is restored afterwards.
    """
    _check_counts(warmup, iterations)
    for _ in range(warmup):
        fn()
    samples_ms: list[float] = []
    gc_was_enabled = gc.isenabled()
    if pause_gc:
        gc.disable()
    try:
        for _ in range(iterations):
            start_ns = time.perf_counter_ns()
            fn()
            samples_ms.append((time.perf_counter_ns() - start_ns) / _NS_PER_MS)
    finally:
        if pause_gc and gc_was_enabled:
            gc.enable()
    return samples_ms


def throughput_per_s(batch: int, stats: LatencyStats) -> float:
    """Items per second when each call processes ``batch`` items at the mean latency."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return math.inf if stats.mean_ms <= 0 else batch * 1000.0 / stats.mean_ms


def _status_mib(key: str, status_path: str | os.PathLike[str]) -> float | None:
    """A memory line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``: kB) in MiB; None where the file cannot tell."""
    try:
        for line in Path(status_path).read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith(f"{key}:"):
                return float(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mb(status_path: str | os.PathLike[str] = "/proc/self/status") -> float | None:
    """This process's resident set size now in MiB (``VmRSS``), ``None`` where /proc cannot tell."""
    return _status_mib("VmRSS", status_path)


def peak_rss_mb(status_path: str | os.PathLike[str] = "/proc/self/status") -> float:
    """Peak resident memory of this process in MiB (``VmHWM``; else ``getrusage``'s ``ru_maxrss``)."""
    peak = _status_mib("VmHWM", status_path)
    if peak is not None:
        return peak
    import resource  # Unix only; imported here so the module imports everywhere

    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in bytes on macOS and in KiB on Linux and the BSDs.
    return max_rss / _BYTES_PER_MIB if sys.platform == "darwin" else max_rss / 1024.0


#: ``BenchmarkResult.peak_rss_scope`` when the process's peak was reset just before the benchmark (Linux
#: ``/proc/self/clear_refs``): the peak is the process's resident memory during the benchmark, everything else the
#: process holds (torch, the exporter, ...) included.
PEAK_SINCE_BENCHMARK = "process during the benchmark"
#: ``BenchmarkResult.peak_rss_scope`` when the peak could not be reset: the process's lifetime peak, whatever it did
#: before the benchmark (in a build: loading torch, exporting, quantizing, evaluating).
PEAK_PROCESS_LIFETIME = "process lifetime"


def reset_peak_rss(
    clear_refs_path: str | os.PathLike[str] = "/proc/self/clear_refs",
    status_path: str | os.PathLike[str] = "/proc/self/status",
) -> bool:
    """Reset this process's peak resident set size (``VmHWM``) to its current RSS; True where that worked.

    Linux (4.0 and later) resets it when ``5`` is written to ``/proc/self/clear_refs``; elsewhere (macOS, a
    kernel or sandbox that refuses the write) nothing changes and this returns False, so the peak read later is
    the process's lifetime peak. Success is checked: after the write ``VmHWM`` must not exceed the RSS read then
    by more than a little (the pages touched in between).
    """
    try:
        with open(clear_refs_path, "w", encoding="ascii") as stream:
            stream.write("5")
    except OSError:
        return False
    peak, now = _status_mib("VmHWM", status_path), _status_mib("VmRSS", status_path)
    return peak is not None and now is not None and peak <= now + 1.0


@dataclass(frozen=True)
class BenchmarkResult:
    """Latency of one runner on one set of feeds."""

    stats: LatencyStats
    samples_ms: tuple[float, ...]
    batch: int
    shape: Mapping[str, int]
    warmup: int
    iterations: int
    throughput_per_s: float
    peak_rss_mb: float
    #: What ``peak_rss_mb`` covers: :data:`PEAK_SINCE_BENCHMARK` or :data:`PEAK_PROCESS_LIFETIME`. Either way it is
    #: the whole process's memory, not the model's alone.
    peak_rss_scope: str = PEAK_PROCESS_LIFETIME

    def to_dict(self, *, include_samples: bool = False) -> dict[str, Any]:
        """The manifest's ``benchmark`` keys this result knows (the host adds ``host`` and ``threads``)."""
        data: dict[str, Any] = {
            "batch": self.batch,
            "shape": dict(self.shape),
            "warmup": self.warmup,
            "iterations": self.iterations,
            **{key: value for key, value in self.stats.to_dict().items() if key != "count"},
            "throughput_per_s": self.throughput_per_s,
            "peak_rss_mb": self.peak_rss_mb,
            "peak_rss_scope": self.peak_rss_scope,
        }
        if include_samples:
            data["samples_ms"] = list(self.samples_ms)
        return data


def benchmark_runner(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    warmup: int = 10,
    iterations: int = 100,
    *,
    batch: int | None = None,
) -> BenchmarkResult:
    """Time ``runner.infer(feeds)`` on a loaded runner.

    The feeds are validated once against the runner's signature; the timed calls skip validation so
    only the backend is measured. The process's peak RSS is reset before the calls where the OS allows it
    (:func:`reset_peak_rss`), so ``peak_rss_mb`` is the peak during the benchmark, ``peak_rss_scope`` says which
    peak it is. ``batch`` defaults to the size bound to the dim named ``batch``
    (1 when the model has none); the dim sizes of the feeds are recorded as ``shape``.
    """
    _check_counts(warmup, iterations)
    shape = validate_feeds(runner.signature, feeds)
    if batch is None:
        batch = shape.get("batch", 1)
    if batch < 1:
        raise EdgekitError(f"benchmark batch must be >= 1, got {batch}", hint="feed at least one item")
    scope = PEAK_SINCE_BENCHMARK if reset_peak_rss() else PEAK_PROCESS_LIFETIME
    samples_ms = time_calls(lambda: runner.infer(feeds, validate=False), warmup, iterations)
    stats = LatencyStats.from_samples(samples_ms)
    return BenchmarkResult(
        stats=stats,
        samples_ms=tuple(samples_ms),
        batch=batch,
        shape=shape,
        warmup=warmup,
        iterations=iterations,
        throughput_per_s=throughput_per_s(batch, stats),
        peak_rss_mb=peak_rss_mb(),
        peak_rss_scope=scope,
    )
