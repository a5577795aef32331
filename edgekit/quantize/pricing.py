"""Pricing candidates for ``--precision auto``: the time budget of the search.

With ``time_budget_s``, a candidate reached after the budget is spent, or whose
expected cost would overrun it, is skipped (FP32, the reference, never is). The cost is expected by
kind: a static int8 plan that runs its own calibration (a graph variant's first, ONNX Runtime's default
plan) costs what the first candidate took; one that needs none (int8-dynamic, float, fp16, a ladder step
on its base's ranges) the median of those built so far; a ladder, which may first rank sensitivity,
twice that and at least what the first candidate took. With
``time_budget_multiple``, the budget is that multiple of the seconds spent up to the end of the first
candidate (static int8: pre-processing, calibration, writing, evaluation, timing), so the search scales
with the model's cost; an explicit ``time_budget_s`` is then an upper cap.

:class:`TimeBudget` learns what each kind of candidate costs as the search builds them (:meth:`TimeBudget.record`)
and says why a candidate or ladder is not tried for lack of time (:meth:`TimeBudget.over_budget`).

**One rule for every candidate, of either engine.** Each candidate's seconds are spent from the budget, and each is
priced by what its kind actually took: one that runs a calibration of its own (a static int8 plan's first pass on its
graph, ONNX Runtime's default plan when its ranges are not held, OpenVINO's NNCF int8, whose ``nncf.quantize`` calibrates
inside: :attr:`Candidate.calibrates_itself`) at the calibrating kind's price; one that does not (int8-dynamic, float,
a ladder step, OpenVINO's copy-and-compile candidates) at the median of those built so far, whichever engine built
them. Another engine's baselines (OpenVINO's bf16 and fp32, :attr:`Candidate.baseline`) are never skipped, like the
FP32 reference, but their seconds are spent too. So the search, run-off included (:meth:`TimeBudget.runoff_rounds`),
stays inside ``time_budget_multiple`` x a plain int8 build. Before, OpenVINO's compile-only candidates were added to the
budget and NNCF's spent from it (a per-engine flag): MiniLM's build ran 3.1x a plain int8 build on the corpus with
OpenVINO's three compiles added.
"""

from __future__ import annotations

import time
from typing import Any

from edgekit.precision import Precision
from edgekit.quantize.candidates import Candidate, CandidateLadder

#: Cost kinds for the time budget: a candidate that runs its own calibration, one that needs none, a ladder.
CALIBRATING, CHEAP, LADDER = "a calibrating candidate", "a candidate without calibration", "a ladder"


#: The largest share of the time budget kept back for the run-off (:meth:`TimeBudget.reserve_runoff`).
RUNOFF_SHARE = 0.25


