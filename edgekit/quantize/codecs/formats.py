"""The registry of low-precision formats: what each costs in bits and bytes, and a fake-quant for each.

``quantize_dequantize(x, fmt)`` ("fake quant") returns float32 values that a device running ``fmt`` would see, so a
host without FP8/FP4 hardware can estimate a model's accuracy; :meth:`FormatSpec.encoded_bytes` estimates its size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs.blocks import check_block_and_axis
from edgekit.quantize.codecs.elements import ELEMENT_FORMATS, encode_e2m1
from edgekit.quantize.codecs.minifloat import as_float64, decode_minifloat, encode_minifloat
from edgekit.quantize.codecs.mx import MX_BLOCK_SIZE, mx_dequantize, mx_quantize
from edgekit.quantize.codecs.nvfp4 import NVFP4_BLOCK_SIZE, nvfp4_dequantize, nvfp4_quantize


@dataclass(frozen=True)
class FormatSpec:
    """One low-precision format.

    ``block_size`` is ``None`` for per-element formats (the caller may pass one per-tensor scale to
    :func:`quantize_dequantize`); ``scale_format`` names the per-block scale type; ``tensor_scale_bits`` counts a
    per-tensor scale stored with the tensor (NVFP4's FP32 scale).
    """

    name: str
    element: str
    element_bits: int
    block_size: int | None
    scale_format: str | None
    scale_bits: int
    tensor_scale_bits: int
    description: str

    @property
    def max_value(self) -> float:
        """Largest finite element value (448, 57344 or 6)."""
        return ELEMENT_FORMATS[self.element].max_value

    @property
    def effective_bits_per_value(self) -> float:
        """Element bits plus the block scale's share (8.25 for MXFP8, 4.25 for MXFP4, 4.5 for NVFP4).

        The per-tensor scale is left out: it is a few bytes per tensor. :meth:`encoded_bytes` counts it.
        """
        return self.element_bits + (self.scale_bits / self.block_size if self.block_size else 0.0)

    def encoded_bytes(self, shape: tuple[int, ...], axis: int = -1) -> int:
        """Bytes of a tensor of ``shape`` in this format: packed element codes (blocks padded along ``axis``),
        block scales and any per-tensor scale."""
        shape = tuple(int(d) for d in shape)
        if self.block_size is None:
            return -(-prod(shape) * self.element_bits // 8) + self.tensor_scale_bits // 8
        axis = check_block_and_axis(shape, self.block_size, axis, what=f"{self.name}.encoded_bytes", tensor_name="shape")
        n_blocks = prod(shape[:axis] + shape[axis + 1 :]) * -(-shape[axis] // self.block_size)
        code_bytes = -(-n_blocks * self.block_size * self.element_bits // 8)
        return code_bytes + n_blocks * self.scale_bits // 8 + self.tensor_scale_bits // 8


FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec("fp8_e4m3", "e4m3", 8, None, None, 0, 0, "OCP FP8 E4M3 (fn): max 448, NaN, no inf"),
        FormatSpec("fp8_e5m2", "e5m2", 8, None, None, 0, 0, "OCP FP8 E5M2: max 57344, inf and NaN"),
        FormatSpec("fp4_e2m1", "e2m1", 4, None, None, 0, 0, "FP4 E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}"),
        FormatSpec("mxfp8_e4m3", "e4m3", 8, MX_BLOCK_SIZE, "e8m0", 8, 0, "OCP MXFP8, E4M3 elements, E8M0 scale per 32"),
        FormatSpec("mxfp8_e5m2", "e5m2", 8, MX_BLOCK_SIZE, "e8m0", 8, 0, "OCP MXFP8, E5M2 elements, E8M0 scale per 32"),
        FormatSpec("mxfp4", "e2m1", 4, MX_BLOCK_SIZE, "e8m0", 8, 0, "OCP MXFP4, E2M1 elements, E8M0 scale per 32"),
        FormatSpec("nvfp4", "e2m1", 4, NVFP4_BLOCK_SIZE, "e4m3", 8, 32,
                   "NVIDIA NVFP4, E2M1 elements, E4M3 scale per 16, FP32 scale per tensor"),
    )
}
"""Every format by name."""


def _element_qdq(element: str) -> Callable[[np.ndarray, int, str], np.ndarray]:
    fmt = ELEMENT_FORMATS[element]

    def qdq(values: np.ndarray, axis: int, tensor_name: str) -> np.ndarray:
        if element == "e2m1":  # the one element format without NaN: raise on it, naming the tensor
            codes = encode_e2m1(values, saturate=True, tensor_name=tensor_name)
        else:
            codes, _ = encode_minifloat(values, fmt, saturate=True)
        return decode_minifloat(codes, fmt)

    return qdq


def _mx_qdq(element: str) -> Callable[[np.ndarray, int, str], np.ndarray]:
    def qdq(values: np.ndarray, axis: int, tensor_name: str) -> np.ndarray:
        return mx_dequantize(mx_quantize(values, element, MX_BLOCK_SIZE, axis, tensor_name=tensor_name))

    return qdq


def _nvfp4_qdq(values: np.ndarray, axis: int, tensor_name: str) -> np.ndarray:
    return nvfp4_dequantize(nvfp4_quantize(values, NVFP4_BLOCK_SIZE, axis, tensor_name=tensor_name))


_QDQ: dict[str, Callable[[np.ndarray, int, str], np.ndarray]] = {
    "fp8_e4m3": _element_qdq("e4m3"),
    "fp8_e5m2": _element_qdq("e5m2"),
    "fp4_e2m1": _element_qdq("e2m1"),
    "mxfp8_e4m3": _mx_qdq("e4m3"),
    "mxfp8_e5m2": _mx_qdq("e5m2"),
    "mxfp4": _mx_qdq("e2m1"),
    "nvfp4": _nvfp4_qdq,
}


def quantize_dequantize(x: Any, fmt: str, *, axis: int = -1, scale: float | None = None,
                        tensor_name: str = "input") -> np.ndarray:
    """Round ``x`` through format ``fmt`` and back; float32, same shape.

    Per-element formats saturate to ``±max`` and use ``scale`` as TensorRT's FP8 Q/DQ does
    (``x_hat = cast(x / scale) * scale``; docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/
    quantized-types-schemes.html); ``scale=None`` means 1. Block formats compute their own scales along ``axis``, so
    passing ``scale`` to them is an error.
    """
    spec = FORMATS.get(fmt)
    if spec is None:
        raise QuantizationError(f"quantize_dequantize: unknown format {fmt!r} for tensor '{tensor_name}'",
                                hint=f"use one of {sorted(FORMATS)}")
    values = as_float64(x, what="quantize_dequantize", tensor_name=tensor_name)
    if spec.block_size is not None:
        if scale is not None:
            raise QuantizationError(
                f"quantize_dequantize: format {fmt!r} computes its own block scales; scale={scale!r} was given "
                f"for tensor '{tensor_name}'",
                hint="drop scale for block formats, or use a per-element format (fp8_e4m3, fp8_e5m2, fp4_e2m1)",
            )
        return _QDQ[fmt](values, axis, tensor_name)
    if scale is None:
        return _QDQ[fmt](values, axis, tensor_name)
    is_number = isinstance(scale, (int, float, np.number)) and not isinstance(scale, bool)
    if not (is_number and np.isfinite(scale) and scale > 0):
        raise QuantizationError(f"quantize_dequantize: scale={scale!r} for tensor '{tensor_name}' is not a positive "
                                "finite number", hint=f"a per-tensor scale is usually amax / {spec.max_value:g}")
    return (_QDQ[fmt](values / float(scale), axis, tensor_name) * np.float64(scale)).astype(np.float32)
