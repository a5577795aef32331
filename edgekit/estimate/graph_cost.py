"""Per-node work of an ONNX graph at one input shape: FLOPs (or integer ops), bytes moved, and the
precision the node computes in. Backend-neutral; :mod:`edgekit.estimate.roofline` turns it into time.

Shapes come from ONNX shape inference with the dynamic dims pinned to the benchmark shape; where that
leaves an output without a static shape (Reshape fed by a computed shape, custom ops), the graph is run
once on ONNX Runtime with zero-filled inputs to read every intermediate shape.

Counting rules (a multiply-add counts 2 ops):

* Conv / ConvTranspose / ConvInteger / QLinearConv: ``2 x N x C_out x spatial_out x C_in/group x kernel``.
* MatMul / Gemm / MatMulInteger / QLinearMatMul / MatMulNBits / FusedMatMul: ``2 x batch x M x K x N`` (K as
  :func:`edgekit.estimate.matmul_dims.reduction_dim` reads it: ``transA`` / ``transBatchA`` honoured).
* LSTM / GRU / RNN: ``2 x seq x batch x (input + hidden) x gates x hidden x directions`` (4, 3, 1 gates).
* Attention (ONNX Runtime contrib) / MultiHeadAttention: the QK^T and AV products, ``4 x B x S x S x hidden``.
* elementwise: 1 op an output element (transcendental ops such as Erf, Exp, Tanh, Gelu: :data:`TRANSCENDENTAL_OPS`).
* normalisation (LayerNorm, BatchNorm, InstanceNorm, Softmax, ...): :data:`NORMALIZATION_OPS_PER_ELEMENT` an element.
* pooling: kernel size an output element (global pooling: an input element); Resize: 4 an output element.
* data movement (Reshape, Transpose, Concat, Gather, Slice, ...): no ops, only bytes.

``fusion="implicit"`` (an ONNX graph as exported, the default): an activation, BatchNormalization or constant
bias/scale right after a Conv/MatMul/Gemm that is its only reader is fused into it (:data:`EPILOGUE_OPS`).
``fusion="runtime"`` (a graph the runtime already optimised, e.g. ONNX Runtime's saved ``ORT_ENABLE_ALL`` graph:
:mod:`edgekit.estimate.runtime_graph`): every node left runs as written, no fusion is assumed, and a view op
(Reshape, Squeeze, ...) moves no bytes but still costs its dispatch.
An ``If`` counts the nodes of the branch it takes (:mod:`edgekit.estimate.subgraphs`, each marked ``in_subgraph``) and one
subgraph call; a ``Loop`` / ``Scan`` counts a subgraph call per iteration, its body's node dispatches (``body_node_calls``)
and its body's work per iteration (:mod:`edgekit.estimate.loop_work`: ops and bytes, under the body's heaviest class).
Each node gets a ``kind`` for the kernel that runs it (:func:`node_kind`: conv-dense, conv-depthwise, ...). Nodes whose inputs are all constants are folded at load time (no cost; their outputs count as weights read).
Bytes are what the node reads plus what it writes, each tensor at its stored element size (an int8
weight 1 byte, MatMulNBits' packed 4-bit weights half a byte per value). Quantized forms compute at
int8 (QLinear*, *Integer, and a Conv/MatMul/Gemm whose activation and weight come from
DequantizeLinear: the Q-DQ pattern engines fuse); the Q/DQ nodes of such a pattern are fused (no cost).
MatMulNBits computes at its activation's precision with 4-bit weights (``int4`` weight-only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError
from edgekit.estimate.loop_work import body_work
from edgekit.estimate.matmul_dims import reduction_dim
from edgekit.estimate.subgraphs import inline_taken_branches, loop_bodies


class EstimateError(EdgekitError):
    """An estimate cannot be made as asked (no graph, shape unknown, target without the figures it needs)."""


#: op class -> ONNX op types (default and com.microsoft domains). A test checks every class is counted.
OP_CLASSES: dict[str, tuple[str, ...]] = {
    "conv": ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv", "NhwcConv"),
    "matmul": ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "MatMulNBits", "FusedMatMul", "DynamicQuantizeMatMul",
               "MatMulIntegerToFloat", "QGemm", "Einsum", "FusedGemm", "LSTM", "GRU", "RNN"),  # fmt: skip
    "attention": ("Attention", "MultiHeadAttention", "GroupQueryAttention", "QAttention"),
    "normalization": ("BatchNormalization", "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                      "SkipSimplifiedLayerNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization",
                      "EmbedLayerNormalization", "Softmax", "LogSoftmax", "LpNormalization", "MeanVarianceNormalization"),  # fmt: skip
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "QLinearAveragePool",
                "QLinearGlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
                "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin", "TopK", "CumSum"),  # fmt: skip
    "resize": ("Resize", "Upsample", "GridSample", "RoiAlign", "DepthToSpace", "SpaceToDepth"),
    "data_movement": ("Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Squeeze",
                      "Unsqueeze", "Flatten", "Expand", "Tile", "Pad", "Identity", "Shape", "Size", "Cast", "ScatterND",
                      "ScatterElements", "ConstantOfShape", "Range", "NonZero", "Where", "Trilu", "OneHot", "Constant",
                      "CastLike", "NonMaxSuppression", "Dropout", "ReorderInput", "ReorderOutput", "If"),  # fmt: skip
    "quantize": ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"),
}
#: Everything else with a tensor output counts as elementwise (Add, Mul, Relu, Sigmoid, Clip, Erf, ...).
ELEMENTWISE = "elementwise"
ALL_CLASSES = (*OP_CLASSES, ELEMENTWISE)
_CLASS_OF = {op: cls for cls, ops in OP_CLASSES.items() for op in ops}

TRANSCENDENTAL_OPS = {"Erf": 8, "Exp": 8, "Log": 8, "Tanh": 8, "Sigmoid": 8, "Gelu": 12, "FastGelu": 12, "BiasGelu": 12,
                      "QuickGelu": 10, "Softplus": 10, "HardSwish": 4, "HardSigmoid": 3, "Mish": 16, "Pow": 8, "Sqrt": 4,
                      "Reciprocal": 4, "Div": 4, "Sin": 8, "Cos": 8, "Silu": 10, "Swish": 10}  # fmt: skip
NORMALIZATION_OPS_PER_ELEMENT = 5
RESIZE_OPS_PER_ELEMENT = 4
#: Ops that only relabel a tensor (no data moves on any engine edgekit targets): counted as fused, no cost.
VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant", "Dropout"}
#: Ops that engines fuse into the Conv/MatMul/Gemm producing their input when that is its only reader (ONNX
#: Runtime's Conv+BatchNorm, Conv+activation and MatMul+bias fusions; TensorRT's epilogue fusions): no cost.
EPILOGUE_OPS = {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh"}
#: The same, for a binary op whose other input is a constant (bias add, per-channel scale).
EPILOGUE_CONSTANT_OPS = {"Add", "Mul", "Sub", "Div"}
INT8_COMPUTE_OPS = {"ConvInteger", "QLinearConv", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul",
                    "MatMulIntegerToFloat", "QGemm", "QAttention", "QLinearAveragePool", "QLinearGlobalAveragePool"}  # fmt: skip

_ITEMSIZE = {1: 4.0, 2: 1.0, 3: 1.0, 4: 2.0, 5: 2.0, 6: 4.0, 7: 8.0, 9: 1.0, 10: 2.0, 11: 8.0, 12: 4.0, 13: 8.0, 16: 2.0,
             17: 1.0, 18: 1.0, 19: 1.0, 20: 1.0, 21: 0.5, 22: 0.5, 23: 0.5}  # fmt: skip
#: Q-DQ pattern: the quantized weight's element type -> the precision its product runs at.
_QUANTIZED_PRECISION = {2: "int8", 3: "int8", 17: "fp8", 18: "fp8", 19: "fp8", 20: "fp8", 21: "int4", 22: "int4", 23: "nvfp4"}
_FLOAT_PRECISION = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp32", 17: "fp8", 18: "fp8", 19: "fp8", 20: "fp8", 23: "nvfp4"}


@dataclass(frozen=True)
class NodeCost:
    """One node's work: ``ops`` (FLOPs or integer ops), ``bytes_read``/``bytes_written`` at stored sizes."""

    name: str
    op_type: str
    op_class: str
    precision: str  # the precision its arithmetic runs at: fp32, fp16, int8, ...
    ops: float
    bytes_read: float
    bytes_written: float
    weight_bytes: float
    fused: bool = False  # a Q/DQ node folded into its neighbour: no cost of its own
    kind: str = ""  # the kernel family that runs it (node_kind), for hosts whose kernels were micro-benchmarked
    subgraph_calls: int = 0  # an If that ran: one subgraph invocation (its branch's nodes are costed on their own)
    inputs: tuple[str, ...] = ()  # its activation inputs (tensors not folded to constants), for layer fusion
    outputs: tuple[str, ...] = ()
    gemm_mnk: tuple[int, int, int] = ()  # a conv / matmul as a GEMM: rows (M), output channels (N), reduction (K)
    in_subgraph: bool = False  # brought in from an If branch: runs inside a subgraph (a measured per-node premium)
    body_node_calls: int = 0  # a Loop / Scan: its body's node executions (body nodes x iterations), costed as dispatches
    body_bytes: float = 0.0  # a Loop / Scan: the bytes its body moves over the iterations counted (within bytes_read/written)

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class GraphCost:
    """The per-node work of a graph at ``dims``; ``assumptions`` says what was guessed and why."""

    nodes: tuple[NodeCost, ...]
    dims: dict[str, int]
    weight_bytes: float
    peak_activation_bytes: float
    input_bytes: float
    shape_source: str  # "onnx shape inference" or "onnxruntime probe"
    assumptions: tuple[str, ...] = field(default=())
    tensor_bytes: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  # activation tensor -> bytes

    @property
    def total_ops(self) -> float:
        return sum(n.ops for n in self.nodes)

    def by_class(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for node in self.nodes:
            row = out.setdefault(node.op_class, {"nodes": 0, "ops": 0.0, "bytes": 0.0})
            row["nodes"] += 0 if node.fused else 1
            row["ops"] += node.ops
            row["bytes"] += 0.0 if node.fused else node.bytes
        return out

    def to_json(self) -> dict[str, Any]:
        return {"dims": self.dims, "total_ops": self.total_ops, "weight_bytes": self.weight_bytes,
                "peak_activation_bytes": self.peak_activation_bytes, "input_bytes": self.input_bytes,
                "shape_source": self.shape_source, "assumptions": list(self.assumptions), "by_class": self.by_class(),
                "nodes": [asdict(n) for n in self.nodes]}  # fmt: skip


def op_class(op_type: str) -> str:
    return _CLASS_OF.get(op_type, ELEMENTWISE)


_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: elementwise ops whose kernels evaluate a polynomial or exponential per element (at least 8 ops counted)
_TRANSCENDENTAL_KIND = {op for op, ops in TRANSCENDENTAL_OPS.items() if ops >= 8}
NCHWC_BLOCK_MIN = 8  # the smallest NCHWc channel block (AVX2); fewer input channels take the stem kernel


#: a 1-D convolution writing fewer outputs than this per image and channel runs as GEMMs of a few columns each
#: (ONNX Runtime convolves image by image): another share of the peak than a long signal's
CONV1D_SHORT_OUTPUT = 16
DEPTHWISE_LARGE_AREA = 25  # a depthwise kernel this big (5x5, 7x7) reuses each input more than a 3x3: its own kind
#: normalisations by the kernel that runs them (ONNX Runtime's LayerNorm family: per row over the last axes;
#: InstanceNorm, which GroupNorm exports as: per channel over the spatial axes)
_NORMALIZATION_KIND = {**dict.fromkeys(("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                                        "SkipSimplifiedLayerNormalization", "RMSNormalization"), "layernorm"),
                       **dict.fromkeys(("InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization"), "instancenorm")}  # fmt: skip
LAYERNORM_NARROW = 64  # a LayerNorm over fewer features a row than this: layernorm-narrow (its per-row reductions dominate)
GELU_OPS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"}


def _conv_kind(node: Any, shapes: Mapping[str, tuple[tuple[int, ...], int]]) -> str:
    """conv-dense / -pointwise / -depthwise(-large) / -stem for 2-D convolutions; conv-1d / -1d-short / -1d-stem for
    1-D ones (im2col and a GEMM per image, no NCHWc kernel); conv-other for the rest (3-D, grouped, integer)."""
    if node.op_type not in ("Conv", "FusedConv", "NhwcConv"):
        return "conv-other"
    weight = shapes.get(node.input[1], ((), 1))[0] if len(node.input) > 1 else ()
    group = int(_attr(node, "group", 1))
    if len(weight) == 3 and group == 1:
        output = shapes.get(node.output[0], ((), 1))[0] if node.output else ()
        if len(output) == 3 and output[2] < CONV1D_SHORT_OUTPUT:
            return "conv-1d-short"
        return "conv-1d-stem" if weight[1] < NCHWC_BLOCK_MIN else "conv-1d"
    if len(weight) != 4:
        return "conv-other"  # 3-D and grouped 1-D convolutions
    if group > 1:
        if weight[1] != 1:
            return "conv-other"
        return "conv-depthwise-large" if weight[2] * weight[3] >= DEPTHWISE_LARGE_AREA else "conv-depthwise"
    if weight[1] < NCHWC_BLOCK_MIN:
        return "conv-stem"
    return "conv-pointwise" if weight[2] == weight[3] == 1 else "conv-dense"


def _kind(node: Any, shapes: Mapping[str, tuple[tuple[int, ...], int]]) -> str:
    """The kernel family a node runs on: its class, and for convolutions, normalisations and elementwise ops the
    variant whose speed differs (a depthwise or 3-channel stem convolution reaches another share of the GEMM peak than
    a dense one; a LayerNorm another share of the bandwidth than a Softmax; GELU's polynomial than a Tanh)."""
    cls = op_class(node.op_type)
    if cls == "conv":
        return _conv_kind(node, shapes)
    if cls == "matmul":
        return "matmul" if node.op_type in ("MatMul", "Gemm", "FusedMatMul", "FusedGemm") else "matmul-other"
    if cls == "normalization":
        kind = _NORMALIZATION_KIND.get(node.op_type, cls)
        features = shapes.get(node.input[0], ((), 1))[0][-1:] if node.input else ()
        return f"{kind}-narrow" if kind == "layernorm" and features and features[0] < LAYERNORM_NARROW else kind
    if cls == ELEMENTWISE:
        if node.op_type in GELU_OPS:
            return "gelu"
        return "elementwise-transcendental" if node.op_type in _TRANSCENDENTAL_KIND else "elementwise-simple"
    return cls


def node_kind(node: NodeCost) -> str:
    return node.kind or node.op_class


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise EstimateError(f"no ONNX model at {path}", hint="pass a bundle directory, a model.onnx file or a recipe")
        try:
            return onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError and others: all mean "not a model"
            raise EstimateError(f"{path} is not a readable ONNX model: {exc}", hint="pass the bundle's model.onnx") from exc
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # dims are pinned in place: leave the caller's graph as it was
    return copy


def _pin_inputs(model: Any, dims: Mapping[str, int], assumptions: list[str], input_shapes: Mapping[str, Any] | None = None) -> None:
    init_names = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in init_names:
            continue
        if input_shapes and value.name in input_shapes:
            shape = [int(d) for d in input_shapes[value.name]]
            del value.type.tensor_type.shape.dim[:]
            for size in shape:
                value.type.tensor_type.shape.dim.add().dim_value = size
            continue
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            name = dim.dim_param
            if name in dims:
                dim.dim_value = int(dims[name])
            else:
                dim.dim_value = 1
                assumptions.append(f"input '{value.name}' dim {index} ('{name or 'unnamed'}') not given: taken as 1")


def _shapes_by_inference(model: Any) -> dict[str, tuple[tuple[int, ...], int]]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference fails on some contrib graphs: the ORT probe below covers them
        inferred = model
    shapes: dict[str, tuple[tuple[int, ...], int]] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        if all(d >= 0 for d in dims):
            shapes[value.name] = (tuple(dims), tensor.elem_type)
    for init in model.graph.initializer:
        shapes[init.name] = (tuple(init.dims), init.data_type)
    return shapes


_NP_TO_ONNX = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
               "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}  # fmt: skip
_ORT_TO_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
              "tensor(bool)": np.bool_}  # fmt: skip


def _runnable(model: Any, base: Path | None) -> Any:
    """A copy of ``model`` with its external weights read from ``base`` (the model file's folder), to run it."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if base is not None and any(uses_external_data(init) for init in copy.graph.initializer):
        load_external_data_for_model(copy, str(base))
    return copy


def _feeds(model: Any, dims: Mapping[str, int], input_shapes: Mapping[str, Any] | None,
           input_values: Mapping[str, Any] | None) -> dict[str, np.ndarray]:  # fmt: skip
    """The benchmark's input arrays where given, else zeros of the pinned input shapes."""
    import onnx

    initializers = {i.name for i in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if input_values and value.name in input_values:
            feeds[value.name] = np.asarray(input_values[value.name])
            continue
        tensor = value.type.tensor_type
        shape = [int(input_shapes[value.name][i]) if input_shapes and value.name in input_shapes
                 else (d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else int(dims.get(d.dim_param, 1)))
                 for i, d in enumerate(tensor.shape.dim)]  # fmt: skip
        feeds[value.name] = np.zeros(shape, dtype=onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type or 1))
    return feeds


def _shapes_by_probe(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], int]]:
    """Run the graph once on ONNX Runtime (CPU, the benchmark's inputs or zeros) with every node output as a graph output."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for out in node.output:
            if out and out not in known:
                probe.graph.output.append(onnx.ValueInfoProto(name=out))
                known.add(out)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # a failed probe is said in the assumptions, not on stderr
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {value.name for value in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    shapes: dict[str, tuple[tuple[int, ...], int]] = {}
    for name, array in zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})):
        if isinstance(array, np.ndarray):
            shapes[name] = (tuple(array.shape), _NP_TO_ONNX.get(str(array.dtype), 1))
    for name, array in feeds.items():
        shapes[name] = (tuple(array.shape), _NP_TO_ONNX.get(str(array.dtype), 1))
    for init in model.graph.initializer:
        shapes[init.name] = (tuple(init.dims), init.data_type)
    return shapes


def _numel(shape: tuple[int, ...]) -> float:
    return float(math.prod(shape)) if shape else 1.0


def _attr(node: Any, name: str, default: Any) -> Any:
    import onnx

    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _ops(node: Any, shapes: Mapping[str, tuple[tuple[int, ...], int]], out_shape: tuple[int, ...]) -> float:
    op = node.op_type
    cls = op_class(op)
    first = shapes.get(node.input[0], ((), 1))[0] if node.input else ()
    out = _numel(out_shape)
    if cls == "conv":
        weight_index = 3 if op == "QLinearConv" else 1
        weight = shapes.get(node.input[weight_index], ((), 1))[0] if len(node.input) > weight_index else ()
        if len(weight) < 3:
            return 0.0
        if op == "ConvTranspose":  # weight (C_in, C_out/group, k...): each input element scatters into C_out/group x kernel
            return 2.0 * _numel(first) * weight[1] * _numel(weight[2:])
        return 2.0 * out * weight[1] * _numel(weight[2:])  # weight (C_out, C_in/group, k...)
    if cls == "matmul":
        if op in _RECURRENT_GATES:  # X [seq, batch, input], W [dirs, gates x hidden, input]
            weight = shapes.get(node.input[1], ((), 1))[0] if len(node.input) > 1 else ()
            if len(first) < 3 or len(weight) < 3:
                return 0.0
            hidden = float(_attr(node, "hidden_size", weight[1] // _RECURRENT_GATES[op]))
            return 2.0 * first[0] * first[1] * (first[2] + hidden) * weight[1] * weight[0]
        if op == "Einsum":
            return 2.0 * max(out, _numel(first))  # a lower bound: contraction size is not read here
        k = float(_attr(node, "K", first[-1] if first else 0)) if op == "MatMulNBits" else float(reduction_dim(node, first))
        return 2.0 * out * k
    if cls == "attention":
        if len(first) == 3:
            batch, seq, hidden = first
            if op in ("Attention", "QAttention"):
                return 4.0 * batch * seq * seq * out_shape[-1] + 2.0 * batch * seq * hidden * 3 * out_shape[-1]
            return 4.0 * batch * seq * seq * hidden
        return 0.0
    if cls == "normalization":
        return NORMALIZATION_OPS_PER_ELEMENT * out
    if cls == "pooling":
        if op.startswith("Global") or op.startswith("Reduce") or op in ("ArgMax", "ArgMin", "TopK", "CumSum", "QLinearGlobalAveragePool"):
            return _numel(first)
        return out * float(math.prod(_attr(node, "kernel_shape", [1])))
    if cls == "resize":
        return RESIZE_OPS_PER_ELEMENT * out
    if cls in ("data_movement", "quantize"):
        return 0.0 if cls == "data_movement" else out
    return out * TRANSCENDENTAL_OPS.get(op, 1)


def _gemm_mnk(node: Any, shapes: Mapping[str, tuple[tuple[int, ...], int]], out_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """A Conv (implicit GEMM: M = batch x output pixels, N = output channels, K = input channels / group x kernel) or a
    MatMul / Gemm (M = all rows, N, K) as GEMM dimensions; () for anything else or an unknown shape."""
    if node.op_type in ("Conv", "FusedConv", "ConvInteger") and len(node.input) > 1 and len(out_shape) >= 3:
        weight = shapes.get(node.input[1], ((), 1))[0]
        if len(weight) >= 3:
            return int(_numel(out_shape) // max(out_shape[1], 1)), int(weight[0]), int(_numel(weight[1:]))
    if node.op_type in ("MatMul", "Gemm", "MatMulInteger", "FusedMatMul", "FusedGemm") and len(node.input) > 1 and out_shape:
        first, second = shapes.get(node.input[0], ((), 1))[0], shapes.get(node.input[1], ((), 1))[0]
        if first and second:
            n = int(out_shape[-1])
            return int(_numel(out_shape) // max(n, 1)), n, reduction_dim(node, first)
    return ()


def _precision(node: Any, shapes: Mapping[str, tuple[tuple[int, ...], int]], producers: Mapping[str, Any]) -> str:
    op = node.op_type
    if op in INT8_COMPUTE_OPS:
        return "int8"
    if op_class(op) in ("conv", "matmul") and len(node.input) >= 2:
        a, b = (producers.get(name) for name in node.input[:2])
        if a is not None and b is not None and a.op_type == "DequantizeLinear" and b.op_type == "DequantizeLinear":
            stored = shapes.get(b.input[0], ((), 3))[1]  # the weight's stored type decides the format
            return _QUANTIZED_PRECISION.get(stored, "int8")
    for name in node.input:
        if name and name in shapes and shapes[name][1] in _FLOAT_PRECISION:
            return _FLOAT_PRECISION[shapes[name][1]]
    return "fp32"


FUSION_MODES = ("implicit", "runtime")


def graph_costs(model: Any, dims: Mapping[str, int] | None = None, *, input_shapes: Mapping[str, Any] | None = None,
                input_values: Mapping[str, Any] | None = None, fusion: str = "implicit") -> GraphCost:  # fmt: skip
    """The per-node work of ``model`` (a path or ModelProto) with dynamic dims pinned to ``dims``
    (or whole input shapes to ``input_shapes``: input name -> shape, e.g. from the arrays a benchmark feeds;
    ``input_values``: those arrays, which decide the branch an If takes). ``fusion``: see the module docstring."""
    if fusion not in FUSION_MODES:
        raise EstimateError(f"fusion '{fusion}' is not one of {', '.join(FUSION_MODES)}", hint="'runtime' for a graph the runtime optimised")
    dims = dict(dims or {})
    path = Path(model) if isinstance(model, (str, Path)) else None
    proto = _load(model)
    assumptions: list[str] = []
    if input_values and not input_shapes:
        input_shapes = {k: np.asarray(v).shape for k, v in input_values.items()}
    _pin_inputs(proto, dims, assumptions, input_shapes)
    base = path.parent if path is not None else None
    feeds = lambda: _feeds(proto, dims, input_shapes, input_values)  # noqa: E731
    if_calls, notes = inline_taken_branches(proto, feeds, prepare=lambda m: _runnable(m, base))
    assumptions.extend(notes)
    inlined = {out for call in if_calls for out in call.inlined}
    shapes = _shapes_by_inference(proto)
    source = "onnx shape inference"
    missing = [out for node in proto.graph.node for out in node.output[:1] if out and out not in shapes]
    if missing:
        try:
            shapes = _shapes_by_probe(_runnable(proto, base), feeds())
            source = "onnxruntime probe"
        except Exception as exc:  # ORT cannot run it on CPU: keep the inferred shapes and say what is unknown
            assumptions.append(f"shape probe on ONNX Runtime failed ({type(exc).__name__}): {len(missing)} node(s) without "
                               "a static output shape count no work")  # fmt: skip
    loops, loop_notes = loop_bodies(proto, shapes)
    assumptions.extend(loop_notes)
    work, work_notes = body_work(proto, loops, shapes, lambda body, fed: graph_costs(body, input_shapes=fed, fusion=fusion))
    assumptions.extend(work_notes)
    initializers = {i.name for i in proto.graph.initializer}
    constants = {out for node in proto.graph.node if node.op_type == "Constant" for out in node.output}
    producers = {out: node for node in proto.graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def nbytes(name: str) -> float:
        shape, dtype = shapes.get(name, ((), 1))
        return _numel(shape) * _ITEMSIZE.get(dtype, 4.0) if name in shapes else 0.0

    # nodes computed from constants only are folded when the runtime loads the graph (ONNX Runtime, TensorRT)
    folded: set[str] = set(initializers | constants)
    for node in proto.graph.node:
        if node.input and all(not name or name in folded for name in node.input):
            folded.update(out for out in node.output if out)
    precisions: dict[str, str] = {}
    for node in proto.graph.node:
        precisions[node.name or node.output[0]] = _precision(node, shapes, producers)
    nodes: list[NodeCost] = []
    epilogue: set[str] = set()  # outputs of ops fused into the Conv/MatMul before them (a chain: bias, then activation)
    for node in proto.graph.node:
        key = node.name or node.output[0]
        cls = op_class(node.op_type)
        weights = [n for n in node.input if n in folded]
        acts = [n for n in node.input if n and n not in folded]
        fused = view = False
        if fusion == "runtime":  # the runtime fused what it fuses: every node left runs; views move no bytes
            fused = bool(node.output) and node.output[0] in folded
            view = node.op_type in VIEW_OPS
        elif cls == "quantize":
            neighbours = consumers.get(node.output[0], []) + [producers[n] for n in node.input[:1] if n in producers]
            weight_only = node.op_type == "DequantizeLinear" and node.input and (node.input[0] in initializers)
            fused = bool(weight_only) or any(precisions.get(n.name or n.output[0]) == "int8" and op_class(n.op_type) != "quantize"
                                             for n in neighbours) or any(n.op_type == "QuantizeLinear" or n.op_type == "DequantizeLinear"
                                                                         for n in neighbours)  # fmt: skip
        if fusion == "runtime":
            pass
        elif node.op_type in VIEW_OPS or (node.output and node.output[0] in folded):
            fused = True
        elif node.op_type in EPILOGUE_OPS or (node.op_type in EPILOGUE_CONSTANT_OPS and len(node.input) == 2
                                               and node.input[1] in folded):  # fmt: skip
            producer = producers.get(node.input[0]) if node.input else None
            if producer is not None and len(consumers.get(node.input[0], [])) == 1 and (
                    op_class(producer.op_type) in ("conv", "matmul") or producer.output[0] in epilogue):  # fmt: skip
                fused = True
                epilogue.add(node.output[0])
        out_shape = shapes.get(node.output[0], ((), 1))[0] if node.output and node.output[0] in shapes else ()
        known = bool(node.output) and node.output[0] in shapes
        idle = fused or view
        node_cost = NodeCost(
            name=key, op_type=node.op_type, op_class=cls, precision=precisions[key],
            ops=0.0 if idle or not known else _ops(node, shapes, out_shape),
            bytes_read=0.0 if idle else sum(nbytes(n) for n in acts) + sum(nbytes(n) for n in weights),
            bytes_written=0.0 if idle else sum(nbytes(n) for n in node.output if n),
            weight_bytes=sum(nbytes(n) for n in weights), fused=fused, kind=_kind(node, shapes),
            inputs=tuple(acts), outputs=tuple(n for n in node.output if n), gemm_mnk=_gemm_mnk(node, shapes, out_shape),
            in_subgraph=bool(node.output) and node.output[0] in inlined,
            subgraph_calls=loops[key].iterations if key in loops else 0,
            body_node_calls=loops[key].iterations * loops[key].body_nodes if key in loops else 0,
        )  # fmt: skip
        nodes.append(work[key].added_to(node_cost, loops[key].iterations) if key in work else node_cost)
    for call in if_calls:  # the If itself: no work of its own, one subgraph invocation
        nodes.append(NodeCost(name=call.name, op_type="If", op_class="data_movement", precision="fp32", ops=0.0, bytes_read=0.0,
                              bytes_written=0.0, weight_bytes=0.0, kind="subgraph", subgraph_calls=1))  # fmt: skip
    assumptions.extend(_unknown_ops_note(proto))
    weight_bytes = sum(nbytes(n) for n in initializers)
    input_bytes = sum(nbytes(v.name) for v in proto.graph.input if v.name not in initializers)
    return GraphCost(nodes=tuple(nodes), dims=dims, weight_bytes=weight_bytes,
                     peak_activation_bytes=_peak_activations(proto, nbytes, folded),
                     input_bytes=input_bytes, shape_source=source, assumptions=tuple(assumptions),
                     tensor_bytes={name: nbytes(name) for name in shapes if name not in folded})  # fmt: skip


def _unknown_ops_note(proto: Any) -> list[str]:
    """What says that ops neither ONNX nor ONNX Runtime defines (a custom domain's) were costed as elementwise."""
    import onnx.defs

    unknown: dict[str, int] = {}
    for node in proto.graph.node:
        domain = node.domain or ""
        known = domain == "com.microsoft" or (domain in ("", "ai.onnx") and onnx.defs.has(node.op_type))
        if not known and node.op_type not in _CLASS_OF:
            name = f"{domain}::{node.op_type}" if domain else node.op_type
            unknown[name] = unknown.get(name, 0) + 1
    if not unknown:
        return []
    listed = ", ".join(f"{name} x{count}" for name, count in sorted(unknown.items()))
    return [f"{sum(unknown.values())} node(s) of ops neither ONNX nor ONNX Runtime defines ({listed}) costed as elementwise "
            "(1 op an output element): their real cost is unknown, and a runtime without their kernels cannot load the graph"]


def _peak_activations(proto: Any, nbytes: Any, static: set[str]) -> float:
    """Most bytes of intermediate tensors alive at once, running nodes in graph order (each tensor freed after its last reader)."""
    last_use: dict[str, int] = {}
    for index, node in enumerate(proto.graph.node):
        for name in node.input:
            last_use[name] = index
    outputs = {o.name for o in proto.graph.output}
    live: dict[str, float] = {v.name: nbytes(v.name) for v in proto.graph.input if v.name not in static}
    peak = sum(live.values())
    for index, node in enumerate(proto.graph.node):
        for name in node.output:
            if name and name not in static:
                live[name] = nbytes(name)
        peak = max(peak, sum(live.values()))
        for name in list(live):
            if last_use.get(name, -1) <= index and name not in outputs:
                del live[name]
    return peak
