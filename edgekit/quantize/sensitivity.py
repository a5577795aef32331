"""Per-node-group quantization sensitivity: which groups hurt the recipe metric most when quantized.

**What is measured.** For each group, the metric when *only that group* is quantized (static int8 with
the calibrated activation ranges and the plan's weight scheme) and everything else runs in float,
against the FP32 outputs of the same model. The alternative, quantizing everything *except* one group,
ranks less well at the same cost: each reading is then a small difference between two degraded
metrics, so batch noise and interactions between groups swamp it unless many batches are used. One
group at a time gives each group a clean, attributable loss against the reference, which is what the
search needs: keeping the k worst groups in higher precision removes roughly the sum of their losses
(on MiniLM the 48 isolated cosine losses add up to 0.0071 against a joint loss of 0.0075, so they are
close to additive). The metric with *every* group quantized is reported alongside.

**How it stays cheap.** Quantization is simulated in one ONNX model ("switch model"): each group's
activation inputs go through QuantizeLinear -> DequantizeLinear with the calibrated scale and zero
point, its weights are replaced by their int8 quantize-dequantize values, and a boolean graph input per
group selects (``Where``) between the quantized and the float tensor. One ONNX Runtime session then
evaluates every configuration by feeding different flags, on a few evaluation batches: no model is
written or loaded per group. Grouping by role across layers (``group_by="role"``) needs only one run
per role (8 for a BERT layer stack) instead of one per node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.calibration.ranges import TensorRange
from edgekit.quantize.node_groups import NodeGroup, find_node_groups, group_by_role
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)

Metric = Callable[[list[np.ndarray], list[np.ndarray], list[np.ndarray | None]], float]
MODE = "only-this-group-quantized"
FLAG_PREFIX = "edgekit.sensitivity.flag."
#: Input positions of each op type that are quantized (bias inputs stay float in the simulation).
QUANTIZED_INPUTS = {"MatMul": (0, 1), "Gemm": (0, 1), "Conv": (0, 1)}


@dataclass(frozen=True)
class GroupSensitivity:
    group: str
    nodes: tuple[str, ...]
    #: The metric with only this group quantized.
    value: float
    #: How much worse than the FP32 reference, in metric units (positive = worse).
    loss: float
    #: 1 = the most harmful group.
    rank: int
    cosine_min: float | None = None
    #: Relative L2 distance of the raw outputs from the reference (tie-breaker for coarse metrics).
    output_error: float = 0.0

    def to_manifest(self) -> dict[str, Any]:
        return {"group": self.group, "nodes": list(self.nodes), "value": self.value, "loss": self.loss, "rank": self.rank,
                "cosine_min": self.cosine_min, "output_error": self.output_error}


@dataclass(frozen=True)
class SensitivityReport:
    """Groups sorted by harm (rank 1 first), with the context needed to read the numbers."""

    metric: str
    higher_is_better: bool
    reference_value: float
    #: The metric with every group quantized at once (same simulation).
    all_quantized_value: float
    groups: tuple[GroupSensitivity, ...]
    batches: int
    samples: int
    group_by: str = "node"
    mode: str = MODE
    activation_type: str = "uint8"
    per_channel: bool = True
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def most_sensitive(self, count: int) -> tuple[GroupSensitivity, ...]:
        return self.groups[: max(count, 0)]

    def by_group(self) -> dict[str, GroupSensitivity]:
        return {entry.group: entry for entry in self.groups}

    def to_manifest(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "mode": self.mode,
            "group_by": self.group_by,
            "reference_value": self.reference_value,
            "all_quantized_value": self.all_quantized_value,
            "batches": self.batches,
            "samples": self.samples,
            "activation_type": self.activation_type,
            "per_channel": self.per_channel,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "groups": [entry.to_manifest() for entry in self.groups],
        }

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> SensitivityReport:
        """Read what :meth:`to_manifest` wrote (e.g. from an earlier bundle's manifest)."""
        try:
            groups = tuple(
                GroupSensitivity(g["group"], tuple(g["nodes"]), float(g["value"]), float(g["loss"]), int(g["rank"]), g.get("cosine_min"),
                                 float(g.get("output_error", 0.0)))
                for g in data["groups"]
            )
            return cls(
                metric=data["metric"],
                higher_is_better=bool(data["higher_is_better"]),
                reference_value=float(data["reference_value"]),
                all_quantized_value=float(data["all_quantized_value"]),
                groups=groups,
                batches=int(data["batches"]),
                samples=int(data["samples"]),
                group_by=data.get("group_by", "node"),
                mode=data.get("mode", MODE),
                activation_type=data.get("activation_type", "uint8"),
                per_channel=bool(data.get("per_channel", True)),
                seconds=float(data.get("seconds", 0.0)),
                notes=tuple(data.get("notes", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise QuantizationError(
                f"sensitivity report in the manifest is malformed: {type(exc).__name__}: {exc}",
                hint="re-run the build with --precision auto to recompute it",
            ) from None


class QuantizationSimulator:
    """The switch model of ``model_path`` under ``plan`` and one ONNX Runtime session over it: the
    model's outputs on the first ``max_batches`` batches with any set of nodes quantized."""

    def __init__(
        self,
        model_path: Path,
        plan: QuantizationPlan,
        ranges: Mapping[str, TensorRange],
        batches: Sequence[Mapping[str, np.ndarray]],
        *,
        output: str | None = None,
        label_key: str | None = "labels",
        max_batches: int = 4,
        groups: Sequence[NodeGroup] | None = None,
        threads: int | None = None,
    ) -> None:
        import onnx

        if max_batches < 1:
            raise QuantizationError(f"sensitivity analysis needs max_batches >= 1, got {max_batches}")
        if plan.weight_type != "int8" or plan.activation_type not in ("uint8", "int8"):
            raise QuantizationError(
                f"sensitivity analysis simulates static int8 (weights int8, activations uint8/int8); this plan has weights {plan.weight_type}, "
                f"activations {plan.activation_type}",
                hint="analyse with the int8 plan (make_plan(..., Precision.INT8))",
            )
        used = list(batches)[:max_batches]
        if not used:
            raise QuantizationError("sensitivity analysis got no evaluation batches", hint="the recipe's data.evaluation must yield at least one batch")
        self.model_path, self.plan = Path(model_path), plan
        model = onnx.load(str(model_path), load_external_data=True)
        static_types = tuple(op for op in plan.op_types if op in QUANTIZED_INPUTS)
        self.groups = list(groups) if groups is not None else find_node_groups(model, static_types, exclude=[*plan.excluded, *plan.dynamic_nodes])
        if not self.groups:
            raise QuantizationError(f"{model_path}: no {'/'.join(plan.op_types)} nodes to analyse (after the plan's exclusions)",
                                    hint="check quantization.exclude_nodes and exclude_op_types")
        self.flags = add_quantization_switches(model, self.groups, plan, ranges)
        self._flag_of_node = {node: self.flags[i] for i, group in enumerate(self.groups) for node in group.nodes}
        self._session = _session(model, threads)
        del model
        self._output_index = _output_index(self._session, output, self.model_path)
        self._feeds = [_model_feed(self._session, batch, self.model_path) for batch in used]
        self.labels = [np.asarray(batch[label_key]) if label_key and label_key in batch else None for batch in used]
        self.reference = self.outputs(())

    @property
    def batches(self) -> int:
        return len(self._feeds)

    @property
    def all_nodes(self) -> list[str]:
        return list(self._flag_of_node)

    def outputs(self, quantized_nodes: Iterable[str]) -> list[np.ndarray]:
        """The output (per batch) with ``quantized_nodes`` quantized and every other node in float."""
        enabled = set()
        for node in quantized_nodes:
            if node not in self._flag_of_node:
                raise QuantizationError(f"node '{node}' is not one of the simulated groups' nodes", hint="pass node names of simulator.groups")
            enabled.add(self._flag_of_node[node])
        switches = {flag: np.array(flag in enabled) for flag in self.flags}
        return [self._session.run(None, {**feed, **switches})[self._output_index] for feed in self._feeds]

    def metric(self, metric: Metric, quantized_nodes: Iterable[str]) -> float:
        return float(metric(self.outputs(quantized_nodes), self.reference, self.labels))

    def use_batches(self, count: int) -> None:
        """Run only the first ``count`` batches from now on (cheaper rankings on large graphs)."""
        if count < 1:
            raise QuantizationError(f"the simulator needs at least one batch, got {count}")
        self._feeds, self.labels, self.reference = self._feeds[:count], self.labels[:count], self.reference[:count]


def analyze_sensitivity(
    model_path: Path,
    plan: QuantizationPlan,
    ranges: Mapping[str, TensorRange],
    batches: Sequence[Mapping[str, np.ndarray]],
    metric: Metric,
    *,
    metric_name: str = "metric",
    higher_is_better: bool = True,
    output: str | None = None,
    label_key: str | None = "labels",
    max_batches: int = 4,
    group_by: Literal["node", "role"] = "node",
    groups: Sequence[NodeGroup] | None = None,
    threads: int | None = None,
) -> SensitivityReport:
    """Rank the plan's node groups by the metric loss each causes when it alone is quantized.

    ``model_path`` is the FP32 model the plan will be applied to (pre-processed the same way);
    ``ranges`` its calibrated activation ranges (from :func:`calibrate` over
    :func:`edgekit.quantize.ort.static_plan.calibration_tensors`); ``batches`` evaluation batches (the first
    ``max_batches`` are used; extra keys such as labels are not fed); ``metric`` a
    :data:`edgekit.evaluate.metrics.METRICS` function, ``output`` the output it reads (default the first).
    """
    started = time.perf_counter()
    simulator = QuantizationSimulator(model_path, plan, ranges, batches, output=output, label_key=label_key, max_batches=max_batches,
                                      groups=groups, threads=threads)
    return rank_groups(simulator, metric, metric_name=metric_name, higher_is_better=higher_is_better, group_by=group_by, started=started)


def rank_groups(simulator: QuantizationSimulator, metric: Metric, *, metric_name: str = "metric", higher_is_better: bool = True,
                group_by: Literal["node", "role"] = "node", started: float | None = None) -> SensitivityReport:
    """:func:`analyze_sensitivity` on an existing simulator (one run per group, plus all-quantized)."""
    started = time.perf_counter() if started is None else started
    reference = simulator.reference
    reference_value = simulator.metric(metric, ())
    all_value = simulator.metric(metric, simulator.all_nodes)
    measured = []
    for group in group_by_role(simulator.groups) if group_by == "role" else simulator.groups:
        outputs = simulator.outputs(group.nodes)
        value = float(metric(outputs, reference, simulator.labels))
        loss = (reference_value - value) if higher_is_better else (value - reference_value)
        measured.append((group, value, loss, _output_error(outputs, reference), _cosine_min(outputs, reference)))
    # Ties in the metric (top-1 over a few batches often moves for no single group) are broken by how far
    # the raw outputs moved, so the ranking still says which group to keep first.
    measured.sort(key=lambda item: (-item[2], -item[3], item[0].name))
    entries = tuple(GroupSensitivity(g.name, g.nodes, value, loss, rank, cos, error)
                    for rank, (g, value, loss, error, cos) in enumerate(measured, start=1))
    seconds = time.perf_counter() - started
    log.info("sensitivity of %d groups over %d batches in %.1f s", len(measured), simulator.batches, seconds)
    plan = simulator.plan
    return SensitivityReport(
        metric=metric_name,
        higher_is_better=higher_is_better,
        reference_value=reference_value,
        all_quantized_value=all_value,
        groups=entries,
        batches=simulator.batches,
        samples=int(sum(output.shape[0] for output in reference)),
        group_by=group_by,
        activation_type=plan.activation_type,
        per_channel=plan.per_channel,
        seconds=seconds,
        notes=(f"calibrator {plan.calibrator}",) if plan.calibrator else (),
    )


def add_quantization_switches(model: Any, groups: Sequence[NodeGroup], plan: QuantizationPlan, ranges: Mapping[str, TensorRange]) -> list[str]:
    """Rewrite ``model`` in place so that each group's quantization is switched by a boolean graph
    input; returns the flag input names (one per group, in order)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    group_of = {node: index for index, group in enumerate(groups) for node in group.nodes}
    flags = [f"{FLAG_PREFIX}{index}" for index in range(len(groups))]
    for flag in flags:
        graph.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
    qdq_of: dict[str, str] = {}  # activation tensor -> its quantize-dequantize tensor (shared by groups)
    new_nodes: list[Any] = []
    new_initializers: list[Any] = []
    for node in graph.node:
        index = group_of.get(node.name)
        if index is not None:
            for position in QUANTIZED_INPUTS.get(node.op_type, ()):
                if position >= len(node.input) or not node.input[position]:
                    continue
                tensor = node.input[position]
                if tensor in initializers:
                    array = numpy_helper.to_array(initializers[tensor])
                    quantized_name = f"{tensor}.edgekit_int8.{node.name}"
                    axis = _weight_channel_axis(node, array.ndim)
                    new_initializers.append(numpy_helper.from_array(fake_quantize_weight(array, axis if plan.per_channel else None, reduce_range=plan.reduce_range), quantized_name))
                    simulated = quantized_name
                else:
                    if tensor not in qdq_of:
                        qdq_of[tensor] = _append_qdq(new_nodes, new_initializers, tensor, _range_for(tensor, node, ranges), plan)
                    simulated = qdq_of[tensor]
                switched = f"{tensor}.edgekit_switch.{node.name}.{position}"
                new_nodes.append(helper.make_node("Where", [flags[index], simulated, tensor], [switched], name=f"edgekit_switch/{node.name}/{position}"))
                node.input[position] = switched
        new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_initializers)
    if not any(opset.domain in ("", "ai.onnx") and opset.version >= 13 for opset in model.opset_import):
        raise QuantizationError("sensitivity analysis needs an ONNX model with opset >= 13 (per-axis QuantizeLinear, Where on bool)", hint="upgrade the graph to opset 13 or newer (export.opset for a PyTorch model; an ONNX file is upgraded by the build's export stage)")
    return flags


def fake_quantize_weight(weight: np.ndarray, axis: int | None, *, reduce_range: bool = False) -> np.ndarray:
    """Symmetric int8 quantize-dequantize (levels -127..127, or -64..64 with ``reduce_range`` as ONNX Runtime's
    quantizer does), per channel along ``axis`` or per tensor."""
    levels = 64.0 if reduce_range else 127.0
    values = weight.astype(np.float32)
    if axis is None:
        amax = np.abs(values).max(keepdims=True)
    else:
        reduce = tuple(i for i in range(values.ndim) if i != axis)
        amax = np.abs(values).max(axis=reduce, keepdims=True)
    scale = np.where(amax > 0, amax / levels, 1.0).astype(np.float32)
    return (np.clip(np.round(values / scale), -levels, levels) * scale).astype(weight.dtype)


def _weight_channel_axis(node: Any, ndim: int) -> int:
    """The output-channel axis ONNX Runtime quantizes a weight per: Conv 0, Gemm 0 with transB else 1,
    MatMul the last axis."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((attr.i for attr in node.attribute if attr.name == "transB"), 0)
        return 0 if trans_b else 1
    return ndim - 1


def _range_for(tensor: str, node: Any, ranges: Mapping[str, TensorRange]) -> TensorRange:
    try:
        return ranges[tensor]
    except KeyError:
        raise QuantizationError(
            f"no calibrated range for tensor '{tensor}' (input of node '{node.name}', {node.op_type})",
            hint="calibrate the tensors listed by edgekit.quantize.ort.static_plan.calibration_tensors(model, plan) before analysing sensitivity",
        ) from None


def _append_qdq(nodes: list[Any], initializers: list[Any], tensor: str, value_range: TensorRange, plan: QuantizationPlan) -> str:
    from onnx import helper, numpy_helper

    dtype = plan.activation_type
    scale, zero_point = value_range.scale_zero_point(dtype, symmetric=plan.activation_symmetric)  # type: ignore[arg-type]
    scale_name, zero_name = f"{tensor}.edgekit_scale", f"{tensor}.edgekit_zero_point"
    initializers.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), scale_name))
    initializers.append(numpy_helper.from_array(np.array(zero_point, dtype=np.uint8 if dtype == "uint8" else np.int8), zero_name))
    quantized, simulated = f"{tensor}.edgekit_q", f"{tensor}.edgekit_qdq"
    nodes.append(helper.make_node("QuantizeLinear", [tensor, scale_name, zero_name], [quantized], name=f"edgekit_q/{tensor}"))
    nodes.append(helper.make_node("DequantizeLinear", [quantized, scale_name, zero_name], [simulated], name=f"edgekit_dq/{tensor}"))
    return simulated


def _session(model: Any, threads: int | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Basic level: constant folding only. Higher levels fuse Q/DQ pairs into integer kernels and would
    # no longer run the Where switches as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    options.add_session_config_entry("session.set_denormal_as_zero", "1")  # masked softmax makes denormals: slow
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise QuantizationError(f"ONNX Runtime cannot load the sensitivity model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                                hint="check that the model runs on ONNX Runtime's CPU provider") from None


def _output_index(session: Any, output: str | None, model_path: Path) -> int:
    names = [value.name for value in session.get_outputs()]
    if output is None:
        return 0
    if output not in names:
        raise QuantizationError(f"{model_path}: the model has no output '{output}'", hint=f"its outputs: {', '.join(names)}")
    return names.index(output)


def _model_feed(session: Any, batch: Mapping[str, np.ndarray], model_path: Path) -> dict[str, np.ndarray]:
    names = [value.name for value in session.get_inputs() if not value.name.startswith(FLAG_PREFIX)]
    missing = [name for name in names if name not in batch]
    if missing:
        raise QuantizationError(f"{model_path}: evaluation batch has no input {', '.join(missing)} (has {', '.join(sorted(batch))})")
    return {name: np.asarray(batch[name]) for name in names}


def _output_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """``||outputs - reference|| / ||reference||`` over all batches (0.0 for non-float outputs)."""
    if not outputs or outputs[0].dtype.kind != "f":
        return 0.0
    difference = sum(float(np.square(o.astype(np.float64) - r.astype(np.float64)).sum()) for o, r in zip(outputs, reference))
    scale = sum(float(np.square(r.astype(np.float64)).sum()) for r in reference)
    return float(np.sqrt(difference / scale)) if scale > 0 else float(np.sqrt(difference))


def _cosine_min(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float | None:
    if not outputs or outputs[0].dtype.kind != "f":
        return None
    from edgekit.evaluate.metrics import cosine_min

    return cosine_min(outputs, reference)


def sensitivity_svg(report: SensitivityReport, top: int = 20, kept: Sequence[str] = ()) -> str | None:
    """Horizontal bars of each group's metric loss when quantized alone, most harmful at the top;
    groups whose nodes ``kept`` names (kept in higher precision) are drawn in red. An inline ``<svg>``
    drawn without pyplot (see :mod:`edgekit.report.plots`); ``None`` when there is nothing to draw."""
    from edgekit.report.plots import BLUE, GREY, RED, _bar_height, _figure, _label_bars, _styled, _to_svg

    rows = [entry for entry in report.groups if np.isfinite(entry.loss)][: max(top, 0)]
    if not rows:
        return None
    kept_nodes = set(kept)

    @_styled
    def draw() -> str:
        figure, axes = _figure(_bar_height(len(rows)))
        losses = [max(entry.loss, 0.0) for entry in rows]
        colors = [RED if kept_nodes.intersection(entry.nodes) else (BLUE if entry.loss > 0 else GREY) for entry in rows]
        axes.barh(range(len(rows)), losses, color=colors)
        _label_bars(axes, [entry.group for entry in rows], [f"{entry.loss:.2g}" for entry in rows], max(losses) or 1.0)
        shown = f"top {len(rows)} of {len(report.groups)}" if len(rows) < len(report.groups) else f"{len(rows)}"
        axes.set_title(
            f"Quantization sensitivity ({shown} groups, each quantized alone)\n"
            f"{report.metric}: FP32 {report.reference_value:.5g}, all quantized {report.all_quantized_value:.5g}"
        )
        axes.set_xlabel(f"{report.metric} loss vs FP32" + (" (red: kept in higher precision)" if kept_nodes else ""))
        return _to_svg(figure, "sensitivity", "Bar chart of the accuracy loss each node group causes when quantized alone")

    return draw()
