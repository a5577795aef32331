"""Static int8 for ONNX Runtime's CPU provider, shaped for the kernels that run it.

ONNX Runtime runs a uint8 QDQ convolution as ``QLinearConv`` in channels-last (NHWC) layout: it wraps the
integer chain in ``Transpose`` nodes and cancels those that meet. Two things a CNN exported from PyTorch
does break that chain, and this module mends both:

* **A stem convolution** over one or a few input channels (a 1-channel 3x3 kernel reduces over 9 values)
  gains nothing from int8: the integer kernel pads its reduction to a block and spends its time requantizing.
  :func:`stem_convolutions` names those Conv nodes so that the plan keeps them in float, with the reason.
  Its float output, though, enters the integer chain in NCHW, and ONNX Runtime transposes it to NHWC after
  quantizing (a strided uint8 copy of the widest feature map). :func:`stem_channels_last` computes such a
  stem as patches (a one-hot Conv, whose few channels ONNX Runtime reorders to NHWC cheaply) times the
  kernel matrix (a Gemm with the bias), so that the stem's output is NHWC already and the transpose goes.
* **Flatten before the classifier** (``[N, C, H, W] -> [N, C*H*W] -> Gemm``) reads channels-first order, so
  ONNX Runtime transposes the last feature map back to NCHW (uint8, slow strided copy).
  :func:`flatten_channels_last` flattens in NHWC order instead and permutes the Gemm/MatMul weight rows to
  match: the same function of the input, and the transpose it adds cancels against ONNX Runtime's.

On digits-cnn at batch 64 the float stem and the flatten took the int8 model from 0.52x to 0.43x the FP32
latency (interleaved in one run, one shared two-thread pool). Computing the stem channels-last then saved
2-3 % more on a quiet AVX-512 VNNI host (0.421x -> 0.414x) and 15 % on a busy one (0.59x -> 0.50x), where
the strided transpose suffered most.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: A Conv whose reduction (input channels per group x kernel area) is shorter than this stays float in an
#: ONNX Runtime static int8 plan (digits-cnn's 1x3x3 stem: 9).
STEM_MAX_REDUCTION = 16

#: A stem rewritten by :func:`stem_channels_last` becomes nodes named ``<conv name><this><part>``.
STEM_REWRITE_INFIX = "_channels_last_"

#: Ops between a float stem convolution and the QuantizeLinear that starts the integer chain.
_STEM_ACTIVATIONS = frozenset({"Relu", "Clip"})

#: Ops between a quantized convolution and a flatten that keep ONNX Runtime's NHWC layout.
_LAYOUT_KEEPING_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "MaxPool", "AveragePool", "Relu", "Clip"})


def stem_convolutions(model_path: Path) -> dict[str, str]:
    """Conv node name -> why it stays float, for ungrouped convolutions with a reduction shorter than
    :data:`STEM_MAX_REDUCTION`. A grouped (depthwise) convolution reduces over few values per group by design
    and sits inside the chain, not at its start: kept float, it cut MobileNet-style chains (PP-OCR's
    detector: six 3x3 depthwise convolutions, each a DequantizeLinear -> Conv -> QuantizeLinear detour)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {init.name: tuple(init.dims) for init in graph.initializer}
    stems: dict[str, str] = {}
    from_inputs = _before_any_weighted_op(graph)
    for node in graph.node:
        shape = weights.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if shape is None or len(shape) < 3:
            continue
        if any(a.name == "group" and helper.get_attribute_value(a) > 1 for a in node.attribute):
            continue
        if node.input[0] not in from_inputs:  # a narrow 1x1 inside the network (MobileNetV2 0.5x: 8 channels) is no stem
            continue
        reduction = int(np.prod(shape[1:]))
        if reduction < STEM_MAX_REDUCTION:
            stems[node.name] = (f"stem convolution (reduction {reduction} < {STEM_MAX_REDUCTION}): int8 is slower than float on "
                                "ONNX Runtime's CPU kernels and saves no memory worth having")
    return stems


#: Ops with weights: a convolution after one of them is inside the network, not its stem.
_WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _before_any_weighted_op(graph: Any) -> set[str]:
    """Tensors computed from the graph inputs without passing a weighted op (normalisation, Pad, Cast):
    what a stem convolution reads. MobileNetV2's narrow inner 1x1 convolutions (reduction 8) were
    taken for stems and kept float, each with a layout round trip: its int8 ran at 0.97x FP32 against
    ONNX Runtime's own 0.35x."""
    constants = {init.name for init in graph.initializer} | {o for node in graph.node if node.op_type == "Constant" for o in node.output}
    reached = {value.name for value in graph.input} - constants
    for node in graph.node:  # topological order
        if node.op_type in _WEIGHTED_OPS or node.op_type == "Constant":
            continue
        if any(name in reached for name in node.input) and all(name in reached or name in constants or not name for name in node.input):
            reached.update(node.output)
    return reached


