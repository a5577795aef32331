"""``--precision auto``: the fastest plan the target supports that stays inside the accuracy budget.

Backend-neutral: the search takes three callables, so the pipeline plugs in its own engine.

* ``build(candidate) -> BuiltCandidate``: write the candidate's model (and say which ranges it used);
* ``evaluate(path) -> AccuracyLike``: the recipe metric and whether it is inside the budget;
* ``time_models(paths) -> latencies_ms``: latency of each file, measured *interleaved* in one call
  (each round runs every file once), so that drift on a shared machine hits them alike.

Candidates come in expected-speed order (:func:`auto_candidates`); ladders hold the k most sensitive
groups (sensitivity rank) in higher precision for k = 1..``auto_max_excluded``.

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
skipped with it. With ``time_budget_s``, a candidate reached after the budget is spent, or whose
expected cost would overrun it, is skipped (FP32, the reference, never is). The cost is expected by
kind: a static int8 plan that runs its own calibration (a graph variant's first, ONNX Runtime's default
plan) costs what the first candidate took; one that needs none (int8-dynamic, float, fp16, a ladder step
on its base's ranges) the median of those built so far; a ladder, which may first rank sensitivity,
twice that and at least what the first candidate took. With
``time_budget_multiple``, the budget is that multiple of the seconds spent up to the end of the first
candidate (static int8: pre-processing, calibration, writing, evaluation, timing), so the search scales
with the model's cost; an explicit ``time_budget_s`` is then an upper cap. The search ends when the list
is exhausted.

Only the FP32 reference (exported graph) may be chosen at 1.0x or slower: every other candidate,
including a float one on a rewritten graph, is chosen only when it is faster than FP32 on this host.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from edgekit.errors import EdgekitError, QuantizationError
from edgekit.precision import Precision
from edgekit.quantize.calibration.ranges import TensorRange
from edgekit.quantize.node_groups import NodeGroup
from edgekit.quantize.plan import QuantizationPlan
from edgekit.quantize.sensitivity import SensitivityReport

log = logging.getLogger(__name__)

#: Precision level of a node in a candidate, for dominance: higher = slower, more accurate.
STATIC, DYNAMIC, FLOAT = 0, 1, 2
EXPORTED = "exported"
#: Cost kinds for the time budget: a candidate that runs its own calibration, one that needs none, a ladder.
CALIBRATING, CHEAP, LADDER = "a calibrating candidate", "a candidate without calibration", "a ladder"


class AccuracyLike(Protocol):
    """What the search reads from an evaluation (``edgekit.evaluate.accuracy.AccuracyResult`` fits)."""

    value: float
    passed: bool
    cosine_min: float | None


@dataclass(frozen=True)
class BuiltCandidate:
    path: Path
    #: Calibrated activation ranges the model was written with (static plans), for the manifest.
    ranges: Mapping[str, TensorRange] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    name: str
    precision: Precision
    plan: QuantizationPlan | None  # None for fp32 / fp16
    #: Graph variant the plan applies to: "exported", or a rewrite such as "transformer-fusion".
    graph: str = EXPORTED
    #: Node -> why it runs in higher precision than the candidate's base scheme.
    kept: Mapping[str, str] = field(default_factory=dict)
    #: Node -> STATIC / DYNAMIC / FLOAT, over the scheme's quantizable nodes (empty: not comparable).
    levels: Mapping[str, int] = field(default_factory=dict)
    #: Why it is listed but not worth building (a static argument, e.g. a work bound): skipped with this reason.
    not_worth: str = ""

    @property
    def scheme(self) -> tuple[Any, ...] | None:
        if self.plan is None or not self.levels:
            return None
        return (self.graph, self.plan.activation_type, self.plan.per_channel, self.plan.calibrator)

    def dominates(self, other: Candidate) -> bool:
        """Runs every node at the same or a higher precision than ``other`` (so: not expected faster)."""
        if self.scheme is None or self.scheme != other.scheme:
            return False
        return all(self.levels.get(node, FLOAT) >= level for node, level in other.levels.items())


@dataclass(frozen=True)
class CandidateLadder:
    """Candidates for k = 1..n groups kept in higher precision; accuracy rises and speed falls with k.

    ``base`` is the candidate every step runs at the precision of or higher (static int8 of the scheme):
    the search tries the ladder only when ``base`` failed the budget. ``expand`` makes the steps on demand
    (it runs sensitivity analysis), so a ladder that is skipped costs nothing."""

    name: str
    steps: tuple[Candidate, ...] = ()
    base: Candidate | None = None
    expand: Callable[[], tuple[Candidate, ...]] | None = field(default=None, compare=False, repr=False)
    #: What the sensitivity ranking ``expand`` needs first, in evaluations of one batch ((groups + 2) x batches runs,
    #: times what one run costs against an evaluation), 0 once ranked; the time budget prices the ladder with it
    #: (``None``: priced without it, see :meth:`_Search.expected_cost`).
    analysis_runs: Callable[[], float] | None = field(default=None, compare=False, repr=False)

    def resolve(self) -> tuple[Candidate, ...]:
        return tuple(self.expand()) if self.expand is not None and not self.steps else self.steps


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

    @property
    def plan(self) -> QuantizationPlan | None:
        return self.chosen.plan

    def to_manifest(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.name,
            "precision": self.chosen.precision.value,
            "graph": self.chosen.graph,
            "plan": self.chosen.plan.to_manifest() if self.chosen.plan else None,
            "kept_in_higher_precision": dict(self.kept),
            "candidates": [row.to_manifest() for row in self.table],
            "calibration_ranges": {name: r.to_json() for name, r in self.ranges.items()},
            "sensitivity": self.sensitivity.to_manifest() if self.sensitivity else None,
            "rule": self.rule,
            "notes": list(self.notes),
            "stats": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.stats.items()},
        }


class AutoSearchError(QuantizationError):
    """No candidate of ``--precision auto`` meets the accuracy budget."""

    def __init__(self, message: str, *, hint: str | None = None, table: Sequence[CandidateResult] = (), best: CandidateResult | None = None) -> None:
        super().__init__(message, hint=hint)
        self.table = tuple(table)
        self.best = best


# ---------------------------------------------------------------- candidates


def kept_reason(entry_rank: int, metric: str, value: float, loss: float, precision: str) -> str:
    return f"sensitivity rank {entry_rank}: {metric} {value:.5g} when quantized (loss {loss:.3g}); runs in {precision}"


def auto_candidates(
    base_plan: QuantizationPlan,
    groups: Sequence[NodeGroup],
    sensitivity: SensitivityReport | Callable[[], SensitivityReport],
    supported: Sequence[Precision],
    *,
    max_kept: int,
    graph: str = EXPORTED,
    dynamic_only: Mapping[str, str] | None = None,
    dynamic_plan: QuantizationPlan | None = None,
    int4_plan: QuantizationPlan | None = None,
    include_fallbacks: bool = True,
) -> list[Candidate | CandidateLadder]:
    """Candidates for one graph variant, fastest expected first: static int8; int8-dynamic (cheap to try:
    no calibration; with VNNI it beat static int8 on YOLOS, 0.90x against 1.10x FP32); static int8 with
    the k most sensitive groups dynamic int8 (ONNX Runtime CPU only) or float; int8-dynamic with the k most
    sensitive of its MatMul/Gemm float; and, when
    ``include_fallbacks`` (once per search), int4 weight-only, fp16 and fp32 on the exported graph.

    ``base_plan`` is the static int8 plan; ``groups`` its node groups (as ranked in ``sensitivity``).
    ``sensitivity`` may be a callable that computes the report: the ladders are then lazy, and it runs
    only when the search tries one of them.
    ``dynamic_only`` maps nodes that run dynamic int8 in every candidate of this graph to their op type
    (fused ``Attention`` nodes, which ONNX Runtime quantizes only dynamically)."""
    prefix = "" if graph == EXPORTED else f"{graph}:"
    fused = dict(dynamic_only or {})
    nodes = [node for group in groups for node in group.nodes]
    weightless = {node for group in groups if group.weight_elements == 0 for node in group.nodes}
    can_dynamic = Precision.INT8_DYNAMIC in supported
    if fused and not can_dynamic:
        return []  # the graph variant needs dynamic int8 for its fused nodes
    extra_ops = tuple(dict.fromkeys(fused.values()))
    out: list[Candidate | CandidateLadder] = []
    if Precision.INT8 in supported:
        static_plan = replace(
            base_plan,
            op_types=tuple(dict.fromkeys([*base_plan.op_types, *extra_ops])),
            dynamic_nodes=tuple(dict.fromkeys([*base_plan.dynamic_nodes, *fused])),
        )
        base_levels = {node: STATIC for node in nodes}
        kept_base = {node: f"fused {op} node: ONNX Runtime quantizes it only dynamically (dynamic int8)" for node, op in fused.items()}
        static = Candidate(f"{prefix}int8-static", Precision.INT8, static_plan, graph, kept_base, base_levels)
        out.append(static)
    dynamic: Candidate | None = None
    if can_dynamic and dynamic_plan is not None:  # before the ladders: no calibration, no sensitivity run
        plan = replace(dynamic_plan, op_types=tuple(dict.fromkeys([*dynamic_plan.op_types, *extra_ops])))
        levels = {node: FLOAT if node in weightless else DYNAMIC for node in nodes}
        dynamic = Candidate(f"{prefix}int8-dynamic", Precision.INT8_DYNAMIC, plan, graph, {}, levels)
        out.append(dynamic)
    if Precision.INT8 in supported:

        def ladder_steps(kind: str) -> tuple[Candidate, ...]:
            report = sensitivity() if callable(sensitivity) else sensitivity
            ranked = [entry for entry in report.groups if all(node in nodes for node in entry.nodes)]
            return tuple(_kept_top(static_plan, ranked[:k], kind, weightless, report.metric, kept_base, base_levels, f"{prefix}int8-static+{kind}-top{k}", graph)
                         for k in range(1, max(0, min(max_kept, len(ranked))) + 1))

        for kind in ("dynamic", "float") if can_dynamic else ("float",):
            name = f"{prefix}int8-static+{kind}"
            if callable(sensitivity):
                if max_kept > 0:
                    out.append(CandidateLadder(name, base=static, expand=lambda kind=kind: ladder_steps(kind)))  # type: ignore[misc]
            elif steps := ladder_steps(kind):
                out.append(CandidateLadder(name, steps, base=static))
    if dynamic is not None and dynamic.plan is not None and max_kept > 0 and any(g.weight_elements and set(g.op_types) <= set(dynamic.plan.op_types) for g in groups):
        # int8-dynamic with the k most sensitive of the MatMul/Gemm it quantizes float: wav2vec2's int8-dynamic
        # kept 0.75 of the CTC lines (budget 0.8); with its feature projection and CTC head float, 0.98 at 0.92x FP32
        dynamic_ops = set(dynamic.plan.op_types)
        quantized = {node for group in groups if group.weight_elements and set(group.op_types) <= dynamic_ops for node in group.nodes}
        base_dynamic = dynamic

        def dynamic_steps() -> tuple[Candidate, ...]:
            report = sensitivity() if callable(sensitivity) else sensitivity
            ranked = [entry for entry in report.groups if entry.nodes and all(node in quantized for node in entry.nodes)]
            return tuple(_float_top(base_dynamic, ranked[:k], report.metric, f"{prefix}int8-dynamic+float-top{k}")
                         for k in range(1, min(max_kept, len(ranked)) + 1))

        name = f"{prefix}int8-dynamic+float"
        if callable(sensitivity):
            out.append(CandidateLadder(name, base=dynamic, expand=dynamic_steps))
        elif steps := dynamic_steps():
            out.append(CandidateLadder(name, steps, base=dynamic))
    if include_fallbacks:
        out += fallback_candidates(supported, int4_plan)
    return out


def fallback_candidates(supported: Sequence[Precision], int4_plan: QuantizationPlan | None = None) -> list[Candidate]:
    """The slow end of the list, on the exported graph: int4 weight-only, fp16, fp32 (always last)."""
    out = []
    if Precision.INT4 in supported and int4_plan is not None:
        out.append(Candidate("int4", Precision.INT4, int4_plan, EXPORTED))
    if Precision.FP16 in supported:
        out.append(Candidate("fp16", Precision.FP16, None, EXPORTED))
    out.append(Candidate("fp32", Precision.FP32, None, EXPORTED))
    return out


def _kept_top(static_plan: QuantizationPlan, entries: Sequence[Any], kind: str, weightless: set[str], metric: str,
              kept_base: Mapping[str, str], base_levels: Mapping[str, int], name: str, graph: str) -> Candidate:
    kept, levels = dict(kept_base), dict(base_levels)
    dynamic, excluded = list(static_plan.dynamic_nodes), dict(static_plan.excluded)
    for entry in entries:
        for node in entry.nodes:
            as_float = kind == "float" or node in weightless  # dynamic int8 needs a constant weight input
            reason = kept_reason(entry.rank, metric, entry.value, entry.loss, "float" if as_float else "dynamic int8")
            kept[node] = reason
            levels[node] = FLOAT if as_float else DYNAMIC
            if as_float:
                excluded[node] = reason
            else:
                dynamic.append(node)
    plan = replace(static_plan, excluded=excluded, dynamic_nodes=tuple(dict.fromkeys(dynamic)))
    return Candidate(name, Precision.INT8, plan, graph, kept, levels)


def _float_top(dynamic: Candidate, entries: Sequence[Any], metric: str, name: str) -> Candidate:
    """``dynamic`` (an int8-dynamic candidate) with the nodes of ``entries`` (sensitivity ranking) float."""
    assert dynamic.plan is not None
    kept, levels, excluded = dict(dynamic.kept), dict(dynamic.levels), dict(dynamic.plan.excluded)
    for entry in entries:
        for node in entry.nodes:
            kept[node] = excluded[node] = kept_reason(entry.rank, metric, entry.value, entry.loss, "float")
            levels[node] = FLOAT
    return Candidate(name, Precision.INT8_DYNAMIC, replace(dynamic.plan, excluded=excluded), dynamic.graph, kept, levels)


# ---------------------------------------------------------------- the search

BuildFn = Callable[[Candidate], BuiltCandidate]
EvaluateFn = Callable[[Path], AccuracyLike]
TimeFn = Callable[[Sequence[Path]], Sequence[float]]


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
    ``time_budget_multiple`` (see :meth:`_Search.plain_build_estimate`) caps the search so that the whole build
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
    search = _Search(build, evaluate, time_models, Path(reference), dict(graph_references or {}), noise_margin, time_failed)
    search.higher_is_better = higher_is_better
    search.started = time.perf_counter() if started is None else started
    search.time_budget_s = time_budget_s
    search.time_budget_cap_s = time_budget_s
    search.time_budget_multiple = time_budget_multiple
    search.fixed_s = fixed_s
    search.evaluation_batches = evaluation_batches
    for item in candidates:
        if isinstance(item, CandidateLadder):
            search.ladder(item)
        else:
            search.process(item)
    search.confirm_faster_than_fp32(next((item for item in candidates if isinstance(item, Candidate) and is_reference(item)), None))
    if search.best is None:
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
    chosen, built = search.best
    rows = tuple(replace(row, status="chosen") if row.name == chosen.name and row.status == "passed" else row for row in search.rows)
    chosen_row = next(row for row in rows if row.status == "chosen")
    log.info("--precision auto chose %s (%.3fx FP32, %s %.6g)", chosen.name, chosen_row.latency_ratio or float("nan"), metric_name, chosen_row.value or float("nan"))
    stats = {**search.counts, "skipped": sum(row.status == "skipped" for row in rows), "seconds": round(time.perf_counter() - search.started, 2)}
    stats["timing_seconds"] = round(search.timing_s, 2)
    if search.time_budget_s is not None:
        stats["time_budget_s"] = round(search.time_budget_s, 2)
    if search.plain_s is not None:
        stats["plain_int8_estimate_s"] = round(search.fixed_s + search.plain_s, 2)
    return AutoResult(chosen, chosen_row, built.path, rows, dict(chosen.kept), dict(built.ranges), sensitivity,
                      rule=f"dominance floor + interleaved timing, noise margin {noise_margin:.0%}", notes=tuple(notes), stats=stats)


class _Search:
    def __init__(self, build: BuildFn, evaluate: EvaluateFn, time_models: TimeFn, reference: Path,
                 graph_references: dict[str, Path], noise_margin: float, time_failed: bool) -> None:
        self.build, self.evaluate, self.time_models = build, evaluate, time_models
        self.reference, self.graph_references = reference, graph_references
        self.margin, self.time_failed = noise_margin, time_failed
        self.rows: list[CandidateResult] = []
        self.measured: list[tuple[Candidate, float]] = []
        self.best: tuple[Candidate, BuiltCandidate] | None = None
        self.best_ratio = float("inf")
        self.started = time.perf_counter()
        self.time_budget_s: float | None = None
        self.time_budget_cap_s: float | None = None
        self.time_budget_multiple: float | None = None
        self.counts = {"built": 0, "evaluated": 0, "timed": 0}
        self.costs: list[tuple[str, float]] = []  # (CALIBRATING | CHEAP, seconds) of each candidate built
        self.calibrated: set[tuple[str, Any]] = set()  # (graph, calibrator) of the static int8 plans built
        self.first_s: float | None = None  # seconds from the start of the search to the end of the first candidate
        #: first_s less the seconds spent timing it and the work a plain build does not do (``build.auto_only_s``: graph
        #: variants, ONNX Runtime's default plan's MinMax pass), plus the calibration it found in the cache
        #: (``build.cached_calibration_s``, what that took when it ran): what a plain int8 build's quantize and evaluate
        #: stages take.
        self.plain_s: float | None = None
        self.first_evaluate_s = 0.0  # the first candidate's evaluation: the build's evaluate stage repeats it for the chosen plan
        self.fixed_s = 0.0  # what the build spent before the search (a plain int8 build spends it too)
        self.timing_s = 0.0  # seconds spent inside time_models
        self.graph_ratios: dict[str, float] = {}  # graph variant -> its FP32 model's latency ratio to the reference
        self.higher_is_better = True
        self.evaluation_batches: int | None = None  # batches per evaluation (prices a ladder's sensitivity runs)
        self._timer_takes_bar = _takes_keyword(time_models, "bar")

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

    def _over_budget(self, candidate: Candidate | None = None, ladder: CandidateLadder | bool = False) -> str | None:
        """Why the next candidate (or ladder) is not tried for lack of time (None: try it): the budget is spent,
        or its expected cost (:meth:`expected_cost`) would overrun it."""
        if self.time_budget_s is None:
            return None
        elapsed = time.perf_counter() - self.started
        source = self._budget_source()
        if elapsed >= self.time_budget_s:
            return f"time budget spent ({elapsed:.1f} s of {self.time_budget_s:.1f} s: {source})"
        kind, expected = self.expected_cost(candidate, ladder=ladder)
        if elapsed + expected > self.time_budget_s:
            return (f"time budget would overrun ({elapsed:.1f} s spent + about {expected:.1f} s expected for {kind} > "
                    f"{self.time_budget_s:.1f} s: {source})")
        return None

    def calibrates(self, candidate: Candidate | None) -> bool:
        """``candidate`` is a static int8 plan whose graph and calibrator no earlier candidate calibrated: it
        pays for its own calibration (a graph variant's first static int8, ONNX Runtime's default plan).
        int8-dynamic, float and fp16 candidates need none; a ladder step reuses its base's ranges; nor does one
        whose ranges the builder already holds (``build.has_ranges``: ONNX Runtime's default plan, its MinMax
        ranges collected in the shared calibration's pass)."""
        has_ranges = getattr(self.build, "has_ranges", None)
        return (candidate is not None and candidate.precision is Precision.INT8 and candidate.plan is not None
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

    def _budget_source(self) -> str:
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

    def _set_budget_from_first(self) -> None:
        """After the first candidate: the budget is :meth:`search_budget` (capped by ``auto_time_budget_s``)."""
        if len(self.rows) != 1:
            return
        self.first_s = time.perf_counter() - self.started
        self.plain_s = (self.first_s - self.timing_s + float(getattr(self.build, "cached_calibration_s", 0.0))
                        - float(getattr(self.build, "auto_only_s", 0.0)))
        if self.time_budget_multiple is None:
            return
        scaled = self.search_budget(self.time_budget_multiple)
        self.time_budget_s = scaled if self.time_budget_cap_s is None else min(scaled, self.time_budget_cap_s)

    def _to_beat(self) -> float:
        """The latency ratio a candidate must get under to displace the best so far: the best's ratio less the noise
        margin once the best is clearly faster than FP32 (under ``1 - margin``). While the best is within the noise of
        FP32 it has proved no speed-up, so its own ratio, without the margin, is the bar: wav2vec2's rewritten FP32 timed
        0.967x in the search (1.00x re-timed on a quiet host) and, with the margin, pruned int8-dynamic at 0.94x and the
        plan that keeps its edge layers float (0.93x FP32, inside the budget)."""
        if self.best_ratio < 1 - self.margin:
            return self.best_ratio * (1 - self.margin)
        return self.best_ratio

    def _bar(self, candidate: Candidate) -> tuple[float, str] | None:
        """The latency ratio ``candidate`` must get under to matter, and what sets it."""
        if self.best is not None:
            return self._to_beat(), f"{self.best[0].name} ({self.best_ratio:.3f}x)"
        if not is_reference(candidate):
            return 1.0, "FP32 (1.000x): a plan other than the FP32 reference is chosen only when it is faster than FP32"
        return None

    def _ladder_skip(self, ladder: CandidateLadder) -> str | None:
        """Why ``ladder`` need not be tried (None: try it)."""
        base = ladder.base
        over = self._over_budget(ladder=ladder)
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
        bar = self._bar(base)
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
        floor = self._floor(candidate)
        bar = self._bar(candidate)
        over = self._over_budget(candidate) if not is_reference(candidate) else None
        if over is not None:
            return self._row(_result(candidate, "skipped", detail=over), started, candidate)
        if self.best is not None and floor is not None and floor[0] >= self._to_beat():
            why = "is the reference (1.000x)" if candidate.precision is Precision.FP32 else f"runs every node at the precision of {floor[1]} ({floor[0]:.3f}x) or higher"
            return self._row(_result(candidate, "skipped", detail=f"{why}: cannot beat {self.best[0].name} ({self.best_ratio:.3f}x)"), started, candidate)
        if self.best is None and bar is not None and floor is not None and floor[0] >= bar[0]:
            why = f"runs every node at the precision of {floor[1]} ({floor[0]:.3f}x) or higher"
            return self._row(_result(candidate, "skipped", detail=f"{why}: cannot beat {bar[1]}"), started, candidate)
        if candidate.not_worth:
            return self._row(_result(candidate, "skipped", detail=candidate.not_worth), started, candidate)
        try:
            self.counts["built"] += 1
            built = self.build(candidate)
        except EdgekitError as exc:
            return self._row(_result(candidate, "error", detail=f"build failed: {exc.message}"), started, candidate)
        timing: Timing | None = None
        if self.best is not None:
            timing = self._time(candidate, built.path)
            if timing.latency_ratio >= self._to_beat():
                by = f" by more than {self.margin:.0%}" if self._to_beat() < self.best_ratio else ""
                detail = f"not faster than {self.best[0].name} ({self.best_ratio:.3f}x){by}; not evaluated"
                return self._row(_result(candidate, "slower", timing, detail=detail), started, candidate)
        try:
            self.counts["evaluated"] += 1
            evaluating = time.perf_counter()
            accuracy = self.evaluate(built.path)
            if not self.rows:
                self.first_evaluate_s = time.perf_counter() - evaluating
        except EdgekitError as exc:
            return self._row(_result(candidate, "error", timing, detail=f"evaluation failed: {exc.message}"), started, candidate)
        passed = bool(accuracy.passed)
        if timing is None and (passed or (self.time_failed if time_failed is None else time_failed)):
            timing = self._time(candidate, built.path)
        row = _result(candidate, "passed" if passed else "failed", timing, value=float(accuracy.value),
                      cosine_min=getattr(accuracy, "cosine_min", None), passed=passed)
        if passed and timing is not None and not is_reference(candidate) and timing.latency_ratio >= 1.0:
            # Inside the budget but no faster than FP32 on this host: never chosen over FP32 (PP-OCR's classifier
            # got an int8 plan at 1.3x FP32 that way), and it sets no bar that would skip FP32 itself.
            what = "a quantized plan" if candidate.precision is not Precision.FP32 else "a rewritten float graph"
            return self._row(replace(row, status="slower", detail=f"inside the budget, but {timing.latency_ratio:.3f}x FP32 on this host: "
                                     f"{what} is chosen only when it is faster than FP32"), started, candidate)
        if passed and timing is not None and timing.latency_ratio < self.best_ratio:
            self.best, self.best_ratio = (candidate, built), timing.latency_ratio
        return self._row(row, started, candidate)

    def confirm_faster_than_fp32(self, reference: Candidate | None) -> None:
        """A choice within the noise margin of FP32 (over ``1 - margin`` x FP32) is timed beside FP32 once more and
        stays chosen only when faster again; otherwise ``reference`` (FP32) is tried and chosen. One interleaved call
        is not enough that close: on the shared 2-core host, a file timed beside an identical copy came out
        0.80-1.58x (25 calls each at 0.05, 0.15 and 0.4 s per model), so a candidate at 0.99x is within noise."""
        if self.best is None or reference is None or is_reference(self.best[0]) or self.best_ratio < 1 - self.margin:
            return
        candidate, built = self.best
        index = max(i for i, row in enumerate(self.rows) if row.name == candidate.name)
        started = time.perf_counter()
        latencies = [float(v) for v in self.time_models([self.reference, built.path])]
        self.timing_s += time.perf_counter() - started
        self.counts["confirmation_timed"] = self.counts.get("confirmation_timed", 0) + 1
        if len(latencies) != 2 or not all(v > 0 for v in latencies):
            raise QuantizationError(f"time_models returned {latencies} for 2 models", hint="return one positive latency in ms per path, in order")
        row, ratio = self.rows[index], latencies[1] / latencies[0]
        seen = f"{row.latency_ratio:.3f}x FP32, within the {self.margin:.0%} noise margin; re-timed beside FP32: {ratio:.3f}x"
        if ratio < 1.0:
            self.rows[index] = replace(row, detail=(f"{row.detail}; " if row.detail else "") + f"{seen}, faster again")
            return
        self.rows[index] = replace(row, status="slower", detail=f"{seen}: not faster than FP32 twice, so not chosen over it")
        self.best, self.best_ratio = None, float("inf")
        self.rows = [r for r in self.rows if not (r.name == reference.name and r.status == "skipped")]
        self.process(reference)

    def _row(self, row: CandidateResult, started: float, candidate: Candidate) -> str:
        row = replace(row, seconds=round(time.perf_counter() - started, 2))
        self.rows.append(row)
        if row.status != "skipped":
            self.costs.append((CALIBRATING if self.calibrates(candidate) else CHEAP, row.seconds))
            if candidate.plan is not None and candidate.precision is Precision.INT8:
                self.calibrated.add((candidate.graph, candidate.plan.calibrator))
        self._set_budget_from_first()
        if row.latency_ratio is not None:
            self.measured.append((candidate, row.latency_ratio))
        log.info("auto candidate %s: %s%s", row.name, row.status, f" ({row.latency_ratio:.3f}x FP32)" if row.latency_ratio is not None else "")
        return row.status

    def _floor(self, candidate: Candidate) -> tuple[float, str] | None:
        """The lowest latency ratio ``candidate`` can plausibly reach, from the candidates it dominates."""
        if is_reference(candidate):
            return (1.0, "the FP32 reference")  # measured by definition; it wins when everything else is slower
        floors = [(ratio, other.name) for other, ratio in self.measured if candidate.dominates(other)]
        return max(floors) if floors else None

    def _time(self, candidate: Candidate, path: Path) -> Timing:
        """Times ``path`` interleaved with the FP32 reference. What is already known is not timed again: the
        reference's own ratio (1 by definition; its latency from the candidates timed before it) and a graph
        variant's FP32 model, timed beside its first candidate only (later rows reuse that ratio to FP32)."""
        known = [row.reference_latency_ms for row in self.rows if row.reference_latency_ms is not None]
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
        bar = self._bar(candidate)
        timing = time.perf_counter()
        if self._timer_takes_bar and bar is not None:
            latencies = [float(v) for v in self.time_models(paths, bar=bar[0])]  # type: ignore[call-arg]
        else:
            latencies = [float(v) for v in self.time_models(paths)]
        self.timing_s += time.perf_counter() - timing
        if len(latencies) != len(paths) or not all(v > 0 for v in latencies):
            raise QuantizationError(f"time_models returned {latencies} for {len(paths)} models", hint="return one positive latency in ms per path, in order")
        ratio = latencies[-1] / latencies[0]
        if graph_reference is not None and graph_ratio is None:
            graph_ratio = self.graph_ratios[candidate.graph] = latencies[1] / latencies[0]
        return Timing(latencies[-1], latencies[0], ratio, ratio / graph_ratio if graph_ratio is not None else None)


def is_reference(candidate: Candidate) -> bool:
    """The FP32 model every latency is a ratio to (the exported graph, unrewritten)."""
    return candidate.precision is Precision.FP32 and candidate.graph == EXPORTED


def _takes_keyword(function: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


@dataclass(frozen=True)
class Timing:
    latency_ms: float
    reference_latency_ms: float
    latency_ratio: float
    latency_ratio_same_graph_fp32: float | None


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
