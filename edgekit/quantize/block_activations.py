"""Run-time block quantization of activations for the MX/NV formats: TensorRT's ``DynamicQuantize``.

TensorRT quantizes a block format's activations while the engine runs: per block of the reduction axis it
takes the block's max |x|, derives the block scale and rounds the elements. Standard ONNX has no such op; the
TensorRT ONNX parser reads it from its own ``trt`` domain, which this module writes in front of every
block-quantized MatMul/Gemm:

- ``mxfp8``: ``trt::TRT_MXFP8DynamicQuantize(x)`` -> (E4M3 elements, E8M0 scales per 32), then
  ``trt::TRT_MXFP8DequantizeLinear`` back to float (W8A8).
- ``nvfp4``: ``trt::TRT_FP4DynamicQuantize(x, s)`` -> (E2M1 elements, E4M3 scales per 16 quantized against the
  calibrated FP32 tensor scale ``s = amax / (6 * 448)``), then ``DequantizeLinear(scales, s)`` and
  ``DequantizeLinear(elements, block scales, block_size=16)`` (W4A4).
- ``mxfp4``: none: TensorRT's DynamicQuantize makes FP4 only with 16-element blocks and E4M3 scales, so MXFP4
  stays weight-only (W4A16) and the manifest says so.

ONNX Runtime cannot run the ``trt`` ops, so the host twin replaces each chain with the same arithmetic in
standard ONNX ops (:func:`emulate_activation_quantizers`): max |x| per block, the OCP MX shared exponent
``floor(log2(amax)) - 8`` computed exactly, ``Cast`` to FLOAT8E4M3FN with saturation, and E2M1 rounding to
nearest even as ``Round`` on the format's three binades. Tests check the emulation against edgekit's codec
bit for bit (tensors whose block max is above 2^-119: below it the scale is a float32 subnormal, which the
host's denormals-as-zero flushes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.precision import Precision

TRT_DOMAIN = "trt"
MXFP8_QUANTIZE, MXFP8_DEQUANTIZE, FP4_QUANTIZE = "TRT_MXFP8DynamicQuantize", "TRT_MXFP8DequantizeLinear", "TRT_FP4DynamicQuantize"
_E4M3_MAX, _E2M1_MAX, _E4M3_EMAX = 448.0, 6.0, 8
_E4M3_SMALLEST = 2.0**-9  # the smallest E4M3 subnormal: NVFP4 block scales never round to zero
_E8M0_MIN_EXPONENT = -127


@dataclass(frozen=True)
class ActivationFormat:
    block: int
    needs_tensor_scale: bool  # a calibrated FP32 scale (NVFP4's double quantization)
    description: str


#: Formats whose activations TensorRT block-quantizes at run time; others are weight-only.
ACTIVATION_FORMATS = {
    Precision.MXFP8: ActivationFormat(32, False, "mxfp8: E4M3 per element, E8M0 scale per 32 along the reduction axis, computed at run time"),
    Precision.NVFP4: ActivationFormat(16, True, "nvfp4: E2M1 per element, E4M3 scale per 16 computed at run time against a calibrated FP32 "
                                                "tensor scale (amax / 2688)"),
}
WEIGHT_ONLY_WHY = {Precision.MXFP4: "TensorRT's DynamicQuantize makes FP4 activations only as NVFP4 (16-element blocks, E4M3 scales): "
                                    "MXFP4 is weight-only (W4A16)"}


def nvfp4_tensor_scale(amax: float) -> float:
    """The FP32 tensor scale of NVFP4 double quantization for a calibrated max |x|."""
    return float(np.float32(max(float(amax), 1e-12)) / np.float32(_E2M1_MAX * _E4M3_MAX))


def quantizer_nodes(source: str, precision: Precision, tensor_scale: float | None) -> tuple[list[Any], list[Any], str]:
    """(initializers, nodes, output) of TensorRT's run-time quantizer for activation ``source``."""
    from onnx import TensorProto, helper, numpy_helper

    fmt = ACTIVATION_FORMATS[precision]
    prefix = f"{source}_{precision.value}"
    if precision is Precision.MXFP8:
        nodes = [
            helper.make_node(MXFP8_QUANTIZE, [source], [prefix + "_e4m3", prefix + "_e8m0"], name=prefix + "_DynamicQuantize",
                             domain=TRT_DOMAIN, axis=-1, block_size=fmt.block, output_dtype=TensorProto.FLOAT8E4M3FN),
            helper.make_node(MXFP8_DEQUANTIZE, [prefix + "_e4m3", prefix + "_e8m0"], [prefix + "_dq"], name=prefix + "_DequantizeLinear",
                             domain=TRT_DOMAIN, axis=-1, block_size=fmt.block, output_dtype=TensorProto.FLOAT),
        ]
        return [], nodes, prefix + "_dq"
    if tensor_scale is None:
        raise ValueError(f"{precision.value} activation quantizer for {source} needs a tensor scale")
    scale = numpy_helper.from_array(np.array(tensor_scale, dtype=np.float32), prefix + "_tensor_scale")
    nodes = [
        helper.make_node(FP4_QUANTIZE, [source, scale.name], [prefix + "_e2m1", prefix + "_e4m3_scales"], name=prefix + "_DynamicQuantize",
                         domain=TRT_DOMAIN, axis=-1, block_size=fmt.block, scale_type=TensorProto.FLOAT8E4M3FN),
        helper.make_node("DequantizeLinear", [prefix + "_e4m3_scales", scale.name], [prefix + "_block_scales"], name=prefix + "_ScaleDequantizeLinear"),
        helper.make_node("DequantizeLinear", [prefix + "_e2m1", prefix + "_block_scales"], [prefix + "_dq"], name=prefix + "_DequantizeLinear",
                         axis=-1, block_size=fmt.block),
    ]
    return [scale], nodes, prefix + "_dq"


