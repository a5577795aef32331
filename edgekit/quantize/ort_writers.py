"""ONNX Runtime graph writers for a :class:`QuantizationPlan`: static QDQ (with edgekit's own
calibrated ranges), dynamic int8, and weight-only int4 (``MatMulNBits``, or blocked int4 Q/DQ for
TensorRT). Each takes an FP32 model file and writes a quantized one."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend
from edgekit.quantize import ort_layout
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)


class Range(Protocol):
    min: float
    max: float


def _save(model: Any, path: Path) -> Path:
    import onnx

    large = model.ByteSize() > 1_800_000_000
    onnx.save(model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None)
    return path


def preprocess(fp32_path: Path, out_path: Path) -> Path:
    """ONNX Runtime's quantization pre-processing: symbolic shape inference and basic graph cleanup, so
    that the quantizer sees fused, shaped ops."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=False, auto_merge=True)
    except Exception as exc:  # symbolic shape inference fails on some graphs; plain shape inference still works
        log.info("symbolic shape inference failed (%s); pre-processing without it", exc)
        quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=True)
    name_unnamed_nodes(out_path)
    return out_path


def without_shape_annotations(path: Path, out_path: Path) -> Path:
    """``path`` without the intermediate tensors' shapes (``graph.value_info``) that pre-processing's symbolic
    shape inference wrote, saved to ``out_path`` (``path`` itself when it has none). ONNX Runtime infers them
    again, and runs faster without them: on this host (AVX-512 VNNI, 2 threads) wav2vec2's pre-processed FP32
    graph ran 1.22x the original and 0.97x stripped; the int8 and int8-dynamic bundles of YOLOS, SegFormer and
    wav2vec2 ran 0.87-0.93x their annotated selves."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    if not len(model.graph.value_info):
        return path
    del model.graph.value_info[:]
    return _save(model, out_path)


def name_unnamed_nodes(path: Path) -> int:
    """Give every node without a name a unique one (``<op type>_unnamed_<n>``), rewriting ``path`` when
    any was nameless; returns how many. Plans keep, exclude and check nodes by name, so a nameless
    MatMul/Conv (hand-appended decoding, some exporters) could be neither kept float nor checked:
    PP-PicoDet's appended DFL MatMul failed auto's int8 build that way (a node named '')."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    taken = {node.name for node in model.graph.node}
    renamed = 0
    for node in model.graph.node:
        if node.name:
            continue
        while f"{node.op_type}_unnamed_{renamed}" in taken:
            renamed += 1
        node.name = f"{node.op_type}_unnamed_{renamed}"
        taken.add(node.name)
        renamed += 1
    if renamed:
        onnx.save(model, str(path))
    return renamed


