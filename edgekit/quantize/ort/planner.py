"""``--precision auto`` on ONNX Runtime (host CPU), end to end: :func:`plan_auto_onnxruntime` lists the candidates
of each graph variant (:mod:`edgekit.quantize.candidates` and ONNX Runtime's own, :mod:`edgekit.quantize.ort.candidates`),
prices the sensitivity ranking its ladders need, and runs :func:`edgekit.quantize.auto.search_auto` with the ONNX
Runtime builder (:mod:`edgekit.quantize.ort.builder`) and the evaluate and timing callables it is given
(:mod:`edgekit.quantize.ort.judges`).

Graph variants: ``exported`` (the FP32 export after ONNX Runtime's quantization pre-processing) and
``transformer-fusion``: ONNX Runtime's transformer optimizer (``model_type="bert"``), which fuses
attention into one ``Attention`` op, bias+GELU into ``BiasGelu`` and residual+LayerNorm into
``SkipLayerNormalization``. Fused graphs use ONNX Runtime contrib ops, so the variant is for ONNX
Runtime CPU targets only; ``Attention`` is quantized dynamically (``QAttention``), its MatMuls statically.

Two more candidates, each on its own graph: ``fp32-rewritten`` (graph ``float-rewrites``) is the FP32
model after pre-processing and edgekit's exact float rewrites (:mod:`edgekit.quantize.cnn_folding`: affine
folds, the HardSwish expansion), which alone can beat the original FP32 (PP-OCR's classifier: 0.76x)
when int8 loses; ``int8-ort-default`` (graph ``ort-default``) is what ONNX Runtime's own
``quantize_static`` writes with its defaults (QDQ, per-channel int8 weights, uint8 activations, MinMax,
every op type it quantizes) on the pre-processed graph, so that where ONNX Runtime's plain recipe is the
faster one on this instruction set, ``auto`` finds it too and the manifest says which plan won.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.precision import Backend, Precision
from edgekit.quantize import channel_spread
from edgekit.quantize.auto import AutoResult, search_auto
from edgekit.quantize.calibration import CalibrationCache, CalibratorSpec
from edgekit.quantize.calibration.from_recipe import calibrator_spec
from edgekit.quantize.candidates import EXPORTED, Candidate, CandidateLadder, auto_candidates, fallback_candidates
from edgekit.quantize.judging import EvaluateFn, TimeFn
from edgekit.quantize.node_groups import find_node_groups
from edgekit.quantize.ort import static_plan
from edgekit.quantize.ort.builder import OrtCandidateBuilder
from edgekit.quantize.ort.candidates import (
    FP32_REWRITTEN,
    INT8_ORT_DEFAULT,
    MATMUL_WORK_FLOOR,
    TRANSFORMER_FUSION,
    bounded,
    fused_dynamic_nodes,
    matmul_work_share,
    priced,
    with_edge_candidates,
    with_plain_candidates,
    with_thin_conv_candidates,
)
from edgekit.quantize.ort.judges import MetricSpec
from edgekit.quantize.plan import QuantizationPlan, make_plan
from edgekit.quantize.sensitivity import QUANTIZED_INPUTS, QuantizationSimulator, SensitivityReport, rank_groups
from edgekit.recipe import QuantizationSpec
from edgekit.target import TargetProfile

log = logging.getLogger(__name__)

#: ``--precision auto`` keeps the whole build within this multiple of a plain int8 build, estimated as the
#: pipeline's stages before the search plus the search's first candidate (the plain static int8 plan) built and
#: evaluated, its timing left out (:meth:`edgekit.quantize.pricing.TimeBudget.search_budget`). 2.5, not the 3x that
#: issue 17 allows: the estimate is off by the host's noise (shared 2-core host: the same build 1.3x apart).
AUTO_TIME_BUDGET_MULTIPLE = 2.5
#: Sensitivity analysis runs the switch model once per group (plus two) on each batch; past this many
#: batch-runs it uses fewer batches (at least one): PP-OCR's detector, 62 groups x 4 batches, took 105 s.
SENSITIVITY_RUN_BATCHES = 128


def auto_base_plan(spec: QuantizationSpec, target: TargetProfile, backend: Backend, model_path: Path) -> QuantizationPlan:
    """The static int8 plan the search starts from: the same graph-aware plan ``--precision int8`` builds
    (:func:`static_plan.static_int8_plan`)."""
    return static_plan.static_int8_plan(make_plan(spec, target, backend, Precision.INT8), model_path)


def auto_calibrators(spec: QuantizationSpec, plan: QuantizationPlan) -> dict[str, CalibratorSpec]:
    """Calibrators ``--precision auto`` compares: only the recipe's when it names one explicitly,
    otherwise the default (percentile) and minmax. Entropy is not tried by default: it calibrates
    slowest and clipped MiniLM's outlier channels as badly as percentile."""
    names = [spec.calibrator] if "calibrator" in spec.model_fields_set else list(dict.fromkeys([spec.calibrator, "minmax"]))
    return {name: calibrator_spec(spec.model_copy(update={"calibrator": name}), plan) for name in names}


