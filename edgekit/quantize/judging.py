"""Judging candidates for ``--precision auto``: accuracy by the recipe's own metric, speed by interleaved timing.

The search takes two callables, so each engine judges on its own runtime (the ONNX Runtime ones, on the host CPU:
:mod:`edgekit.quantize.ort.judges`):

* ``evaluate(path) -> AccuracyLike``: the recipe metric and whether it is inside the budget;
* ``time_models(paths) -> latencies_ms``: latency of each file, measured *interleaved* in one call
  (each round runs every file once), so that drift on a shared machine hits them alike. It may take a keyword
  ``bar``: the latency ratio above which the candidate is rejected anyway, so that it can stop timing early.

:class:`LatencyJudge` times each candidate beside the FP32 reference (every latency is a ratio to it), keeps the
fastest candidate inside the budget so far, and from it the *bar* a candidate must get under to matter and the
*floor* a candidate cannot beat (the measured ratio of a candidate it dominates, see
:meth:`edgekit.quantize.candidates.Candidate.dominates`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol

from edgekit.errors import QuantizationError
from edgekit.precision import Precision
from edgekit.quantize.candidates import EXPORTED, BuiltCandidate, Candidate


class AccuracyLike(Protocol):
    """What the search reads from an evaluation (``edgekit.evaluate.accuracy.AccuracyResult`` fits)."""

    value: float
    passed: bool
    cosine_min: float | None


EvaluateFn = Callable[[Path], AccuracyLike]
TimeFn = Callable[[Sequence[Path]], Sequence[float]]


@dataclass(frozen=True)
class Timing:
    latency_ms: float
    reference_latency_ms: float
    latency_ratio: float
    latency_ratio_same_graph_fp32: float | None


class LatencyJudge:
    """Times candidates interleaved with the FP32 ``reference`` (and a graph variant's own FP32 model, from
    ``graph_references``) and holds the best candidate inside the budget so far. ``counts`` is the search's tally
    (``timed``, ``timing_skipped``, ``confirmation_timed``)."""

    def __init__(self, time_models: TimeFn, reference: Path, graph_references: dict[str, Path], noise_margin: float,
                 counts: dict[str, int]) -> None:
        self.time_models, self.reference, self.graph_references = time_models, reference, graph_references
        self.margin, self.counts = noise_margin, counts
        self.measured: list[tuple[Candidate, float]] = []  # (candidate, latency ratio) of every candidate timed
        self.best: tuple[Candidate, BuiltCandidate] | None = None
        self.best_ratio = float("inf")
        self.timing_s = 0.0  # seconds spent inside time_models
        self.models_timed = 0  # models timed in those calls, all calls together (prices a run-off's round)
        self.graph_ratios: dict[str, float] = {}  # graph variant -> its FP32 model's latency ratio to the reference
        self._timer_takes_bar = takes_keyword(time_models, "bar")

    def to_beat(self) -> float:
        """The latency ratio a candidate must get under to displace the best so far: the best's ratio less the noise
        margin once the best is clearly faster than FP32 (under ``1 - margin``). While the best is within the noise of
        FP32 it has proved no speed-up, so its own ratio, without the margin, is the bar: wav2vec2's rewritten FP32 timed
        0.967x in the search (1.00x re-timed on a quiet host) and, with the margin, pruned int8-dynamic at 0.94x and the
        plan that keeps its edge layers float (0.93x FP32, inside the budget)."""
        if self.best_ratio < 1 - self.margin:
            return self.best_ratio * (1 - self.margin)
        return self.best_ratio

    def bar(self, candidate: Candidate) -> tuple[float, str] | None:
        """The latency ratio ``candidate`` must get under to matter, and what sets it."""
        if self.best is not None:
            return self.to_beat(), f"{self.best[0].name} ({self.best_ratio:.3f}x)"
        if not is_reference(candidate):
            return 1.0, "FP32 (1.000x): a plan other than the FP32 reference is chosen only when it is faster than FP32"
        return None

    def floor(self, candidate: Candidate) -> tuple[float, str] | None:
        """The lowest latency ratio ``candidate`` can plausibly reach, from the candidates it dominates."""
        if is_reference(candidate):
            return (1.0, "the FP32 reference")  # measured by definition; it wins when everything else is slower
        floors = [(ratio, other.name) for other, ratio in self.measured if candidate.dominates(other)]
        return max(floors) if floors else None

    def time(self, candidate: Candidate, path: Path, known: Sequence[float] = ()) -> Timing:
        """Times ``path`` interleaved with the FP32 reference. What is already known is not timed again: the
        reference's own ratio (1 by definition; its latency from the candidates timed before it) and a graph
        variant's FP32 model, timed beside its first candidate only (later rows reuse that ratio to FP32). ``known``: the
        reference latencies of the rows so far."""
        if is_reference(candidate) and known:
            self.counts["timing_skipped"] = self.counts.get("timing_skipped", 0) + 1
            reference_ms = statistics.median(known)
            return Timing(reference_ms, reference_ms, 1.0, None)
        paths = [self.reference]
        graph_reference = self.graph_references.get(candidate.graph) if candidate.graph != EXPORTED else None
        graph_ratio = self.graph_ratios.get(candidate.graph)
        if graph_reference is not None and graph_ratio is None:
            paths.append(graph_reference)
        if not is_reference(candidate):
            paths.append(path)
        self.counts["timed"] += 1
        bar = self.bar(candidate)
        timing = perf_counter()
        if self._timer_takes_bar and bar is not None:
            latencies = [float(v) for v in self.time_models(paths, bar=bar[0])]  # type: ignore[call-arg]
        else:
            latencies = [float(v) for v in self.time_models(paths)]
        self.timing_s += perf_counter() - timing
        self.models_timed += len(paths)
        if len(latencies) != len(paths) or not all(v > 0 for v in latencies):
            raise QuantizationError(f"time_models returned {latencies} for {len(paths)} models", hint="return one positive latency in ms per path, in order")
        ratio = latencies[-1] / latencies[0]
        if graph_reference is not None and graph_ratio is None:
            graph_ratio = self.graph_ratios[candidate.graph] = latencies[1] / latencies[0]
        return Timing(latencies[-1], latencies[0], ratio, ratio / graph_ratio if graph_ratio is not None else None)


    def retime_beside_reference(self, path: Path) -> float:
        """``path``'s latency ratio to the reference, timed beside it once more (a choice within the noise margin)."""
        started = perf_counter()
        latencies = [float(v) for v in self.time_models([self.reference, path])]
        self.timing_s += perf_counter() - started
        self.models_timed += 2
        self.counts["confirmation_timed"] = self.counts.get("confirmation_timed", 0) + 1
        if len(latencies) != 2 or not all(v > 0 for v in latencies):
            raise QuantizationError(f"time_models returned {latencies} for 2 models", hint="return one positive latency in ms per path, in order")
        return latencies[1] / latencies[0]


def is_reference(candidate: Candidate) -> bool:
    """The FP32 model every latency is a ratio to (the exported graph, unrewritten)."""
    return candidate.precision is Precision.FP32 and candidate.graph == EXPORTED


def takes_keyword(function: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
