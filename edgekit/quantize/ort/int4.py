"""Weight-only int4, block-wise along the reduction axis: ``MatMulNBits`` (and ``GatherBlockQuantized``) for
ONNX Runtime, blocked int4 DequantizeLinear for TensorRT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend
from edgekit.quantize.ort.dynamic import weight_elements_by_op
from edgekit.quantize.ort.graph_files import save_model
from edgekit.quantize.plan import QuantizationPlan


def gemm_to_matmul(model: Any) -> int:
    """Rewrite plain ``Gemm`` nodes (alpha = beta = 1, constant B) as ``MatMul`` + ``Add`` so that
    weight-only quantizers, which handle MatMul, see the weights of Linear layers too."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    taken = set(initializers) | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    weights: dict[tuple[str, bool], str] = {}  # (Gemm weight, transposed) -> its MatMul weight: tied layers share one
    rewritten = 0
    for index, node in enumerate(list(graph.node)):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            continue
        if len(node.input) < 2 or node.input[1] not in initializers:
            continue
        key = (node.input[1], bool(attrs.get("transB", 0)))
        name = weights.get(key)
        if name is None:
            weight = numpy_helper.to_array(initializers[node.input[1]])
            name = node.input[1] + ("_matmul_t" if key[1] else "_matmul")
            while name in taken:
                name += "_"
            taken.add(name)
            weights[key] = name
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T if key[1] else weight), name))
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
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise QuantizationError(f"int4: rewriting Gemm nodes as MatMul gave an invalid graph: {exc}",
                                    hint="exclude the Gemm nodes (quantization.exclude_op_types: [Gemm]) and report the model") from exc
    return rewritten


#: The op types whose weights int4 quantizes (a Gemm runs as a MatMul, see :func:`gemm_to_matmul`).
INT4_OP_TYPES = ("MatMul", "Gemm")
#: int4 here is weight-only on MatMul (and Gemm, run as MatMul): why a convolution's weights stay float.
INT4_CONV_WHY = "int4 is weight-only on MatMul/Gemm weights (MatMulNBits / blocked DequantizeLinear); convolutions have no int4 path"


def matmul_weight_share(model_path: Path, plan: QuantizationPlan) -> tuple[float, dict[str, tuple[int, int]]]:
    """(share of the model's weight elements in the MatMul/Gemm nodes an int4 ``plan`` quantizes, op type -> (nodes,
    weight elements)) over the weighted ops (:data:`edgekit.quantize.ort.dynamic.WEIGHTED_OP_TYPES`)."""
    counts = weight_elements_by_op(model_path, tuple(plan.excluded))
    total = sum(elements for _, elements in counts.values())
    covered = sum(counts.get(op, (0, 0))[1] for op in INT4_OP_TYPES if op in plan.op_types)
    return (covered / total if total else 0.0), counts


def int4_coverage_note(model_path: Path, plan: QuantizationPlan) -> str | None:
    """A note (and the build's warning) when an int4 plan leaves most of a model's weights float, as
    :func:`edgekit.quantize.ort.dynamic.dynamic_coverage_note` does for int8-dynamic. None when it covers at least half."""
    share, counts = matmul_weight_share(model_path, plan)
    if not counts or share >= 0.5:
        return None
    done = sum(nodes for op, (nodes, _) in counts.items() if op in INT4_OP_TYPES and op in plan.op_types)
    rest = ", ".join(f"{nodes} {op}" for op, (nodes, _) in counts.items() if op not in INT4_OP_TYPES)
    excluded = ", ".join(f"{nodes} {op}" for op, (nodes, _) in counts.items() if op in INT4_OP_TYPES and op not in plan.op_types)
    reasons = [*([f"{rest} node(s) hold the rest and stay float, because {INT4_CONV_WHY}"] if rest else []),
               *([f"{excluded} node(s) stay float, excluded by quantization.exclude_op_types"] if excluded else [])]
    return (f"int4 quantized {done} MatMul/Gemm node(s), only {share:.1%} of the weights: " + " and ".join(reasons)
            + ("; for a convolutional model use int8 (static, calibrated)" if rest else ""))


