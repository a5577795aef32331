"""ONNX Runtime's own ``auto`` candidates, added to the backend-neutral list (:mod:`edgekit.quantize.candidates`)
of each graph variant: the FP32 graph after the exact float rewrites (``fp32-rewritten``), ONNX Runtime's default
static plan (``int8-ort-default``), a separable CNN's thin convolutions float (:mod:`edgekit.quantize.thin_convs`),
the edge layers float (:mod:`edgekit.quantize.edge_layers`); and the static bound that skips MatMul/Gemm-only
schemes on a graph whose MatMul/Gemm do almost none of the work."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.precision import Precision
from edgekit.quantize import edge_layers, thin_convs
from edgekit.quantize.candidates import EXPORTED, FLOAT, Candidate, CandidateLadder
from edgekit.quantize.ort.default_plan import ort_default_plan
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)

#: Graph variant: ONNX Runtime's transformer optimizer (fused attention, BiasGelu, SkipLayerNormalization).
TRANSFORMER_FUSION = "transformer-fusion"
#: The FP32 graph after pre-processing and the exact float rewrites (the graph static int8 starts from).
FLOAT_REWRITES = "float-rewrites"
#: The pre-processed FP32 graph, quantized by ONNX Runtime's quantize_static with its defaults.
ORT_DEFAULT = "ort-default"
FP32_REWRITTEN = "fp32-rewritten"
INT8_ORT_DEFAULT = "int8-ort-default"
#: int8-dynamic and int4 quantize only MatMul/Gemm; under this share of the work they are not tried.
MATMUL_WORK_FLOOR = 0.05


def matmul_work_share(model_path: Path, feeds: Mapping[str, np.ndarray] | None) -> float | None:
    """The share of the graph's arithmetic (FLOPs at the shapes of ``feeds``) done by MatMul/Gemm
    (``None`` when it cannot be worked out)."""
    from edgekit.estimate.graph_cost import graph_costs

    try:
        cost = graph_costs(model_path, input_shapes={k: tuple(v.shape) for k, v in feeds.items()} if feeds else None)
    except Exception as exc:  # an estimate only prunes; the search goes on without it
        log.info("no work estimate for %s (%s): int8-dynamic and int4 are tried", model_path, type(exc).__name__)
        return None
    total = cost.total_ops
    if not total > 0:
        return None
    return sum(node.ops for node in cost.nodes if node.op_type in ("MatMul", "Gemm")) / total


def with_plain_candidates(listed: list[Candidate | CandidateLadder], base: QuantizationPlan,
                           supported: Sequence[Precision], convolutional: bool = False) -> list[Candidate | CandidateLadder]:
    """``listed`` with the float-rewrite FP32 candidate right after the first static int8 candidate of any
    graph variant, and ONNX Runtime's default static plan after that graph's int8-dynamic (so that their
    latency is a bar early, and the time budget, scaled from the first candidate, leaves them room). The
    cheap ones first: fp32-rewritten needs no calibration (wav2vec2: 0.96x FP32, the only plan faster than
    FP32 inside its budget), int8-dynamic neither (YOLOS: 0.84x); ONNX Runtime's default plan lost on every
    small transformer here (1.27-1.55x FP32). On a ``convolutional`` graph (MatMul/Gemm under
    :data:`MATMUL_WORK_FLOOR` of the work: int8-dynamic and int4 are not tried) that plan comes right after
    static int8 instead: it is the strongest plain plan there (ResNet: 0.45-0.52x FP32 inside the budget, where
    edgekit's static int8 missed it by one image) and, its ranges collected in the shared calibration, costs a
    write, an evaluation and a timing; behind the cheaper candidates, ResNet's sub-second budget ran out first."""
    at = next((i + 1 for i, item in enumerate(listed) if isinstance(item, Candidate) and item.precision is Precision.INT8), 0)
    ort_default = Candidate(INT8_ORT_DEFAULT, Precision.INT8, ort_default_plan(base), ORT_DEFAULT)
    if convolutional and at and Precision.INT8 in supported:
        return [*listed[:at], ort_default, Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES), *listed[at:]]
    out = [*listed[:at], Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES), *listed[at:]]
    if Precision.INT8 in supported:
        at += 1
        if at and at < len(out) and isinstance(out[at], Candidate) and out[at].precision is Precision.INT8_DYNAMIC:
            at += 1
        out.insert(at, ort_default)
    return out


