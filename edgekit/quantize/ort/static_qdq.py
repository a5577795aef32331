"""Static int8 as QDQ for ONNX Runtime: :func:`write_static_qdq` inserts QuantizeLinear/DequantizeLinear pairs with
edgekit's calibrated ranges, then repairs what ONNX Runtime's quantizer leaves (subgraph readers of folded activations,
float consumers reading through a Q/DQ pair, NHWC layout, dynamic nodes inside a static plan, embedding tables)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend
from edgekit.quantize.ort import layout
from edgekit.quantize.ort.dynamic import private_dynamic_inputs, write_dynamic
from edgekit.quantize.ort.graph_files import save_model
from edgekit.quantize.ort.static_plan import outside_conv_region, static_op_types
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)


class Range(Protocol):
    min: float
    max: float


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
        raise QuantizerNodeError.from_exception(exc, fp32_path, model) from exc
    rewire_subgraph_readers_of_folded(quantizer.model.model, activations, fp32_path)
    if plan.float_consumers_skip_qdq:
        quantized = {n.name for n in model.graph.node if n.op_type in plan.op_types and n.name not in skip}
        rewire_float_consumers(quantizer.model.model, quantized, activations)
    if plan.channels_last_flatten:
        layout.flatten_channels_last(quantizer.model.model)
    if plan.channels_last_stem:
        layout.stem_channels_last(quantizer.model.model, leave=set(plan.dynamic_nodes))
    if plan.dynamic_nodes:
        private_dynamic_inputs(quantizer.model.model, set(plan.dynamic_nodes))
    staged = save_model(quantizer.model.model, out_path.with_name(out_path.stem + ".static.onnx"))
    if plan.dynamic_nodes:
        write_dynamic(staged, out_path, plan, nodes=list(plan.dynamic_nodes))
        staged.unlink()
    else:
        staged.replace(out_path)
    if plan.backend is Backend.ONNXRUNTIME:
        quantize_embedding_tables(out_path, plan)
    return out_path


class QuantizerNodeError(QuantizationError):
    """ONNX Runtime's QDQ quantizer raised while writing one node (``node``: its name, None where the traceback
    does not say which)."""

    def __init__(self, message: str, hint: str, node: str | None) -> None:
        super().__init__(message, hint=hint)
        self.node = node

    @classmethod
    def from_exception(cls, exc: Exception, fp32_path: Path, model: Any) -> "QuantizerNodeError":
        node = failing_node(exc, {n.name for n in model.graph.node})
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if node is None:
            return cls(f"static QDQ quantization of {fp32_path} failed inside ONNX Runtime's quantizer, which names no node: {cause}",
                       hint="keep the op type float (quantization.exclude_op_types), or find the node by excluding halves of them "
                            "(quantization.exclude_nodes)", node=None)
        op_type = next(n.op_type for n in model.graph.node if n.name == node)
        return cls(f"static QDQ quantization of {fp32_path} failed at {op_type} node '{node}' inside ONNX Runtime's quantizer: {cause}",
                   hint=f"keep the node float: quantization.exclude_nodes: [{node}]", node=node)


def failing_node(exc: BaseException, names: set[str]) -> str | None:
    """The graph node ONNX Runtime's quantizer was writing when it raised ``exc``: from the innermost frame of the
    traceback that holds one (a ``node`` being quantized, or the ``bias_info`` of a bias being scaled)."""
    import traceback

    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        local = frame.f_locals
        bias_info = local.get("bias_info")
        candidates = [getattr(bias_info, "node_name", None), getattr(local.get("node"), "name", None)]
        for name in candidates:
            if isinstance(name, str) and name in names:
                return name
    return None


#: How many nodes :func:`write_static_qdq_around_failures` keeps float before it gives up.
MAX_NODES_KEPT_FLOAT_FOR_QUANTIZER = 8


def write_static_qdq_around_failures(fp32_path: Path, out_path: Path, plan: QuantizationPlan, ranges: Mapping[str, Range]) -> QuantizationPlan:
    """:func:`write_static_qdq`; where ONNX Runtime's quantizer fails at a node it names, that node is kept float and
    the graph written again. Returns the plan as written: the kept nodes are in ``excluded``, with the quantizer's error
    as the reason (the manifest records it), and the build log warns. A failure that names no node, or names one
    already kept, is raised."""
    for _ in range(MAX_NODES_KEPT_FLOAT_FOR_QUANTIZER + 1):
        try:
            write_static_qdq(fp32_path, out_path, plan, ranges)
            return plan
        except QuantizerNodeError as exc:
            if exc.node is None or exc.node in plan.excluded:
                raise
            log.warning("int8: ONNX Runtime's quantizer failed at node '%s' (%s); that node stays float and the graph is written again",
                        exc.node, exc.__cause__)
            plan = plan.excluding({exc.node: f"ONNX Runtime's quantizer failed on it ({type(exc.__cause__).__name__}: {exc.__cause__}); kept float"})
    raise QuantizationError(f"static QDQ quantization of {fp32_path}: ONNX Runtime's quantizer failed at {MAX_NODES_KEPT_FLOAT_FOR_QUANTIZER} nodes in turn "
                            f"({', '.join(n for n, why in plan.excluded.items() if why.startswith('ONNX Runtime'))})",
                            hint="keep the op type float (quantization.exclude_op_types), or build int8-dynamic")


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
        raise QuantizationError(f"int8 embedding tables of {model_path} failed: ONNX Runtime's quantizer raised {type(exc).__name__}"
                                f"{f': {exc}' if str(exc) else ''}",
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
