"""Which nodes a static int8 plan quantizes on a given graph, for ONNX Runtime: the integer chains around its op
types, the outputs that need no Q/DQ pair, recurrent and control-flow nodes and mixed detector heads kept float, and
the activation tensors calibration must observe (:func:`calibration_tensors`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.precision import Backend
from edgekit.quantize.ort import layout
from edgekit.quantize.plan import QuantizationPlan


#: Ops a static plan quantizes along with its op types, so that integer chains stay integer: ONNX Runtime's
#: quantizer folds Relu/Clip into the preceding quantized op's output range (a uint8 range that starts at 0
#: *is* the Relu), MaxPool runs on uint8 in NHWC, and Reshape/Flatten move uint8 data. Left float, each costs
#: a DQ -> op -> Q round trip and breaks the NHWC layout between convolutions (digits-cnn int8 was slower than
#: FP32 that way; with the chain, its three convolutions run as QLinearConv back to back).
INTEGER_CHAIN_OPS = ("Relu", "Clip", "MaxPool", "Reshape", "Flatten")


#: On ONNX Runtime a convolutional plan quantizes the joins and pointwise ops too, which ORT runs as integer
#: ops (QLinearAdd, QLinearMul, QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool, uint8 Resize):
#: residual Adds, FPN Concat/Resize, HardSwish's and squeeze-excite's Mul. Left float, each sits between a
#: DequantizeLinear and a QuantizeLinear, and PP-OCR's detector ran its int8 chains that way at 0.98x FP32
#: (0.76x with them, same calibration, interleaved on a busy 2-core host).
ORT_CNN_CHAIN_OPS = ("Add", "Mul", "Concat", "Resize", "GlobalAveragePool", "AveragePool")


#: Ops through which a feature map stays a convolution's (the region :data:`ORT_CNN_CHAIN_OPS` apply to).
_CONV_REGION_OPS = frozenset({"Conv", "ConvTranspose", "Relu", "Clip", "HardSigmoid", "Sigmoid", "HardSwish", "MaxPool", "BatchNormalization",
                              *ORT_CNN_CHAIN_OPS})


def outside_conv_region(model_path: Path, plan: QuantizationPlan) -> set[str]:
    """Nodes of :data:`ORT_CNN_CHAIN_OPS` that no convolution's feature map reaches through conv-region ops
    (a recognizer's transformer layers: LayerNorm's Mul/Add, residual Adds of MatMul outputs). They stay
    float: quantizing their inputs and outputs cost PP-OCR's recognizer 2 points of 1 - CER and buys no
    integer chain."""
    import onnx

    if static_op_types(plan) == list(plan.op_types) or plan.backend is not Backend.ONNXRUNTIME:
        return set()
    graph = onnx.load(str(model_path), load_external_data=False).graph
    region: set[str] = set()  # tensors that are conv feature maps
    outside: set[str] = set()
    for node in graph.node:  # topological order
        inside = node.op_type in ("Conv", "ConvTranspose") or (node.op_type in _CONV_REGION_OPS and any(name in region for name in node.input))
        if inside:
            region.update(node.output)
        elif node.op_type in ORT_CNN_CHAIN_OPS:
            outside.add(node.name)
    return outside


def static_op_types(plan: QuantizationPlan) -> list[str]:
    """The op types the static writer hands ONNX Runtime's quantizer: the plan's, plus the integer-chain ops
    when the plan quantizes conv outputs (a plan whose ops keep float outputs has no integer chain to extend),
    plus :data:`ORT_CNN_CHAIN_OPS` on ONNX Runtime."""
    if "Conv" not in plan.op_types or "Conv" in plan.float_outputs:
        return list(plan.op_types)
    extra = INTEGER_CHAIN_OPS + (ORT_CNN_CHAIN_OPS if plan.backend is Backend.ONNXRUNTIME else ())
    return [*plan.op_types, *(op for op in extra if op not in plan.op_types)]


#: Consumers through which a quantized op output still feeds a quantized op (Conv -> Relu -> Conv).
REQUANTIZING_CONSUMERS = ("Relu", "Clip")


def float_output_op_types(model_path: Path, op_types: Sequence[str]) -> tuple[str, ...]:
    """Op types none of whose nodes feeds a quantized node (directly or through ReLU/Clip): their
    outputs need no Q/DQ pair (a transformer's MatMul -> bias Add), unlike a CNN's Conv -> ReLU -> Conv."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def feeds_quantized(tensor: str, depth: int = 2) -> bool:
        for consumer in consumers.get(tensor, []):
            if consumer.op_type in op_types:
                return True
            if depth and consumer.op_type in REQUANTIZING_CONSUMERS and any(feeds_quantized(out, depth - 1) for out in consumer.output):
                return True
        return False

    chained = {node.op_type for node in graph.node if node.op_type in op_types and any(feeds_quantized(out) for out in node.output)}
    return tuple(op for op in op_types if op not in chained)


#: Recurrent and control-flow ops: int8 leaves them (and the ops inside their subgraphs) float.
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")


def recurrent_nodes(model_path: Path) -> dict[str, str]:
    """Recurrent and control-flow nodes (main graph, and recurrent ones inside subgraphs) -> why they stay float."""
    import onnx

    found: dict[str, str] = {}

    def walk(graph: Any, where: str) -> None:
        for node in graph.node:
            name = node.name or f"{node.op_type}:{node.output[0]}"
            if node.op_type in RECURRENT_OPS:
                found[name] = (f"{node.op_type}{where}: recurrent, kept float (its state feeds back each step, so quantization "
                               "error accumulates; the int8 writers quantize MatMul/Gemm/Conv only)")
            elif node.op_type in CONTROL_FLOW_OPS and not where:
                found[name] = f"{node.op_type}: control flow, its branches/body kept float (the QDQ writer quantizes the main graph)"
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g, f" inside {node.op_type} '{name}'")

    walk(onnx.load(str(model_path), load_external_data=False).graph, "")
    return found