def _consumers_and_initializers(graph: Any) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The nodes reading each tensor, and the initializers by name."""
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers, {init.name: init for init in graph.initializer}


def stem_channels_last(model: Any, leave: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Rewrite, in place, each float stem convolution (see :data:`STEM_MAX_REDUCTION`) whose output enters a
    quantized convolution chain (through Relu/Clip, then QuantizeLinear -> DequantizeLinear -> Conv) as
    ``Conv(one-hot patches) -> Transpose to NHWC -> Reshape [-1, K] -> Gemm(kernel, bias) -> Reshape NHWC ->
    Transpose to NCHW``: the same function of the input, computed channels-last. The last Transpose cancels
    against the one ONNX Runtime puts in front of its NHWC integer convolution. Returns the rewritten Conv
    nodes; a stem with grouped channels, a dynamic output size, or a float consumer is left as it is, and so
    are the convolutions named in ``leave`` (a mixed plan's dynamic int8 nodes, which are float here only until
    the dynamic pass quantizes them by name)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    shapes = _static_shapes(model)
    consumers, initializers = _consumers_and_initializers(graph)
    rewritten: list[str] = []
    for node in list(graph.node):
        if node.op_type != "Conv" or node.name in leave or len(node.input) < 2 or node.input[1] not in initializers:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if weight.ndim != 4 or attributes.get("group", 1) != 1 or int(np.prod(weight.shape[1:])) >= STEM_MAX_REDUCTION:
            continue
        shape = shapes.get(node.output[0])
        if shape is None or len(shape) != 4 or any(d is None for d in shape[1:]):
            continue
        if not _enters_quantized_conv(node.output[0], consumers):
            continue
        out_channels, reduction = weight.shape[0], int(np.prod(weight.shape[1:]))
        prefix = f"{node.name}{STEM_REWRITE_INFIX.rstrip('_')}"
        one_hot = np.eye(reduction, dtype=weight.dtype).reshape(reduction, *weight.shape[1:])
        graph.initializer.extend([
            numpy_helper.from_array(one_hot, f"{prefix}_patch_kernel"),
            numpy_helper.from_array(np.ascontiguousarray(weight.reshape(out_channels, reduction).T), f"{prefix}_kernel"),
            numpy_helper.from_array(np.array([-1, reduction], np.int64), f"{prefix}_rows_shape"),
            numpy_helper.from_array(np.array([-1, shape[2], shape[3], out_channels], np.int64), f"{prefix}_nhwc_shape"),
        ])
        geometry = {k: v for k, v in attributes.items() if k in ("pads", "strides", "dilations", "auto_pad", "kernel_shape")}
        gemm_inputs = [f"{prefix}_rows", f"{prefix}_kernel"] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
        replacement = [
            helper.make_node("Conv", [node.input[0], f"{prefix}_patch_kernel"], [f"{prefix}_patches"], name=f"{prefix}_patches", **geometry),
            helper.make_node("Transpose", [f"{prefix}_patches"], [f"{prefix}_patches_nhwc"], perm=[0, 2, 3, 1], name=f"{prefix}_to_nhwc"),
            helper.make_node("Reshape", [f"{prefix}_patches_nhwc", f"{prefix}_rows_shape"], [f"{prefix}_rows"], name=f"{prefix}_rows"),
            helper.make_node("Gemm", gemm_inputs, [f"{prefix}_gemm"], name=f"{prefix}_gemm"),
            helper.make_node("Reshape", [f"{prefix}_gemm", f"{prefix}_nhwc_shape"], [f"{prefix}_nhwc"], name=f"{prefix}_nhwc"),
            helper.make_node("Transpose", [f"{prefix}_nhwc"], [node.output[0]], perm=[0, 3, 1, 2], name=f"{prefix}_to_nchw"),
        ]
        index = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new_node in enumerate(replacement):
            graph.node.insert(index + offset, new_node)
        if len(consumers.get(node.input[1], [])) == 1:
            graph.initializer.remove(initializers[node.input[1]])
        rewritten.append(node.name)
    return rewritten


def rewritten_from(node_name: str, originals: set[str] | dict[str, str]) -> str | None:
    """The original node (of ``originals``) that :func:`stem_channels_last` turned into ``node_name``, if any."""
    original = node_name.split(STEM_REWRITE_INFIX, 1)[0] if STEM_REWRITE_INFIX in node_name else None
    return original if original in originals else None


def _enters_quantized_conv(tensor: str, consumers: dict[str, list[Any]]) -> bool:
    """Whether every path from ``tensor`` goes (through Relu/Clip) into QuantizeLinear -> DequantizeLinear -> Conv."""
    readers = consumers.get(tensor, [])
    while len(readers) == 1 and readers[0].op_type in _STEM_ACTIVATIONS:
        readers = consumers.get(readers[0].output[0], [])
    if not readers or any(reader.op_type != "QuantizeLinear" for reader in readers):
        return False
    dequantizers = [node for reader in readers for node in consumers.get(reader.output[0], [])]
    if not dequantizers or any(node.op_type != "DequantizeLinear" for node in dequantizers):
        return False
    final = [node for dq in dequantizers for node in consumers.get(dq.output[0], [])]
    return bool(final) and all(node.op_type == "Conv" for node in final)


def flatten_channels_last(model: Any) -> list[str]:
    """Rewrite, in place, each flatten of a quantized convolution's feature map that feeds one Gemm/MatMul
    weight: flatten in NHWC order and permute the weight's input rows to match. Returns the rewritten
    flatten nodes. A flatten whose shape is unknown, whose producer is not a quantized Conv chain, or whose
    weight has another consumer is left as it is."""
    from onnx import helper, numpy_helper

    graph = model.graph
    shapes = _static_shapes(model)
    producers = {out: node for node in graph.node for out in node.output}
    consumers, initializers = _consumers_and_initializers(graph)
    rewritten: list[str] = []
    for node in list(graph.node):
        if not _is_flatten(node, initializers):
            continue
        shape = shapes.get(node.input[0])
        if shape is None or len(shape) != 4 or any(d is None for d in shape[1:]) or shape[2] * shape[3] == 1:
            continue
        if not _from_quantized_conv(node.input[0], producers):
            continue
        weight = _single_weight(node.output[0], consumers, producers, initializers)
        if weight is None:
            continue
        tensor, axis = weight
        channels, height, width = shape[1], shape[2], shape[3]
        array = numpy_helper.to_array(tensor)
        if array.shape[axis] != channels * height * width:
            continue
        # Row (h, w, c) of the NHWC flatten is row (c, h, w) of the NCHW one.
        order = np.arange(channels * height * width).reshape(channels, height, width).transpose(1, 2, 0).reshape(-1)
        tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(np.take(array, order, axis=axis)), tensor.name))
        transposed = f"{node.input[0]}_channels_last"
        transpose = helper.make_node("Transpose", [node.input[0]], [transposed], perm=[0, 2, 3, 1], name=f"{node.name}_channels_last")
        node.input[0] = transposed
        graph.node.insert(list(graph.node).index(node), transpose)
        rewritten.append(node.name)
    return rewritten


def _static_shapes(model: Any) -> dict[str, list[int | None]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int | None]] = {}
    for info in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    return shapes


def _is_flatten(node: Any, initializers: dict[str, Any]) -> bool:
    from onnx import helper, numpy_helper

    if node.op_type == "Flatten":
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
        return bool(axis == 1)
    if node.op_type == "Reshape" and node.input[1] in initializers:
        target = numpy_helper.to_array(initializers[node.input[1]])
        return target.shape == (2,) and int(target[1]) > 0  # [-1 | 0 | N, C*H*W]; checked against the weight later
    return False


def _from_quantized_conv(tensor: str, producers: dict[str, Any]) -> bool:
    """Whether ``tensor`` comes from a Conv with quantized inputs through layout-keeping ops only."""
    node = producers.get(tensor)
    while node is not None and node.op_type in _LAYOUT_KEEPING_OPS:
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Conv":
        return False
    source = producers.get(node.input[0])
    return source is not None and source.op_type == "DequantizeLinear"


def _single_weight(tensor: str, consumers: dict[str, list[Any]], producers: dict[str, Any],
                   initializers: dict[str, Any]) -> tuple[Any, int] | None:
    """(initializer, input-row axis) of the one Gemm/MatMul that reads ``tensor`` (through a Q/DQ pair), or None."""
    from onnx import helper

    readers = consumers.get(tensor, [])
    while len(readers) == 1 and readers[0].op_type in ("QuantizeLinear", "DequantizeLinear"):
        readers = consumers.get(readers[0].output[0], [])
    if len(readers) != 1 or readers[0].op_type not in ("Gemm", "MatMul") or readers[0].input[0] == readers[0].input[1]:
        return None
    reader = readers[0]
    weight_name = reader.input[1]
    dequantize = producers.get(weight_name)
    if dequantize is not None and dequantize.op_type == "DequantizeLinear":
        axis = next((helper.get_attribute_value(a) for a in dequantize.attribute if a.name == "axis"), 1)
        weight_name = dequantize.input[0]
        if len(consumers.get(dequantize.output[0], [])) != 1:
            return None
    else:
        axis = None
    tensor_proto = initializers.get(weight_name)
    if tensor_proto is None or len(tensor_proto.dims) != 2 or len(consumers.get(weight_name, [])) != 1:
        return None
    transposed = reader.op_type == "Gemm" and any(a.name == "transB" and helper.get_attribute_value(a) for a in reader.attribute)
    row_axis = 1 if transposed else 0
    if axis is not None and dequantize is not None and axis % 2 == row_axis:
        scale = initializers.get(dequantize.input[1])
        if scale is None or int(np.prod(scale.dims)) > 1:
            return None  # scales along the permuted rows would need permuting too
    return tensor_proto, row_axis