class TimeBudget:
    """The search's time budget and what its candidates cost so far.

    ``build`` is the search's candidate builder (:class:`edgekit.quantize.candidates.CandidateBuilder`), read for
    ``has_ranges``, ``cached_calibration_s`` and ``auto_only_s`` when it has them. ``time_budget_s`` caps the seconds
    since ``started`` (a ``time.perf_counter()`` value, default: now); ``time_budget_multiple`` (see
    :meth:`plain_build_estimate`) sets the budget after the first candidate; ``fixed_s`` is what the build spent
    before the search; ``evaluation_batches`` how many batches an evaluation runs (prices a ladder's sensitivity runs)."""

    def __init__(self, build: Any, *, started: float | None = None, time_budget_s: float | None = None,
                 time_budget_multiple: float | None = None, fixed_s: float = 0.0, evaluation_batches: int | None = None) -> None:
        self.build = build
        self.started = time.perf_counter() if started is None else started
        self.time_budget_s = time_budget_s
        self.time_budget_cap_s = time_budget_s
        self.time_budget_multiple = time_budget_multiple
        self.fixed_s = fixed_s  # what the build spent before the search (a plain int8 build spends it too)
        self.evaluation_batches = evaluation_batches  # batches per evaluation (prices a ladder's sensitivity runs)
        self.costs: list[tuple[str, float]] = []  # (CALIBRATING | CHEAP, seconds) of each candidate built
        self.calibrated: set[tuple[str, Any]] = set()  # (graph, calibrator) of the static int8 plans built
        self.first_s: float | None = None  # seconds from the start of the search to the end of the first candidate
        #: first_s less the seconds spent timing it and the work a plain build does not do (``build.auto_only_s``: graph
        #: variants, ONNX Runtime's default plan's MinMax pass), plus the calibration it found in the cache
        #: (``build.cached_calibration_s``, what that took when it ran): what a plain int8 build's quantize and evaluate
        #: stages take.
        self.plain_s: float | None = None
        self.first_evaluate_s = 0.0  # the first candidate's evaluation: the build's evaluate stage repeats it for the chosen plan
        #: seconds kept back from the candidates for the run-off (:meth:`reserve_runoff`); the run-off itself spends them
        self.runoff_reserve_s = 0.0

    def over_budget(self, candidate: Candidate | None = None, ladder: CandidateLadder | bool = False) -> str | None:
        """Why the next candidate (or ladder) is not tried for lack of time (None: try it): the budget is spent,
        or its expected cost (:meth:`expected_cost`) would overrun it."""
        if self.time_budget_s is None:
            return None
        elapsed = self.elapsed()
        source = self.source()
        spendable = self.time_budget_s - self.runoff_reserve_s
        kept = f", {self.runoff_reserve_s:.1f} s of it kept for the run-off" if self.runoff_reserve_s else ""
        if elapsed >= spendable:
            return f"time budget spent ({elapsed:.1f} s of {self.time_budget_s:.1f} s{kept}: {source})"
        kind, expected = self.expected_cost(candidate, ladder=ladder)
        if elapsed + expected > spendable:
            return (f"time budget would overrun ({elapsed:.1f} s spent + about {expected:.1f} s expected for {kind} > "
                    f"{spendable:.1f} s{kept}: {source})")
        return None

    def reserve_runoff(self, model_s: float, rounds: int, finalists: int, evaluations: int = 1, share: float = RUNOFF_SHARE) -> None:
        """Keeps the run-off's price back from the candidates (:meth:`over_budget`): ``rounds`` rounds of ``finalists``
        and the FP32 reference at ``model_s`` a model (what a model took in the search's timing calls), plus
        ``evaluations`` of a run-off finalist not evaluated yet. A heavy model's run-off is priced with fewer
        finalists (down to two) when the full one is over ``share`` of the budget; when even two are, nothing is kept
        back (the run-off would not fit: :meth:`runoff_rounds` says so). Before, the run-off was paid only from what the
        candidates left, and was skipped for time on ConvNeXt, MiniLM and YOLOS in the corpus's OpenVINO section."""
        self.runoff_reserve_s = 0.0
        if self.time_budget_s is None:
            return
        for count in range(finalists, 1, -1):
            price = rounds * (count + 1) * model_s + evaluations * self.first_evaluate_s
            if price <= share * self.time_budget_s:
                self.runoff_reserve_s = price
                return

    def calibrates(self, candidate: Candidate | None) -> bool:
        """``candidate`` runs a calibration of its own: it quantizes itself (:attr:`Candidate.calibrates_itself`: OpenVINO's
        NNCF int8), or it is a static int8 plan whose graph and calibrator no earlier candidate calibrated (a graph
        variant's first static int8, ONNX Runtime's default plan). int8-dynamic, float and fp16 candidates need none; a
        ladder step reuses its base's ranges; nor does one whose ranges the builder already holds (``build.has_ranges``:
        ONNX Runtime's default plan, its MinMax ranges collected in the shared calibration's pass; OpenVINO's int8, the
        compile of ``int8-static``'s file)."""
        if candidate is None:
            return False
        if candidate.calibrates_itself:
            return True
        has_ranges = getattr(self.build, "has_ranges", None)
        return (candidate.precision is Precision.INT8 and candidate.plan is not None
                and (candidate.graph, candidate.plan.calibrator) not in self.calibrated
                and not (has_ranges is not None and has_ranges(candidate)))

    def expected_cost(self, candidate: Candidate | None, ladder: CandidateLadder | bool = False) -> tuple[str, float]:
        """What ``candidate`` is expected to cost, by kind: one that calibrates, what the first candidate took
        from the start of the search (static int8 with pre-processing: roughly a plain int8 build) or the
        costliest calibrating candidate, whichever is more (ONNX Runtime's default plan, with its own
        calibration, took 2.6-3.0 s on SegFormer where the cheap candidates took 0.3 s); any other (no
        calibration), the median of the cheap ones built so far, or the cheapest candidate built when none was.
        A ``ladder``'s steps reuse their base's calibration, but it may first rank sensitivity (a run per node
        group: ResNet's took 0.64 s where its first candidate took 1.04 s): twice a cheap candidate, at least
        what the first candidate took. A ladder that says how many model runs its ranking needs
        (``analysis_runs``) is priced at those runs, at the first evaluation's seconds per batch, plus one cheap step:
        YOLOv8n's ranking (57 groups) took 6.65-19.6 s and overran its 17.8-20.9 s budget by 1-13 s under the price above."""
        calibrating = [seconds for kind, seconds in self.costs if kind == CALIBRATING]
        cheap = sorted(seconds for kind, seconds in self.costs if kind == CHEAP)
        if candidate is not None and candidate.calibrates_itself:
            # its own calibration pass runs whatever the cache held: the first candidate's seconds plus the calibration
            # it found cached, at what that took (MobileNetV2's NNCF took 7.0-8.3 s where its cache-hit first candidate took 2.4 s)
            cached = float(getattr(self.build, "cached_calibration_s", 0.0))
            return CALIBRATING, max([*calibrating, (self.first_s or 0.0) + cached])
        if self.calibrates(candidate):
            return CALIBRATING, max([*calibrating, self.first_s or 0.0])
        expected = cheap[len(cheap) // 2] if cheap else min(calibrating, default=0.0)
        analysis = self.analysis_seconds(ladder) if isinstance(ladder, CandidateLadder) else None
        if analysis is not None:
            return LADDER, analysis + expected
        if ladder:
            return LADDER, max(2 * expected, self.first_s or 0.0)
        return CHEAP, expected

    def analysis_seconds(self, ladder: CandidateLadder) -> float | None:
        """What ``ladder``'s sensitivity ranking is expected to take: its ``analysis_runs`` (in evaluations of one batch)
        at the first evaluation's seconds per batch (``None``: unknown, the ladder or the search does not say)."""
        if ladder.analysis_runs is None or not self.evaluation_batches or not self.first_evaluate_s:
            return None
        return ladder.analysis_runs() * self.first_evaluate_s / self.evaluation_batches

    def elapsed(self) -> float:
        """Seconds since the search started: every candidate's, of either engine, is spent from the budget."""
        return time.perf_counter() - self.started

    def source(self) -> str:
        return self._source()

    def _source(self) -> str:
        if self.time_budget_multiple is not None and self.time_budget_s != self.time_budget_cap_s:
            return (f"{self.time_budget_multiple:g}x a plain int8 build's estimated {self.fixed_s + (self.plain_s or 0.0):.1f} s, "
                    f"less the {self.fixed_s:.1f} s before the search and {self.first_evaluate_s:.1f} s of evaluation after it")
        return f"quantization.auto_time_budget_s {self.time_budget_s:g} s"

    def plain_build_estimate(self) -> float:
        """What a plain int8 build spends up to the end of its evaluation: the pipeline's stages before the search
        (``fixed_s``) and the search's first candidate without its timing (pre-processing, calibration, writing and
        evaluating the plain static int8 plan: a plain int8 build's quantize and evaluate stages)."""
        return self.fixed_s + (self.plain_s or 0.0)

    def search_budget(self, multiple: float) -> float:
        """The seconds this search may take so that the build stays within ``multiple`` (M) x a plain int8 build:
        M x (fixed + plain) - fixed - the evaluation the build repeats for the chosen plan. The stages both
        builds pay after that (engine, golden check, bench, bundle and report: 0.7-3.7 s on the corpus) are left out,
        so the measured ratio comes out under M."""
        return multiple * self.plain_build_estimate() - self.fixed_s - self.first_evaluate_s

    def record(self, candidate: Candidate, status: str, seconds: float, *, first: bool, timing_s: float) -> None:
        """After each row of the search: what a built candidate cost, by kind (of either engine); after the ``first``,
        the budget (``timing_s``: the seconds spent timing so far, which a plain int8 build does not spend)."""
        if status != "skipped":
            self.costs.append((CALIBRATING if self.calibrates(candidate) else CHEAP, seconds))
            if candidate.plan is not None and candidate.precision is Precision.INT8:
                self.calibrated.add((candidate.graph, candidate.plan.calibrator))
        if first:
            self._set_from_first(timing_s)

    def runoff_rounds(self, finalists: int, evaluations: int, timing_s: float, models_timed: int, wanted: int, fewest: int) -> tuple[int, str]:
        """How many rounds of a run-off (:mod:`edgekit.quantize.runoff`) of ``finalists`` candidates the budget pays for,
        after ``evaluations`` evaluations of run-off finalists not evaluated yet (each at the first evaluation's
        seconds): a round times the finalists and the FP32 reference once, at the seconds a model took in the search's
        timing calls so far (``timing_s`` over ``models_timed``). ``wanted`` rounds at most; 0 with the reason when
        fewer than ``fewest`` fit."""
        per_model = timing_s / models_timed if models_timed else 0.0
        round_s = (finalists + 1) * per_model
        if self.time_budget_s is None:
            return wanted, ""
        left = self.time_budget_s - self.elapsed() - evaluations * self.first_evaluate_s
        fits = wanted if round_s <= 0 else min(wanted, int(max(left, 0.0) // round_s))
        if fits < fewest:
            return 0, (f"time budget: {max(left, 0.0):.1f} s left of {self.time_budget_s:.1f} s pays for {fits} of the {fewest} rounds "
                       f"a run-off needs (about {round_s:.2f} s a round of {finalists + 1} models{f' after {evaluations} evaluation(s)' if evaluations else ''}: "
                       f"{self.source()})")
        return fits, ""

    def _set_from_first(self, timing_s: float) -> None:
        """After the first candidate: the budget is :meth:`search_budget` (capped by ``auto_time_budget_s``)."""
        self.first_s = self.elapsed()
        self.plain_s = (self.first_s - timing_s + float(getattr(self.build, "cached_calibration_s", 0.0))
                        - float(getattr(self.build, "auto_only_s", 0.0)))
        if self.time_budget_multiple is None:
            return
        scaled = self.search_budget(self.time_budget_multiple)
        self.time_budget_s = scaled if self.time_budget_cap_s is None else min(scaled, self.time_budget_cap_s)