def recurrent_note(model_path: Path) -> str | None:
    nodes = recurrent_nodes(model_path)
    if not nodes:
        return None
    counts: dict[str, int] = {}
    for why in nodes.values():
        op = why.split(":")[0].split(" ")[0]
        counts[op] = counts.get(op, 0) + 1
    return ("kept float: " + ", ".join(f"{n} {op}" for op, n in counts.items()) +
            " (recurrent state would accumulate quantization error; control-flow bodies are not quantized)")


def static_int8_plan(plan: QuantizationPlan, model_path: Path) -> QuantizationPlan:
    """The static int8 plan for this graph: no Q/DQ on op outputs that no quantized op reads (a transformer's
    MatMul -> bias Add), and float consumers (residual Adds, LayerNorms) reading float tensors. Without them,
    MiniLM's mean cosine to FP32 was 0.930; with them 0.9925. For ONNX Runtime, stem convolutions stay float
    and feature maps flatten channels-last (:mod:`edgekit.quantize.ort.layout`)."""
    notes = [*plan.notes, "Q/DQ only where a quantized op reads it; float consumers read float tensors"]
    excluded = dict(plan.excluded)
    recurrent = recurrent_note(model_path)
    if recurrent:
        notes.append(recurrent)
    heads = {name: why for name, why in mixed_output_heads(model_path).items() if name not in excluded}
    if heads:
        excluded.update(heads)
        notes.append(f"{len(heads)} output head(s) kept float: their output mixes boxes and scores")
    if plan.backend is Backend.ONNXRUNTIME:
        excluded.update({name: why for name, why in layout.stem_convolutions(model_path).items() if name not in excluded})
        notes.append("conv feature maps flatten in channels-last order, matching ONNX Runtime's NHWC int8 convolutions")
        notes.append("float stem convolutions are computed channels-last (patches x kernel), so their output enters "
                     "ONNX Runtime's NHWC int8 convolutions without a transpose")
    on_ort = plan.backend is Backend.ONNXRUNTIME
    float_outputs = float_output_op_types(model_path, plan.op_types)
    if on_ort and "Conv" in float_outputs and "Conv" in quantizable_op_types(model_path):
        # ONNX Runtime's CPU provider has no integer convolution with a float output: a Conv whose output
        # is not quantized runs in float on dequantized weights, in NCHW, slower than FP32 (PP-OCR's
        # convolutions feed float HardSwish/Sigmoid ops, and every one of them ran so: 1.5x FP32).
        float_outputs = tuple(op for op in float_outputs if op != "Conv")
        notes.append("Conv outputs quantized even where float ops read them: ONNX Runtime runs a Conv as QLinearConv only then")
    return replace(plan, float_outputs=float_outputs, float_consumers_skip_qdq=True,
                   excluded=excluded, channels_last_flatten=on_ort, channels_last_stem=on_ort, notes=tuple(notes))


