"""OCP Microscaling (MX) v1.0 block formats: MXFP8 (E4M3 / E5M2 elements) and MXFP4 (E2M1 elements).

A block of ``k`` values (``k = 32`` in the spec) shares one E8M0 scale ``X = 2**shared_exp``. Conversion follows the
spec's section 6.3 algorithm::

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem      # emax_elem: 8 (E4M3), 15 (E5M2), 2 (E2M1)
    P_i        = quantize_to_element_format(V_i / X)       # round to nearest even, normal values clamped to ±max

Choices where the spec's text leaves room, taken from the reference emulation library that accompanies the spec
(``microsoft/microxcaling``, ``mx/mx_ops.py``: ``_shared_exponents`` and ``_quantize_mx``):

* ``shared_exp`` below E8M0's smallest exponent (-127) is raised to -127, so a block of zeros (or of values too
  small to matter) gets scale ``2**-127`` (code ``0x00``) and decodes to zeros;
* a block holding NaN or ±inf, or whose ``shared_exp`` would exceed 127, gets the NaN scale (``0xFF``) and every
  element of it decodes to NaN (the spec: a NaN scale makes the whole block NaN). Its element codes are 0.

Elements are rounded with round-to-nearest-even (the spec leaves the rounding mode to the implementation; TensorRT
and this codec use ties-to-even, microxcaling defaults to ties-away). A last axis whose length is not a multiple of
the block is zero-padded internally; the padding does not change any block maximum and is stripped on decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs.blocks import check_block_and_axis, check_encoded, from_blocks, to_blocks
from edgekit.quantize.codecs.elements import E8M0_BIAS, E8M0_NAN, ELEMENT_FORMATS, decode_e8m0
from edgekit.quantize.codecs.minifloat import as_float64, decode_table, encode_minifloat

MX_BLOCK_SIZE = 32
"""The block size of every MX format in the OCP MX v1.0 spec."""


@dataclass(frozen=True, eq=False)
class MXTensor:
    """An MX-encoded tensor.

    ``codes`` holds one element code per uint8 (E2M1 codes in the low nibble), shaped ``(*rest, n_blocks, block)``:
    the blocked axis moved last and zero-padded to ``n_blocks * block``. ``scales_e8m0`` is ``(*rest, n_blocks)``.
    ``shape`` is the original tensor's shape and ``axis`` (non-negative) the axis that was cut into blocks.
    """

    codes: np.ndarray
    scales_e8m0: np.ndarray
    shape: tuple[int, ...]
    elem: str = "e2m1"
    axis: int = -1
    block: int = MX_BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.elem not in ELEMENT_FORMATS:
            raise QuantizationError(f"MXTensor: unknown element format {self.elem!r}",
                                    hint=f"use one of {sorted(ELEMENT_FORMATS)}")
        shape, axis = check_encoded(self.codes, self.scales_e8m0, self.shape, self.block, self.axis,
                                    code_bits=ELEMENT_FORMATS[self.elem].bits, what="MXTensor")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis", axis)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed encoding: element codes (two per byte for E2M1) plus one byte per block scale."""
        return -(-self.codes.size * ELEMENT_FORMATS[self.elem].bits // 8) + self.scales_e8m0.size


def mx_quantize(x: Any, elem: str = "e2m1", block: int = MX_BLOCK_SIZE, axis: int = -1, *,
                tensor_name: str = "input") -> MXTensor:
    """Encode ``x`` as MXFP4 (``elem="e2m1"``) or MXFP8 (``"e4m3"`` / ``"e5m2"``) along ``axis``."""
    fmt = ELEMENT_FORMATS.get(elem)
    if fmt is None:
        raise QuantizationError(f"mx_quantize: unknown MX element format {elem!r} for tensor '{tensor_name}'",
                                hint=f"use one of {sorted(ELEMENT_FORMATS)}")
    values = as_float64(x, what="mx_quantize", tensor_name=tensor_name)
    axis = check_block_and_axis(values.shape, block, axis, what="mx_quantize", tensor_name=tensor_name)
    blocks = to_blocks(values, int(block), axis)
    shared_exp, nan_scale = shared_exponents(blocks, fmt.max_exponent)
    elements = np.ldexp(np.where(nan_scale[..., None], 0.0, blocks), -shared_exp[..., None].astype(np.int32))
    codes, _ = encode_minifloat(elements, fmt, saturate=True)
    scales = np.where(nan_scale, E8M0_NAN, shared_exp + E8M0_BIAS).astype(np.uint8)
    return MXTensor(codes=codes, scales_e8m0=scales, shape=values.shape, elem=elem, axis=axis, block=int(block))


def shared_exponents(blocks: np.ndarray, emax_elem: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block (last axis): ``(shared_exp int64, NaN-scale mask)`` with ``shared_exp`` clamped to -127."""
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(blocks), axis=-1)
    finite_nonzero = np.isfinite(amax) & (amax > 0)
    _, exponent = np.frexp(np.where(finite_nonzero, amax, 1.0))
    floor_log2 = np.where(finite_nonzero, exponent.astype(np.int64) - 1, -E8M0_BIAS)
    shared_exp = np.maximum(floor_log2 - emax_elem, -E8M0_BIAS)
    nan_scale = ~np.isfinite(amax) | (shared_exp > E8M0_BIAS)
    return np.where(nan_scale, 0, shared_exp), nan_scale


def mx_dequantize(tensor: MXTensor) -> np.ndarray:
    """float32 values of an :class:`MXTensor`, in the original shape (NaN-scale blocks decode to NaN)."""
    elements = decode_table(ELEMENT_FORMATS[tensor.elem]).astype(np.float64)[tensor.codes]
    scales = decode_e8m0(tensor.scales_e8m0).astype(np.float64)
    return from_blocks(elements * scales[..., None], tensor.shape, tensor.axis).astype(np.float32)