def with_thin_conv_candidates(listed: list[Candidate | CandidateLadder], base: QuantizationPlan,
                               exported: Path) -> list[Candidate | CandidateLadder]:
    """``listed`` with :mod:`edgekit.quantize.thin_convs`' plans (a separable CNN's convolutions under each of
    its thresholds of multiply-adds per output element, and its HardSigmoid-gated Muls, float) right after the
    float-rewrite FP32 candidate, when ``listed`` has a static int8 candidate on the exported graph. They reuse
    its calibration, so they are priced as cheap candidates; PaddleClas' orientation classifier, in the
    corpus: chosen at 0.65x FP32 (top-1 1.0) where static int8 ran 1.01x with top-1 0.979."""
    if not any(isinstance(item, Candidate) and item.precision is Precision.INT8 and item.graph == EXPORTED for item in listed):
        return listed
    added: list[Candidate] = []
    for min_macs in thin_convs.THRESHOLDS:
        plan = thin_convs.keep_thin_convs_float(exported, base, min_macs)
        if plan is base or any(plan.excluded == other.plan.excluded for other in added if other.plan is not None):
            continue
        kept = {name: why for name, why in plan.excluded.items() if name not in base.excluded}
        added.append(Candidate(thin_convs.candidate_name(min_macs), Precision.INT8, plan, EXPORTED, kept))
    at = next((i + 1 for i, item in enumerate(listed) if isinstance(item, Candidate) and item.name == FP32_REWRITTEN), len(listed))
    return [*listed[:at], *added, *listed[at:]]


def with_edge_candidates(listed: list[Candidate | CandidateLadder], exported: Path) -> list[Candidate | CandidateLadder]:
    """``listed`` with :mod:`edgekit.quantize.edge_layers`' plan (the quantizable layers nearest the inputs and the
    outputs float) for the exported graph's static int8 and int8-dynamic candidates, each right after its base (the
    static one after the float-rewrite and thin-conv candidates that follow it), before the sensitivity ladders: it
    reuses its base's calibration and needs no sensitivity analysis, so it is priced as a cheap candidate. It runs
    every node at its base's precision or higher, so it is skipped unbuilt when its base passed or was not faster
    than the bar. wav2vec2's int8-dynamic kept 0.75 of the CTC lines (budget 0.8); with its feature projection and
    CTC head float (depth 1), 0.98 at 0.92x FP32."""
    out = list(listed)
    for base_name in ("int8-static", "int8-dynamic"):
        at = next((i for i, item in enumerate(out) if isinstance(item, Candidate) and item.name == base_name and item.graph == EXPORTED), -1)
        base = out[at] if at >= 0 else None
        if not isinstance(base, Candidate) or base.plan is None or not base.levels:
            continue
        plan = edge_layers.keep_edges_float(exported, base.plan, edge_layers.DEPTH)
        if plan is base.plan:
            continue
        kept = {name: why for name, why in plan.excluded.items() if name not in base.plan.excluded}
        levels = {**base.levels, **{name: FLOAT for name in kept}}
        edge = replace(base, name=edge_layers.candidate_name(base_name, edge_layers.DEPTH), plan=plan, kept={**base.kept, **kept}, levels=levels)
        at += 1
        while at < len(out) and isinstance(out[at], Candidate) and (out[at].name == FP32_REWRITTEN or out[at].name.startswith("int8-thin-convs")):
            at += 1
        out.insert(at, edge)
    return out


def priced(item: Candidate | CandidateLadder, analysis_runs: Any) -> Candidate | CandidateLadder:
    """``item`` with ``analysis_runs`` (what its sensitivity ranking costs, in model runs) when it is a lazy ladder."""
    if isinstance(item, CandidateLadder) and item.expand is not None and not item.steps:
        return replace(item, analysis_runs=analysis_runs)
    return item


def bounded(item: Candidate | CandidateLadder, bound: Mapping[str, Any]) -> Candidate | CandidateLadder:
    """``item`` with the static bound of MatMul/Gemm-only schemes (int8-dynamic, int4) when it is one."""
    if bound and isinstance(item, Candidate) and item.precision in (Precision.INT8_DYNAMIC, Precision.INT4):
        return replace(item, **bound)
    return item


def fused_dynamic_nodes(model_path: Path) -> dict[str, str]:
    import onnx

    return {node.name: node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node if node.op_type == "Attention"}
