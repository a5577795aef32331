"""The classic rule "first and last layers in float": a plan with the quantizable nodes nearest the graph's
inputs and nearest its outputs kept float, the rest as the base plan says.

The layers at a network's edges are where 8 bits hurt most and gain least: the first reads raw pixels or
audio samples (few channels, wide range: little arithmetic to save, much to lose), the last writes the
scores, boxes or logits the metric reads, and a detection head's outputs feed thresholds and NMS directly.
In the corpus: wav2vec2's int8-dynamic kept 0.75 of the CTC lines (budget 0.8) and, with its first and last
MatMul (feature projection and CTC head) float, 0.98 at 0.92x FP32; YOLOv8n's static int8 reached mAP 0.76
(budget 0.9) and 0.92 with its stem float.

Unlike the sensitivity ladders, the rule needs no sensitivity analysis (one run of the model per node group)
and no calibration of its own (it reuses its base's ranges), so ``auto`` can afford it where its time budget
leaves no room for a ladder.

"Nearest", by topology: a node's depth from the inputs is the number of quantizable nodes on the shortest
path from a graph input to it, itself included; from the outputs, likewise on the shortest path from it to a
graph output. The nodes at depth ``k`` or less on either side are kept float. Quantizable: an op type the
plan quantizes, with a constant weight (its second input an initializer or a Constant's output), not already
kept by the plan. A detection head's branches all end at the outputs, so depth from the outputs takes the
last layer of every branch at once.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.quantize.plan import QuantizationPlan

#: The candidates ``auto`` lists keep this many quantizable layers float on each side.
DEPTH = 1


def candidate_name(base: str, depth: int) -> str:
    return f"{base}+edges-float-{depth}"


def _constants(graph: Any) -> set[str]:
    names = {init.name for init in graph.initializer}
    names.update(node.output[0] for node in graph.node if node.op_type == "Constant" and node.output)
    return names


def quantizable_nodes(graph: Any, plan: QuantizationPlan) -> set[str]:
    """Names of the nodes ``plan`` quantizes that have a constant weight (second input) and are not kept already."""
    constants = _constants(graph)
    return {node.name for node in graph.node
            if node.name and node.op_type in plan.op_types and node.name not in plan.excluded
            and len(node.input) > 1 and node.input[1] in constants}


def depths_from_inputs(graph: Any, quantizable: set[str]) -> dict[str, float]:
    """Node name -> quantizable nodes on the shortest path from a graph input, itself included (``inf``:
    reached from constants only). ONNX lists nodes in topological order."""
    constants = _constants(graph)
    tensor_depth: dict[str, float] = {value.name: 0.0 for value in graph.input if value.name not in constants}
    out: dict[str, float] = {}
    for node in graph.node:
        reached = min((tensor_depth.get(name, math.inf) for name in node.input if name), default=math.inf)
        depth = reached + (node.name in quantizable)
        out[node.name] = depth
        for name in node.output:
            tensor_depth[name] = depth
    return out


def depths_from_outputs(graph: Any, quantizable: set[str]) -> dict[str, float]:
    """Node name -> quantizable nodes on the shortest path from it to a graph output, itself included
    (``inf``: no output depends on it)."""
    tensor_depth: dict[str, float] = {value.name: 0.0 for value in graph.output}
    out: dict[str, float] = {}
    for node in reversed(graph.node):
        reached = min((tensor_depth.get(name, math.inf) for name in node.output if name), default=math.inf)
        depth = reached + (node.name in quantizable)
        out[node.name] = depth
        for name in node.input:
            if name:
                tensor_depth[name] = min(tensor_depth.get(name, math.inf), depth)
    return out


def edge_float_nodes(graph: Any, plan: QuantizationPlan, depth: int) -> dict[str, str]:
    """Node name -> why it stays float: the quantizable nodes within ``depth`` of the inputs or the outputs."""
    quantizable = quantizable_nodes(graph, plan)
    if not quantizable:
        return {}
    from_inputs, from_outputs = depths_from_inputs(graph, quantizable), depths_from_outputs(graph, quantizable)
    kept: dict[str, str] = {}
    for node in graph.node:
        if node.name not in quantizable:
            continue
        if from_inputs[node.name] <= depth:
            kept[node.name] = (f"{node.op_type} {int(from_inputs[node.name])} of the first {depth} quantizable layer(s) from the graph inputs: "
                               "kept float (edge-layers rule: reads the raw input, little arithmetic to save)")
        elif from_outputs[node.name] <= depth:
            kept[node.name] = (f"{node.op_type} {int(from_outputs[node.name])} of the last {depth} quantizable layer(s) before the graph outputs: "
                               "kept float (edge-layers rule: writes what the metric reads)")
    return kept


def keep_edges_float(model_path: Path, plan: QuantizationPlan, depth: int = DEPTH) -> QuantizationPlan:
    """``plan`` with the quantizable nodes within ``depth`` of the graph's inputs or outputs kept float, each
    with its reason; ``plan`` itself when that would keep nothing, or every quantizable node (no int8 left)."""
    import onnx

    if depth < 1:
        raise ValueError(f"edge-layers depth must be at least 1, got {depth}")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    kept = edge_float_nodes(graph, plan, depth)
    if not kept or len(kept) >= len(quantizable_nodes(graph, plan)):
        return plan
    note = (f"{len(kept)} quantizable node(s) within {depth} layer(s) of the graph inputs or outputs kept float "
            "(edgekit.quantize.edge_layers), the rest as planned")
    return replace(plan.excluding(kept), notes=(*plan.notes, note))