def quantizable_nodes(model_path: Path, op_types: tuple[str, ...]) -> list[str]:
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [node.name for node in graph.node if node.op_type in op_types]


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
    and feature maps flatten channels-last (:mod:`edgekit.quantize.ort_layout`)."""
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
        excluded.update({name: why for name, why in ort_layout.stem_convolutions(model_path).items() if name not in excluded})
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


def write_static_qdq(fp32_path: Path, out_path: Path, plan: QuantizationPlan, ranges: Mapping[str, Range]) -> Path:
    """Insert QuantizeLinear/DequantizeLinear pairs with the given activation ranges (per-channel int8
    weights); excluded nodes stay float; ``plan.dynamic_nodes`` are then quantized dynamically."""
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    model = onnx.load(str(fp32_path), load_external_data=True)
    activations = {out: node.op_type for node in model.graph.node if node.op_type in FOLDABLE_ACTIVATIONS for out in node.output}
    tensors = TensorsData(
        CalibrationMethod.MinMax,
        {name: TensorData(lowest=np.array(r.min, dtype=np.float32), highest=np.array(r.max, dtype=np.float32)) for name, r in ranges.items()},
    )
    activation = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}[plan.activation_type]
    skip = set(plan.excluded) | set(plan.dynamic_nodes) | outside_conv_region(fp32_path, plan)
    quantizer = QDQQuantizer(
        model,
        plan.per_channel,
        plan.reduce_range,  # 7-bit weights for x86 CPUs without VNNI (edgekit.quantize.cpu_isa)
        QuantType.QInt8,
        activation,
        tensors,
        [],  # nodes_to_quantize: empty = all of op_types
        sorted(skip),
        static_op_types(plan),
        {
            "ActivationSymmetric": plan.activation_symmetric,
            "WeightSymmetric": True,
            "DedicatedQDQPair": False,
            "QDQKeepRemovableActivations": False,
            "OpTypesToExcludeOutputQuantization": list(plan.float_outputs),
        },
    )
    try:
        quantizer.quantize_model()
    except Exception as exc:
        raise QuantizationError(f"static QDQ quantization of {fp32_path} failed: {exc}", hint="exclude the node named above (quantization.exclude_nodes)") from exc
    rewire_subgraph_readers_of_folded(quantizer.model.model, activations, fp32_path)
    if plan.float_consumers_skip_qdq:
        quantized = {n.name for n in model.graph.node if n.op_type in plan.op_types and n.name not in skip}
        rewire_float_consumers(quantizer.model.model, quantized, activations)
    if plan.channels_last_flatten:
        ort_layout.flatten_channels_last(quantizer.model.model)
    if plan.channels_last_stem:
        ort_layout.stem_channels_last(quantizer.model.model, leave=set(plan.dynamic_nodes))
    if plan.dynamic_nodes:
        private_dynamic_inputs(quantizer.model.model, set(plan.dynamic_nodes))
    staged = _save(quantizer.model.model, out_path.with_name(out_path.stem + ".static.onnx"))
    if plan.dynamic_nodes:
        write_dynamic(staged, out_path, plan, nodes=list(plan.dynamic_nodes))
        staged.unlink()
    else:
        staged.replace(out_path)
    if plan.backend is Backend.ONNXRUNTIME:
        quantize_embedding_tables(out_path, plan)
    return out_path


def embedding_gathers(model_path: Path) -> list[str]:
    """Gather nodes that look up rows of a constant 2-D table (token and position embeddings)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    tables = {init.name for init in graph.initializer if len(init.dims) == 2}
    return [node.name for node in graph.node if node.op_type == "Gather" and node.input[0] in tables]