def plan_auto_onnxruntime(
    fp32_path: Path,
    work_dir: Path,
    *,
    spec: QuantizationSpec,
    target: TargetProfile,
    backend: Backend,
    supported: Sequence[Precision],
    calibration_batches: Sequence[Mapping[str, np.ndarray]],
    evaluation_batches: Sequence[Mapping[str, np.ndarray]],
    metric: MetricSpec,
    evaluate: EvaluateFn,
    time_models: TimeFn,
    calibrators: Mapping[str, CalibratorSpec] | None = None,
    cache: CalibrationCache | None = None,
    graphs: Sequence[str] = (TRANSFORMER_FUSION, EXPORTED),
    sensitivity_batches: int = 4,
    noise_margin: float = 0.05,
    budget_text: str = "the recipe's evaluation.budget",
    threads: int | None = None,
    time_budget_s: float | None = None,
    bench_feeds: Mapping[str, np.ndarray] | None = None,
    time_budget_multiple: float | None = AUTO_TIME_BUDGET_MULTIPLE,
    fixed_s: float = 0.0,
    engines: Any = None,
) -> AutoResult:
    """End to end on ONNX Runtime: list candidates for each graph variant that applies (fused variants
    first: expected faster), and run :func:`search_auto` with ``evaluate`` and ``time_models``.
    ``supported`` is :func:`gating.supported_precisions` for the target.

    Decisive: one calibrator (the recipe's, as ``--precision int8`` uses; ONNX Runtime's plain MinMax
    recipe is its own candidate, ``int8-ort-default``), one calibration per graph variant for every
    candidate, and one sensitivity ranking (on the exported graph) for every ladder, run only when a
    ladder is tried, i.e. when static int8 fails the budget while faster than the bar. The float-rewrite
    FP32 candidate comes right after static int8, ONNX Runtime's default plan after int8-dynamic, so that their latency
    prunes what follows. int8-dynamic and int4 touch only MatMul/Gemm: when those do under
    ``MATMUL_WORK_FLOOR`` of the graph's work (at ``bench_feeds``' shapes), they are skipped.
    ``time_budget_multiple``: the build stays within that multiple of a plain int8 build (estimated from
    ``fixed_s``, the seconds the build spent before this call, and the first candidate, the plain static int8
    plan, built and evaluated); ``time_budget_s`` caps the whole call. ``engines``: another engine's side of the search
    on a target that allows it (:class:`edgekit.quantize.ov.auto.OpenVinoAuto`): its candidates join the list and its
    builder wraps this one; ``None`` (one engine) leaves the search as it is."""
    started = time.perf_counter()
    exported_plan = make_plan(spec, target, backend, Precision.INT8)
    calibrators = dict(calibrators or auto_calibrators(spec, exported_plan))
    builder = OrtCandidateBuilder(fp32_path, work_dir, calibration_batches, calibrators, cache)
    builder.collect_ort_default = True
    exported = builder.graph_model(EXPORTED) or Path(fp32_path)
    base = replace(auto_base_plan(spec, target, backend, exported), calibrator=next(iter(calibrators)))
    base = channel_spread.keep_wide_spread_convs_float(exported, base, calibration_batches)
    notes: tuple[str, ...] = (f"calibrator {base.calibrator} (one calibration shared by every candidate of a graph)",)
    ranked: list[SensitivityReport] = []

    def sensitivity() -> SensitivityReport:  # once, on demand, for every ladder of every graph variant
        if not ranked:
            simulator = QuantizationSimulator(exported, base, builder.ranges(EXPORTED, base), evaluation_batches, output=metric.output,
                                              label_key=metric.label_key, max_batches=sensitivity_batches, threads=threads)
            simulator.use_batches(max(1, min(simulator.batches, SENSITIVITY_RUN_BATCHES // (len(simulator.groups) + 2))))
            ranked.append(rank_groups(simulator, metric.metric, metric_name=metric.name, higher_is_better=metric.higher_is_better))
        return ranked[0]

    group_counts: list[int] = []

    def analysis_runs() -> float:  # what sensitivity() takes, in evaluation batches' worth: 0 once it ran
        if ranked:
            return 0
        if not group_counts:
            static_types = tuple(op for op in base.op_types if op in QUANTIZED_INPUTS)
            group_counts.append(len(find_node_groups(exported, static_types, exclude=[*base.excluded, *base.dynamic_nodes])))
        return SWITCH_MODEL_RUN_COST * sensitivity_analysis_runs(group_counts[0], min(sensitivity_batches, len(evaluation_batches)))

    matmul_share = matmul_work_share(exported, bench_feeds)
    bound: dict[str, Any] = {}
    if matmul_share is not None and matmul_share < MATMUL_WORK_FLOOR:
        bound = {"not_worth": f"MatMul/Gemm do {matmul_share:.1%} of the work at the benchmark shape and it quantizes only those: "
                              "the graph would stay essentially float (at most a no-op plan)"}
        notes += (f"MatMul/Gemm do {matmul_share:.1%} of the exported graph's work: int8-dynamic and int4 (MatMul/Gemm only) are not tried",)
    candidates: list[Candidate | CandidateLadder] = []
    references: dict[str, Path] = {}
    dynamic_plan = make_plan(spec, target, backend, Precision.INT8_DYNAMIC) if Precision.INT8_DYNAMIC in supported else None
    int4_plan = make_plan(spec, target, backend, Precision.INT4) if Precision.INT4 in supported else None
    for graph in graphs:
        if graph != EXPORTED and not (backend is Backend.ONNXRUNTIME and _cpu_first(target, backend)):
            continue
        model = builder.graph_model(graph)
        if model is None:
            notes += (f"graph variant {graph} does not apply (no attention block recognised)",)
            continue
        plan = base if graph == EXPORTED else replace(base, float_outputs=static_plan.float_output_op_types(model, base.op_types))
        groups = find_node_groups(model, plan.op_types, exclude=plan.excluded)
        dynamic_only = {} if graph == EXPORTED else fused_dynamic_nodes(model)
        listed = auto_candidates(plan, groups, sensitivity, supported, max_kept=spec.auto_max_excluded, graph=graph,
                                 dynamic_only=dynamic_only, dynamic_plan=dynamic_plan, int4_plan=int4_plan, include_fallbacks=False)
        candidates += [priced(bounded(item, bound), analysis_runs) for item in listed]
        if graph != EXPORTED:
            references[graph] = model
            notes += (f"graph variant {graph}: fused {builder.fusion_stats}",)
    candidates += [bounded(item, bound) for item in fallback_candidates(supported, int4_plan)]
    candidates = with_plain_candidates(candidates, base, supported, convolutional=bool(bound))
    if backend is Backend.ONNXRUNTIME and _cpu_first(target, backend):  # its case is ONNX Runtime's CPU kernels (NCHWc float Conv)
        candidates = with_thin_conv_candidates(candidates, base, exported)
    candidates = with_edge_candidates(candidates, exported)
    build: Any = builder
    if engines is not None:
        candidates, build = engines.add_to(candidates), engines.builder(builder)
    result = search_auto(candidates, build=build, evaluate=evaluate, time_models=time_models, reference=Path(fp32_path),
                         graph_references=references, sensitivity=None, noise_margin=noise_margin,
                         higher_is_better=metric.higher_is_better, metric_name=metric.name, budget_text=budget_text, notes=notes,
                         time_budget_s=time_budget_s, started=started, time_budget_multiple=time_budget_multiple,
                         fixed_s=fixed_s, evaluation_batches=len(evaluation_batches))
    notes = result.notes  # the planner's notes and the search's own (the run-off's, or why it was not run)
    report = ranked[0] if ranked else None
    if result.chosen.name == FP32_REWRITTEN:
        counts = builder.fold_counts.note() if builder.fold_counts is not None else None
        notes += (f"fp32 (rewritten): the FP32 model after ONNX Runtime's quantization pre-processing"
                  f"{' and ' + counts if counts else ''}; no quantized op",)
    elif result.chosen.name == INT8_ORT_DEFAULT:
        notes += ("int8 (ONNX Runtime quantize_static defaults) was the fastest plan inside the budget on this host",)
    if engines is not None:
        notes += (f"engines: {engines.why_chosen(result.table, result.chosen)}",)
    if report is None:
        notes += ("sensitivity analysis not run: no ladder was tried (static int8 passed, was not faster than the bar, or could not be built)",)
    stats = {**result.stats, "calibration_passes": builder.calibration_passes, "calibration_cache_hits": builder.calibration_cache_hits,
             "sensitivity_runs": len(ranked), "sensitivity_seconds": round(report.seconds, 2) if report else 0.0,
             "timing_stopped_early": getattr(time_models, "stopped_early", 0)}
    return replace(result, sensitivity=report, notes=notes, stats=stats)


#: One run of the sensitivity switch model on a batch, in evaluations of a candidate on a batch: the switch model
#: is the float graph with a Where between float and quantize-dequantized values for every group, and building it
#: and its session comes on top. YOLOv8n (57 groups, 4 + 59 x 2 = 122 runs): 6.65 s and 19.6 s in two corpus runs
#: where the first candidate's evaluation took 0.3-0.4 s for 12 batches, i.e. 2.2x and 4.8x; 4 keeps the ladder
#: from overrunning the budget on the second.
SWITCH_MODEL_RUN_COST = 4.0


def sensitivity_analysis_runs(groups: int, batches: int) -> int:
    """Model runs (one batch each) of :func:`plan_auto_onnxruntime`'s sensitivity ranking of ``groups`` node groups
    on up to ``batches`` evaluation batches: the FP32 reference on every batch, then a run per group plus two on the
    batches :data:`SENSITIVITY_RUN_BATCHES` leaves."""
    if groups < 1 or batches < 1:
        return 0
    used = max(1, min(batches, SENSITIVITY_RUN_BATCHES // (groups + 2)))
    return batches + (groups + 2) * used


def _cpu_first(target: TargetProfile, backend: Backend) -> bool:
    providers = [ep.name for ep in target.backend(backend).execution_providers]
    return bool(providers) and providers[0] == "CPUExecutionProvider"