# ------------------------------------------------------------------------------------- host emulation


class _Builder:
    """Appends standard-ONNX nodes (and constants) with unique names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.nodes, self.initializers, self._count = prefix, [], [], 0

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        name = f"{self.prefix}_c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        self._count += 1
        out = output or f"{self.prefix}_{op_type.lower()}{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"{self.prefix}_{op_type}{self._count}", **attrs))
        return out


def _e4m3(b: _Builder, x: str) -> str:
    from onnx import TensorProto

    return b.op("Cast", b.op("Cast", x, to=TensorProto.FLOAT8E4M3FN, saturate=1), to=TensorProto.FLOAT)


def _block_amax(b: _Builder, blocks: str) -> str:
    return b.op("ReduceMax", b.op("Abs", blocks), b.const([-1], np.int64), keepdims=1)


def _emulate_mxfp8(b: _Builder, blocks: str) -> str:
    """OCP MX: shared exponent floor(log2(block amax)) - 8, clamped to E8M0's -127; elements E4M3 saturated."""
    from onnx import TensorProto

    amax = _block_amax(b, blocks)
    positive = b.op("Greater", amax, b.const(0.0))
    safe = b.op("Where", positive, amax, b.const(1.0))
    guess = b.op("Floor", b.op("Mul", b.op("Log", safe), b.const(1.0 / math.log(2.0))))
    power = b.op("Pow", b.const(2.0), guess)
    # Log rounds: correct the guess by one either way so that 2^e <= amax < 2^(e+1) holds exactly.
    up = b.op("Cast", b.op("LessOrEqual", b.op("Mul", power, b.const(2.0)), safe), to=TensorProto.FLOAT)
    down = b.op("Cast", b.op("Greater", power, safe), to=TensorProto.FLOAT)
    floor_log2 = b.op("Sub", b.op("Add", guess, up), down)
    floor_log2 = b.op("Where", positive, floor_log2, b.const(float(_E8M0_MIN_EXPONENT)))
    shared = b.op("Max", b.op("Sub", floor_log2, b.const(float(_E4M3_EMAX))), b.const(float(_E8M0_MIN_EXPONENT)))
    elements = _e4m3(b, b.op("Mul", blocks, b.op("Pow", b.const(2.0), b.op("Neg", shared))))
    return b.op("Mul", elements, b.op("Pow", b.const(2.0), shared))