def quantize_embedding_tables(model_path: Path, plan: QuantizationPlan) -> int:
    """Store a static plan's embedding tables in 8 bits (ONNX Runtime's quantizer: uint8 with a zero point; the
    gathered rows are dequantized), in place; returns the tables quantized. :func:`write_dynamic` does the same
    in its own pass. MiniLM's word embeddings are 47 MB of its 90 MB: so the int8 bundle is
    0.26x the FP32 size instead of 0.65x, at the same speed and mean cosine (dynamic: 0.9929 against 0.9932)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    gathers = [name for name in embedding_gathers(model_path) if name not in plan.excluded]
    if not gathers:
        return 0
    staged = model_path.with_name(model_path.stem + ".embeddings.onnx")
    try:
        quantize_dynamic(str(model_path), str(staged), op_types_to_quantize=["Gather"], nodes_to_quantize=gathers,
                         weight_type=QuantType.QInt8)
    except Exception as exc:
        raise QuantizationError(f"int8 embedding tables of {model_path} failed: {exc}",
                                hint=f"exclude the Gather nodes ({', '.join(gathers[:3])}) with quantization.exclude_nodes") from exc
    staged.replace(model_path)
    return len(gathers)


#: Ops that ONNX Runtime runs on quantized tensors in QDQ form (data movement, pooling, clipping): their
#: DequantizeLinear inputs are kept so that integer chains (Conv -> MaxPool -> Conv) stay integer.
QDQ_PASSTHROUGH_OPS = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Clip",
    "Slice", "Split", "Gather", "GatherElements", "Resize", "Pad", "Concat", "Where", "TopK", "ArgMax",
    "QuantizeLinear", "DequantizeLinear",
})


#: Activations ONNX Runtime's QDQ quantizer removes when they follow a quantized op, leaving the output's
#: QuantizeLinear (a uint8 range from 0, or the Clip's) to apply them.
FOLDABLE_ACTIVATIONS = ("Relu", "Clip")


def folded_activation_outputs(graph: Any, activations: Mapping[str, str]) -> set[str]:
    """Tensors of ``activations`` (tensor -> op type, from the graph before quantization) whose Relu/Clip the
    quantizer removed: the tensor is now written by the op before it (the pre-activation value), and only
    its QuantizeLinear applies the activation."""
    producers = {output: node for node in graph.node for output in node.output}
    return {name for name, op in activations.items() if name in producers and producers[name].op_type != op}


def _subgraphs(graph: Any) -> list[Any]:
    """Every If/Loop/Scan body under ``graph``, nested ones included."""
    import onnx

    found = []
    for node in graph.node:
        for attribute in node.attribute:
            graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for sub in graphs:
                found.extend([sub, *_subgraphs(sub)])
    return found


def rewire_subgraph_readers_of_folded(model: Any, activations: Mapping[str, str], where: Path | str = "the model") -> int:
    """Point If/Loop/Scan bodies that read a folded Relu/Clip output from the outer scope at the output's
    DequantizeLinear. ONNX Runtime's quantizer renames main-graph readers only: a body that reads the tensor
    by name gets the value *before* the activation (Silero VAD's decoder If reads the last encoder ReLU so:
    its negative values reached the LSTM, and int8 agreed with FP32's speech decisions on 67 %). Returns the
    references rewired."""
    graph = model.graph
    folded = folded_activation_outputs(graph, activations)
    subgraphs = _subgraphs(graph)
    if not folded or not subgraphs:
        return 0
    quantize = {node.input[0]: node.output[0] for node in graph.node if node.op_type == "QuantizeLinear"}
    dequantized = {node.input[0]: node.output[0] for node in graph.node if node.op_type == "DequantizeLinear"}
    rewired = 0
    for sub in subgraphs:
        local = {o for node in sub.node for o in node.output} | {i.name for i in sub.input} | {i.name for i in sub.initializer}
        for node in sub.node:
            for position, name in enumerate(node.input):
                if name not in folded or name in local:
                    continue
                after = dequantized.get(quantize.get(name, ""))
                if after is None:
                    raise QuantizationError(f"{where}: subgraph node '{node.name}' reads '{name}', whose {activations[name]} the int8 quantizer "
                                            "folded away, and no DequantizeLinear gives the activated value",
                                            hint=f"keep the node that writes '{name}' float (quantization.exclude_nodes)")
                node.input[position] = after
                rewired += 1
    return rewired


def rewire_float_consumers(model: Any, quantized_nodes: set[str], activations: Mapping[str, str] | None = None) -> int:
    """Make float consumers of quantize-dequantized activations (``x -> Q -> DQ -> Add``) read ``x``
    itself. Quantized nodes, :data:`QDQ_PASSTHROUGH_OPS`, and consumers whose output is quantized again
    (``DQ -> Add -> Q``, which ONNX Runtime fuses into an integer op) keep reading the DQ output.

    Two kinds of ``x`` are never read past their Q/DQ pair: the output of a quantized Conv (ONNX Runtime
    runs a Conv as ``QLinearConv`` only when its output is quantized; with every reader rewired the pair
    goes and the Conv runs in float on dequantized weights, slower than FP32: PP-OCR's classifier at
    1.7x), and a tensor that ``activations`` (tensor -> op type, from the graph before quantization) names
    as a Relu/Clip output the quantizer folded into the Q (``x`` is then the value *before* the Relu:
    reading it changed the SE blocks of PP-OCR's classifier, whose decisions agreed with FP32 on 79 %).
    Returns the number of inputs rewired."""
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    requantized = {name for node in graph.node if node.op_type == "QuantizeLinear" for name in node.input[:1]}
    folded = folded_activation_outputs(graph, activations or {})
    float_source: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "DequantizeLinear":
            quantize = producers.get(node.input[0])
            if quantize is None or quantize.op_type != "QuantizeLinear":
                continue
            source = quantize.input[0]
            producer = producers.get(source)
            if source in folded or (producer is not None and producer.op_type == "Conv" and producer.name in quantized_nodes):
                continue
            float_source[node.output[0]] = source
    rewired = 0
    for node in graph.node:
        if node.name in quantized_nodes or node.op_type in QDQ_PASSTHROUGH_OPS or requantized.intersection(node.output):
            continue
        for position, name in enumerate(node.input):
            if name in float_source:
                node.input[position] = float_source[name]
                rewired += 1
    return rewired


#: Ops a quantized graph contains and a float one does not (QDQ pairs, ONNX Runtime's integer and weight-only ops).
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "MatMulNBits",
                           "GatherBlockQuantized", "DynamicQuantizeMatMul", "QLinearConv", "QLinearMatMul", "QAttention"})


def quantized_ops(model_path: Path) -> dict[str, int]:
    """Counts of :data:`QUANTIZED_OPS` in a model's main graph (empty: it quantized nothing)."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(model_path), load_external_data=False).graph.node:
        if node.op_type in QUANTIZED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


#: Ops whose constant weights int8 can store: their share of a model's weights says what a plan covers.
WEIGHTED_OP_TYPES = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def weight_elements_by_op(model_path: Path, excluded: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
    """Op type -> (nodes, weight elements) over the nodes of :data:`WEIGHTED_OP_TYPES` that read a constant
    weight (input 1), leaving out ``excluded`` nodes."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    sizes = {init.name: int(np.prod(init.dims)) for init in graph.initializer}
    skip = set(excluded)
    counts: dict[str, tuple[int, int]] = {}
    for node in graph.node:
        if node.op_type in WEIGHTED_OP_TYPES and len(node.input) > 1 and node.input[1] in sizes and node.name not in skip:
            nodes, elements = counts.get(node.op_type, (0, 0))
            counts[node.op_type] = (nodes + 1, elements + sizes[node.input[1]])
    return counts


#: int8-dynamic leaves convolutions float: measured on this project's AVX-512 VNNI host (2 threads), ONNX
#: Runtime's ``quantize_dynamic`` with Conv (``ConvInteger`` + a float rescale, NCHW) ran PP-OCR's
#: direction classifier at 6.3x the FP32 latency, against static int8's fused ``QLinearConv``.
DYNAMIC_CONV_WHY = ("ONNX Runtime's dynamic convolution (ConvInteger, activations quantized per call) is far slower than float "
                    "(PP-OCR's classifier: 6.3x FP32)")


def dynamic_coverage_note(model_path: Path, plan: QuantizationPlan) -> str | None:
    """A note (and the build's warning) when an int8-dynamic plan leaves most of a model's weights float:
    what it quantized, what it did not, why, and what to use instead. None when it covers most weights."""
    counts = weight_elements_by_op(model_path, tuple(plan.excluded))
    total = sum(elements for _, elements in counts.values())
    covered = sum(elements for op, (_, elements) in counts.items() if op in plan.op_types)
    if total == 0 or covered >= total / 2:
        return None
    left = ", ".join(f"{nodes} {op}" for op, (nodes, _) in counts.items() if op not in plan.op_types)
    done = sum(nodes for op, (nodes, _) in counts.items() if op in plan.op_types)
    what = "quantized nothing" if done == 0 else f"quantized {done} MatMul/Gemm node(s), {covered / total:.1%} of the weights"
    return (f"int8-dynamic {what}: {left} node(s) hold the rest and stay float, because {DYNAMIC_CONV_WHY}; "
            "for a convolutional model use int8 (static, calibrated)")


def private_dynamic_inputs(model: Any, dynamic_nodes: set[str]) -> int:
    """Give the ``dynamic_nodes`` that read an activation other nodes read too their own copy of it (one
    ``Identity`` per tensor, shared by its dynamic readers; ONNX Runtime removes it at load), in place; returns
    the copies made. ONNX Runtime's dynamic pass records the tensor a dynamic node reads as quantized and puts a
    DequantizeLinear, writing that same tensor, in front of every other reader: in a static QDQ model that
    tensor is already a DequantizeLinear's output (mobilenet-v2's reduce_1x1 output, read by the next
    expand_1x1 and by the residual Add), and the model defined it twice."""
    from onnx import helper

    graph = model.graph
    dynamic_readers: dict[str, list[Any]] = {}
    shared = {output.name for output in graph.output}
    for node in graph.node:
        if node.name in dynamic_nodes and node.input:
            dynamic_readers.setdefault(node.input[0], []).append(node)
            shared.update(node.input[1:])
        else:
            shared.update(node.input)
    copies = 0
    for tensor, readers in dynamic_readers.items():
        if tensor not in shared:
            continue
        private = f"{tensor}_dynamic_input"
        first = min(list(graph.node).index(node) for node in readers)
        graph.node.insert(first, helper.make_node("Identity", [tensor], [private], name=f"{readers[0].name}_dynamic_input"))
        for node in readers:
            node.input[0] = private
        copies += 1
    return copies


def write_dynamic(fp32_path: Path, out_path: Path, plan: QuantizationPlan, nodes: list[str] | None = None) -> Path:
    """Dynamic int8: int8 weights (per channel), activations quantized per call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # A whole-model pass takes the embedding tables too (ONNX Runtime quantizes Gathers of constant tables).
    op_types = [*plan.op_types, "Gather"] if nodes is None and plan.backend is Backend.ONNXRUNTIME else list(plan.op_types)
    try:
        quantize_dynamic(
            str(fp32_path),
            str(out_path),
            op_types_to_quantize=op_types,
            per_channel=plan.per_channel,
            weight_type=QuantType.QInt8,
            reduce_range=plan.reduce_range,  # 7-bit weights for x86 CPUs without VNNI (edgekit.quantize.cpu_isa)
            nodes_to_quantize=nodes or [],
            nodes_to_exclude=sorted(plan.excluded),
            extra_options={"MatMulConstBOnly": True},
        )
    except Exception as exc:
        raise QuantizationError(f"dynamic int8 quantization of {fp32_path} failed: {exc}") from exc
    return out_path


def gemm_to_matmul(model: Any) -> int:
    """Rewrite plain ``Gemm`` nodes (alpha = beta = 1, constant B) as ``MatMul`` + ``Add`` so that
    weight-only quantizers, which handle MatMul, see the weights of Linear layers too."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    rewritten = 0
    for index, node in enumerate(list(graph.node)):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            continue
        if len(node.input) < 2 or node.input[1] not in initializers:
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if attrs.get("transB", 0):
            weight = weight.T
        name = node.input[1] + "_matmul"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), name))
        matmul_out = node.output[0] + ("_matmul" if len(node.input) > 2 and node.input[2] else "")
        replacement = [helper.make_node("MatMul", [node.input[0], name], [matmul_out], name=node.name or f"gemm_{index}")]
        if len(node.input) > 2 and node.input[2]:
            replacement.append(helper.make_node("Add", [matmul_out, node.input[2]], [node.output[0]], name=(node.name or f"gemm_{index}") + "_bias"))
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new_node in enumerate(replacement):
            graph.node.insert(position + offset, new_node)
        rewritten += 1
    if rewritten:
        used = {i for n in graph.node for i in n.input}
        for init in [i for i in graph.initializer if i.name not in used]:
            graph.initializer.remove(init)
        onnx.checker.check_model(model)
    return rewritten


def write_int4(fp32_path: Path, out_path: Path, plan: QuantizationPlan) -> Path:
    """Weight-only int4, block-wise along the reduction axis. ONNX Runtime gets ``MatMulNBits`` (and
    ``GatherBlockQuantized`` for embeddings when asked); TensorRT gets blocked int4 DequantizeLinear."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    from onnxruntime.quantization.quant_utils import QuantFormat

    settings = plan.int4
    quant_format = QuantFormat.QDQ if plan.backend is Backend.TENSORRT else QuantFormat.QOperator
    block = settings["block_size"]
    model = onnx.load(str(fp32_path), load_external_data=True)
    gemm_to_matmul(model)
    # MatMul weights: RTN, or HQQ's optimised scales and zero points. Embedding tables (Gather) always use
    # RTN: ONNX Runtime's HQQ has no Gather path. Compute stays float (accuracy_level 0): int8 activations
    # inside MatMulNBits cost accuracy and were not faster on AVX-512 VNNI.
    passes: list[Any] = []
    if settings.get("method") == "hqq":
        passes.append(nbits.HQQWeightOnlyQuantConfig(block_size=block, bits=4, op_types_to_quantize=("MatMul",), quant_format=quant_format))
    else:
        passes.append(nbits.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=settings.get("symmetric", True), quant_format=quant_format,
                                                         op_types_to_quantize=("MatMul",), quant_axes=(("MatMul", 0),)))
    if settings.get("include_embeddings"):
        passes.append(nbits.DefaultWeightOnlyQuantConfig(block_size=settings.get("embedding_block_size") or block, is_symmetric=settings.get("symmetric", True),
                                                         quant_format=quant_format, op_types_to_quantize=("Gather",), quant_axes=(("Gather", 1),)))
    for config in passes:
        quantizer = nbits.MatMulNBitsQuantizer(model, nodes_to_exclude=sorted(plan.excluded), algo_config=config)
        try:
            quantizer.process()
        except Exception as exc:
            raise QuantizationError(f"int4 weight-only quantization of {fp32_path} failed: {exc}") from exc
        model = quantizer.model.model
    written = model
    quantized_ops = {"MatMulNBits", "GatherBlockQuantized", "DequantizeLinear"}
    if not any(n.op_type in quantized_ops for n in written.graph.node):
        raise QuantizationError(
            f"int4 weight-only found no MatMul/Gemm/Gather weights to quantize in {fp32_path.name}",
            hint="int4 is for models dominated by MatMul weights (transformers); use int8 for convolutional models",
        )
    return _save(written, out_path)


def temp_path(suffix: str = ".onnx") -> Path:
    return Path(tempfile.mkdtemp(prefix="edgekit-quant-")) / f"model{suffix}"
