"""Dynamic int8 for ONNX Runtime (``quantize_dynamic``: int8 weights per channel, activations quantized per call),
and what it leaves float: a convolutional model's weights (:func:`dynamic_coverage_note`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend
from edgekit.quantize.plan import QuantizationPlan


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
DYNAMIC_OP_TYPES = ("MatMul", "Gemm")  # what int8-dynamic quantizes here (Conv stays float: see below)
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
    done = sum(nodes for op, (nodes, _) in counts.items() if op in plan.op_types)
    what = "quantized nothing" if done == 0 else f"quantized {done} MatMul/Gemm node(s), {covered / total:.1%} of the weights"
    convs = ", ".join(f"{nodes} {op}" for op, (nodes, _) in counts.items() if op not in plan.op_types and op not in DYNAMIC_OP_TYPES)
    excluded = ", ".join(f"{nodes} {op}" for op, (nodes, _) in counts.items() if op not in plan.op_types and op in DYNAMIC_OP_TYPES)
    reasons = [*([f"{convs} node(s) stay float, because {DYNAMIC_CONV_WHY}"] if convs else []),
               *([f"{excluded} node(s) stay float, excluded by quantization.exclude_op_types"] if excluded else [])]
    return (f"int8-dynamic {what}: " + (" and " if convs else "").join(reasons).replace(" stay float", " hold the rest and stay float", 1)
            + ("; for a convolutional model use int8 (static, calibrated)" if convs else ""))


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