def check_int4_settings(settings: dict[str, Any], backend: Backend) -> None:
    """Refuse int4 settings the writers cannot honour, before any work: HQQ writes ``MatMulNBits`` (ONNX Runtime only)
    with a zero point per block (never symmetric)."""
    if settings.get("method") != "hqq":
        return
    if backend is not Backend.ONNXRUNTIME:
        raise QuantizationError(f"int4.method hqq cannot build for the {backend.value} backend: hqq writes MatMulNBits, ONNX Runtime only",
                                hint=f"use int4.method: rtn for {'TensorRT' if backend is Backend.TENSORRT else backend.value} "
                                "(blocked int4 DequantizeLinear), or build for the onnxruntime backend")
    if settings.get("symmetric"):
        raise QuantizationError("int4.method hqq is always asymmetric (a zero point per block), so symmetric: true cannot hold",
                                hint="remove int4.symmetric (or set it to false) to use hqq, or use int4.method: rtn for symmetric int4")


def write_int4(fp32_path: Path, out_path: Path, plan: QuantizationPlan) -> Path:
    """Weight-only int4, block-wise along the reduction axis. ONNX Runtime gets ``MatMulNBits`` (and
    ``GatherBlockQuantized`` for embeddings when asked); TensorRT gets blocked int4 DequantizeLinear."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    from onnxruntime.quantization.quant_utils import QuantFormat

    settings = plan.int4
    check_int4_settings(settings, plan.backend)
    quant_format = QuantFormat.QDQ if plan.backend is Backend.TENSORRT else QuantFormat.QOperator
    block = settings["block_size"]
    model = onnx.load(str(fp32_path), load_external_data=True)
    excluded = set(plan.excluded)
    if "MatMul" not in plan.op_types:  # quantization.exclude_op_types: [MatMul] keeps the model's own MatMuls float
        for index, node in enumerate(model.graph.node):
            if node.op_type == "MatMul":
                node.name = node.name or f"matmul_{index}"
                excluded.add(node.name)
    if "Gemm" in plan.op_types:
        gemm_to_matmul(model)
    # MatMul weights: RTN, or HQQ's optimised scales and zero points. Embedding tables (Gather) always use
    # RTN: ONNX Runtime's HQQ has no Gather path. Compute stays float (accuracy_level 0): int8 activations
    # inside MatMulNBits cost accuracy and were not faster on AVX-512 VNNI.
    passes: list[Any] = []
    try:
        if settings.get("method") == "hqq":
            passes.append(nbits.HQQWeightOnlyQuantConfig(block_size=block, bits=4, op_types_to_quantize=("MatMul",), quant_format=quant_format))
        else:
            passes.append(nbits.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=settings.get("symmetric", True), quant_format=quant_format,
                                                             op_types_to_quantize=("MatMul",), quant_axes=(("MatMul", 0),)))
        if settings.get("include_embeddings"):
            passes.append(nbits.DefaultWeightOnlyQuantConfig(block_size=settings.get("embedding_block_size") or block,
                                                             is_symmetric=settings.get("symmetric", True), quant_format=quant_format,
                                                             op_types_to_quantize=("Gather",), quant_axes=(("Gather", 1),)))
    except Exception as exc:  # ONNX Runtime asserts on settings it does not take
        raise QuantizationError(f"int4 weight-only quantization of {fp32_path}: ONNX Runtime refused the settings {settings} "
                                f"({type(exc).__name__}: {exc})", hint="check build.quantization.int4 in the recipe") from exc
    for config in passes:
        quantizer = nbits.MatMulNBitsQuantizer(model, nodes_to_exclude=sorted(excluded), algo_config=config)
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
    return save_model(written, out_path)