#: Ops between an output's heads (its last weighted ops) and the output: activations, layout, the slicing and
#: joining of a detector's head tensors, and the arithmetic of its box decoding (anchors, strides, DFL).
HEAD_TAIL_OPS = frozenset({"Sigmoid", "Softmax", "LogSoftmax", "Relu", "Clip", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                           "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Concat", "Split", "Slice", "Gather", "Exp", "Expand", "Tile"})
#: Ops at which the head's tensors are joined or taken apart: an output mixes ranges only through one of them.
HEAD_JOIN_OPS = frozenset({"Concat", "Split", "Slice", "Gather"})
HEAD_OP_TYPES = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def mixed_output_heads(model_path: Path) -> dict[str, str]:
    """Node name -> why it stays float, for the heads of an output that joins branches of different kinds: the
    last Conv/ConvTranspose/MatMul/Gemm on every path back from the output through :data:`HEAD_TAIL_OPS`, where
    the paths pass a Concat/Split/Slice/Gather and the heads reach the output through different ops (a detector's
    ``[Sigmoid(boxes), class logits]``, YOLOv8's per-stride ``Concat(box distributions, class logits)`` split again
    into a DFL branch and a Sigmoid branch, PP-PicoDet's one head Conv per stride split into box bins and scores).
    Such an output mixes ranges one 8-bit scale cannot serve (YOLOv8's scores sat at cosine 0.95 behind int8 head
    convolutions), and a head is one layer of many, so it costs little to keep in float. Branches of one kind, a
    model that is all heads, and a plain classifier's logits are left alone."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    weighted = sum(node.op_type in HEAD_OP_TYPES for node in graph.node)

    def walk_back(tensor: str) -> tuple[list[Any], list[Any]]:
        """(heads, tail nodes) met walking back from ``tensor`` through :data:`HEAD_TAIL_OPS`."""
        heads: list[Any] = []
        tail: list[Any] = []
        seen: set[str] = set()
        frontier = [tensor]
        while frontier:
            node = producers.get(frontier.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in HEAD_OP_TYPES:
                heads.append(node)
            elif node.op_type in HEAD_TAIL_OPS:
                tail.append(node)
                frontier.extend(name for name in node.input if name and name not in constants)
        return heads, tail

    def tail_kind(head: Any, tail: list[Any]) -> frozenset[str]:
        """The op types of the tail nodes ``head``'s output reaches."""
        members = {id(node) for node in tail}
        readers: dict[str, list[Any]] = {}
        for node in tail:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        kinds: set[str] = set()
        seen: set[int] = set()
        frontier = list(head.output)
        while frontier:
            for node in readers.get(frontier.pop(), []):
                if id(node) in members and id(node) not in seen:
                    seen.add(id(node))
                    kinds.add(node.op_type)
                    frontier.extend(node.output)
        return frozenset(kinds)

    found: dict[str, str] = {}
    for output in graph.output:
        heads, tail = walk_back(output.name)
        if len(heads) < 2 or len(heads) >= weighted or not any(node.op_type in HEAD_JOIN_OPS for node in tail):
            continue
        if len({tail_kind(head, tail) for head in heads}) < 2:
            continue
        found.update({head.name: f"output head of '{output.name}' ({head.op_type}), which concatenates {len(heads)} heads of different ranges "
                                 "(boxes beside scores): kept float" for head in heads if head.name})
    return found


def quantizable_op_types(model_path: Path) -> set[str]:
    """The op types of the graph's nodes (a set, to ask whether a plan's op type occurs at all)."""
    import onnx

    return {node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node}


def calibration_tensors(model_path: Path, plan: QuantizationPlan) -> list[str]:
    """Activation tensors the static writer needs ranges for: non-constant inputs and the outputs of
    every node it quantizes (QDQ pairs sit on both sides of a quantized op)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    skip = set(plan.excluded) | set(plan.dynamic_nodes) | outside_conv_region(model_path, plan)
    names: list[str] = []
    op_types = static_op_types(plan)
    for node in graph.node:
        if node.op_type in op_types and node.name not in skip:
            outputs = [] if node.op_type in plan.float_outputs else list(node.output)
            for tensor in [*node.input, *outputs]:
                if tensor and tensor not in constants and tensor not in names:
                    names.append(tensor)
    return names
