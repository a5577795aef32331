"""Candidate plans for ``--precision auto``, as data: a name, what it quantizes (a precision per node) and why
(the nodes it keeps in higher precision, each with its reason).

A :class:`Candidate` is one plan on one graph variant; a :class:`CandidateLadder` is the k = 1..n steps of a plan
that keeps its k most sensitive node groups in higher precision. :func:`auto_candidates` lists the backend-neutral
candidates of one graph variant, fastest expected first; :func:`fallback_candidates` the slow end of the list.
A backend adds its own candidates to the list it hands the search (the ONNX Runtime ones:
:mod:`edgekit.quantize.ort.candidates`) and builds each one with its own :class:`CandidateBuilder`; the search
(:mod:`edgekit.quantize.auto`) reads only what is here.

**Dominance.** A candidate *dominates* another when both share a scheme (graph variant, activation type,
per-channel, calibrator) and it runs every node at the same or a higher precision (static int8 < dynamic
int8 < float): it is not expected to be faster (:meth:`Candidate.dominates`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from edgekit.precision import Precision
from edgekit.quantize.calibration.ranges import TensorRange
from edgekit.quantize.node_groups import NodeGroup
from edgekit.quantize.plan import QuantizationPlan
from edgekit.quantize.sensitivity import SensitivityReport

#: Precision level of a node in a candidate, for dominance: higher = slower, more accurate.
STATIC, DYNAMIC, FLOAT = 0, 1, 2
EXPORTED = "exported"


@dataclass(frozen=True)
class BuiltCandidate:
    path: Path
    #: Calibrated activation ranges the model was written with (static plans), for the manifest.
    ranges: Mapping[str, TensorRange] = field(default_factory=dict)
    #: The plan as written, when the writer changed the candidate's (nodes ONNX Runtime's quantizer failed on, kept
    #: float with the reason in ``excluded``); None: written as the candidate's own plan.
    plan: QuantizationPlan | None = None


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
    #: The engine that runs it when not the search's own (``"openvino"`` on a target that allows both): the chosen
    #: candidate's engine becomes the bundle's backend. Empty: the search's engine (ONNX Runtime).
    engine: str = ""
    #: Another engine's own FP32-like baseline (OpenVINO's fp32 and bf16: a copy and a compile, no calibration): like the
    #: FP32 reference, never skipped for the time budget, or the search would not have compared the engines at all.
    baseline: bool = False
    #: It is quantized by its engine, calibration and all (OpenVINO's NNCF int8: ``nncf.quantize`` runs its own pass): the
    #: time budget prices it as a calibrating candidate (:meth:`edgekit.quantize.pricing.TimeBudget.calibrates`).
    calibrates_itself: bool = False

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
    #: (``None``: priced without it, see :meth:`edgekit.quantize.pricing.TimeBudget.expected_cost`).
    analysis_runs: Callable[[], float] | None = field(default=None, compare=False, repr=False)

    def resolve(self) -> tuple[Candidate, ...]:
        return tuple(self.expand()) if self.expand is not None and not self.steps else self.steps


class CandidateBuilder(Protocol):
    """Writes a candidate's model (``build`` in :func:`edgekit.quantize.auto.search_auto`). A builder may also
    have, for the time budget (:class:`edgekit.quantize.pricing.TimeBudget`): ``has_ranges(candidate) -> bool``
    (the candidate needs no calibration pass of its own), ``cached_calibration_s`` (what the calibrations it
    found in the cache took when they ran) and ``auto_only_s`` (seconds of work a plain int8 build does not do)."""

    def __call__(self, candidate: Candidate) -> BuiltCandidate: ...


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