def _emulate_nvfp4(b: _Builder, blocks: str, tensor_scale: str) -> str:
    """NVFP4: block scale amax / (6 s) to E4M3 (never zero), elements x / (scale s) to E2M1 saturated."""
    block_scale = b.op("Div", _block_amax(b, blocks), b.op("Mul", b.const(_E2M1_MAX), tensor_scale))
    block_scale = b.op("Where", b.op("Equal", block_scale, b.const(0.0)), b.const(1.0), block_scale)
    scale = _e4m3(b, block_scale)
    scale = b.op("Where", b.op("Equal", scale, b.const(0.0)), b.const(_E4M3_SMALLEST), scale)
    total = b.op("Mul", scale, tensor_scale)
    ratio = b.op("Div", blocks, total)
    magnitude = b.op("Abs", ratio)
    # E2M1's positive values are 0, 0.5, 1, 1.5 | 2, 3 | 4, 6: steps of 0.5, 1 and 2; Round is half-to-even.
    fine = b.op("Mul", b.op("Round", b.op("Mul", magnitude, b.const(2.0))), b.const(0.5))
    middle = b.op("Round", magnitude)
    coarse = b.op("Mul", b.op("Round", b.op("Mul", magnitude, b.const(0.5))), b.const(2.0))
    rounded = b.op("Where", b.op("Less", magnitude, b.const(2.0)), fine,
                   b.op("Where", b.op("Less", magnitude, b.const(4.0)), middle, coarse))
    rounded = b.op("Min", rounded, b.const(_E2M1_MAX))
    return b.op("Mul", b.op("Mul", rounded, b.op("Sign", ratio)), total)


def emulation_nodes(source: str, output: str, precision: Precision, tensor_scale: str | None = None) -> tuple[list[Any], list[Any]]:
    """(initializers, nodes) computing ``output`` = ``source`` block-quantized and dequantized along its last
    axis in standard ONNX ops, the arithmetic of TensorRT's run-time quantizer as edgekit's codec defines it."""
    fmt = ACTIVATION_FORMATS[precision]
    b = _Builder(f"{source}_{precision.value}_emulated")
    shape = b.op("Shape", source)
    blocks = b.op("Reshape", source, b.const([-1, fmt.block], np.int64))
    if precision is Precision.MXFP8:
        values = _emulate_mxfp8(b, blocks)
    else:
        if tensor_scale is None:
            raise ValueError("nvfp4 emulation needs the tensor scale")
        values = _emulate_nvfp4(b, blocks, tensor_scale)
    b.op("Reshape", values, shape, output=output)
    return b.initializers, b.nodes


def emulate_activation_quantizers(model: Any) -> int:
    """Replace, in place, every run-time activation quantizer chain that :func:`quantizer_nodes` wrote with its
    standard-ONNX emulation; returns the chains replaced."""
    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    replacements: dict[int, list[Any]] = {}  # id(quantizer node) -> its emulation, in the quantizer's place
    removed: set[int] = set()
    for node in graph.node:
        if node.domain != TRT_DOMAIN or node.op_type not in (MXFP8_QUANTIZE, FP4_QUANTIZE):
            continue
        chain = [node]
        frontier = list(node.output)
        while frontier:  # every node downstream of the quantizer's outputs, up to the dequantized result
            for consumer in consumers.get(frontier.pop(), []):
                if consumer not in chain and (consumer.domain == TRT_DOMAIN or consumer.op_type == "DequantizeLinear"):
                    chain.append(consumer)
                    frontier.extend(consumer.output)
        chain_inputs = {name for n in chain for name in n.input}
        output = next(n.output[0] for n in chain if not any(o in chain_inputs for o in n.output))
        precision = Precision.MXFP8 if node.op_type == MXFP8_QUANTIZE else Precision.NVFP4
        inits, nodes = emulation_nodes(node.input[0], output, precision, node.input[1] if precision is Precision.NVFP4 else None)
        graph.initializer.extend(inits)
        replacements[id(node)] = nodes
        removed.update(id(n) for n in chain)
    if replacements:
        rewritten = []
        for node in graph.node:
            rewritten.extend(replacements.get(id(node), [node] if id(node) not in removed else []))
        del graph.node[:]
        graph.node.extend(rewritten)
        for opset in [o for o in model.opset_import if o.domain == TRT_DOMAIN]:
            model.opset_import.remove(opset)
    return len(replacements)
