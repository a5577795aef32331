"""Element codecs: FP8 E4M3, FP8 E5M2, FP4 E2M1 and the E8M0 scale format, bit-exact, in pure NumPy.

Bit layouts (sign bit first, then exponent, then mantissa):

* **FP8 E4M3** -- the OCP FP8 "fn" variant (``float8_e4m3fn`` in ONNX, PyTorch and ml_dtypes): bias 7, no
  infinities, one NaN per sign (``S.1111.111`` = ``0x7F`` / ``0xFF``), largest finite value 448.
* **FP8 E5M2** -- IEEE-754-like: bias 15, ±inf at ``0x7C`` / ``0xFC``, NaNs above; largest finite 57344. The NaN
  this module writes is ``0x7E`` / ``0xFE`` (quiet NaN, as ml_dtypes writes it).
* **FP4 E2M1** -- OCP MX element type: bias 1, values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf and no NaN. A code is
  stored in the low 4 bits of a uint8 (bit 3 is the sign); :func:`pack_fp4` packs two per byte.
* **E8M0** -- OCP MX scale type: 8 exponent bits, bias 127, no sign, no zero; code ``c`` is ``2**(c - 127)`` for
  ``c`` in 0..254 and ``0xFF`` is NaN.

Rounding is round-to-nearest, ties to even, with exact subnormals; -0.0 keeps its sign. ``saturate`` follows the
ONNX ``Cast`` attribute: finite values beyond the largest finite value clamp to ``±max`` when ``saturate=True``;
with ``saturate=False`` they become NaN in E4M3 (no infinities) and ±inf in E5M2. Infinite inputs stay infinite in
E5M2 either way and clamp to ±448 in E4M3 when saturating. NaN in gives NaN out.

FP4 E2M1 has no NaN, so :func:`encode_e2m1` raises :class:`~edgekit.errors.QuantizationError` naming the tensor and
the first offending index when the input holds NaN, or holds values beyond ±6 (or ±inf) with ``saturate=False``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs.minifloat import (
    Minifloat,
    as_codes,
    as_float64,
    decode_minifloat,
    describe_positions,
    encode_minifloat,
)

E4M3 = Minifloat("fp8_e4m3", exponent_bits=4, mantissa_bits=3, bias=7, max_code=0x7E, inf_code=None, nan_code=0x7F)
E5M2 = Minifloat("fp8_e5m2", exponent_bits=5, mantissa_bits=2, bias=15, max_code=0x7B, inf_code=0x7C, nan_code=0x7E)
E2M1 = Minifloat("fp4_e2m1", exponent_bits=2, mantissa_bits=1, bias=1, max_code=0x7, inf_code=None, nan_code=None)

ELEMENT_FORMATS: dict[str, Minifloat] = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
"""Element formats by their short name (as used by ``mx_quantize(elem=...)``)."""

E8M0_BIAS = 127
E8M0_NAN = 0xFF


def encode_e4m3(x: Any, saturate: bool = True, *, tensor_name: str = "input") -> np.ndarray:
    """FP8 E4M3 (fn) codes, uint8, same shape as ``x``."""
    codes, _ = encode_minifloat(as_float64(x, what="encode_e4m3", tensor_name=tensor_name), E4M3, saturate=saturate)
    return codes


def decode_e4m3(bits: Any) -> np.ndarray:
    """float32 values of FP8 E4M3 (fn) codes."""
    return decode_minifloat(as_codes(bits, bits=8, what="decode_e4m3"), E4M3)


def encode_e5m2(x: Any, saturate: bool = True, *, tensor_name: str = "input") -> np.ndarray:
    """FP8 E5M2 codes, uint8, same shape as ``x``."""
    codes, _ = encode_minifloat(as_float64(x, what="encode_e5m2", tensor_name=tensor_name), E5M2, saturate=saturate)
    return codes


def decode_e5m2(bits: Any) -> np.ndarray:
    """float32 values of FP8 E5M2 codes."""
    return decode_minifloat(as_codes(bits, bits=8, what="decode_e5m2"), E5M2)


def encode_e2m1(x: Any, saturate: bool = True, *, tensor_name: str = "input") -> np.ndarray:
    """FP4 E2M1 codes in the low 4 bits of uint8, same shape as ``x``.

    Raises :class:`QuantizationError` for NaN (E2M1 has no NaN), and with ``saturate=False`` for ±inf or values
    that round beyond ±6.
    """
    values = as_float64(x, what="encode_e2m1", tensor_name=tensor_name)
    codes, unrepresentable = encode_minifloat(values, E2M1, saturate=saturate)
    if unrepresentable.any():
        nan = np.isnan(values)
        if nan.any():
            raise QuantizationError(
                f"encode_e2m1: tensor '{tensor_name}' holds NaN {describe_positions(nan)}; FP4 E2M1 has no NaN",
                hint="find where the NaN comes from (a diverged weight, a 0/0 in calibration) and fix it before quantizing",
            )
        raise QuantizationError(
            f"encode_e2m1: tensor '{tensor_name}' holds {float(values[unrepresentable].flat[0])!r} "
            f"{describe_positions(unrepresentable)}, beyond FP4 E2M1's largest value 6 (saturate=False)",
            hint="scale the tensor into [-6, 6] first (block formats do this for you), or pass saturate=True to clamp",
        )
    return codes


def decode_e2m1(bits: Any) -> np.ndarray:
    """float32 values of FP4 E2M1 codes (one code per uint8, in the low 4 bits)."""
    return decode_minifloat(as_codes(bits, bits=4, what="decode_e2m1"), E2M1)


def encode_e8m0(x: Any, saturate: bool = False, *, tensor_name: str = "input") -> np.ndarray:
    """E8M0 codes (uint8) of positive scales: the nearest power of two, ties toward the larger one.

    The tie rule (``1.5 * 2**k`` goes to ``2**(k + 1)``) is the one of ml_dtypes' ``float8_e8m0fnu`` and PyTorch's
    ``torch.float8_e8m0fnu`` casts. Below ``2**-126`` (float32's subnormal range, where a float32 bit pattern is
    linear in the value) both round the bit pattern, so this codec does too and agrees bit for bit: values in
    ``(2**-127, 2**-126)`` give ``2**-126`` (code 1) and positive values up to ``2**-127`` give ``2**-127`` (code 0).
    NaN gives ``0xFF``; +inf and values rounding above ``2**127`` give ``0xFF`` (NaN) too, or ``0xFE`` (``2**127``)
    with ``saturate=True``. E8M0 has neither zero nor a sign, so zero and negative inputs raise
    :class:`QuantizationError` (ml_dtypes returns NaN for them and PyTorch drops the sign: neither is a scale).
    """
    values = as_float64(x, what="encode_e8m0", tensor_name=tensor_name)
    not_positive = ~(values > 0) & ~np.isnan(values)
    if not_positive.any():
        raise QuantizationError(
            f"encode_e8m0: tensor '{tensor_name}' holds {float(values[not_positive].flat[0])!r} "
            f"{describe_positions(not_positive)}; E8M0 scales are positive powers of two (no zero, no sign)",
            hint="encode block scales, not data; a block of zeros takes the smallest scale 2**-127 (code 0)",
        )
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        significand, exponent = np.frexp(np.where(finite, values, 1.0))
    # values = (2 * significand) * 2**(exponent - 1) with 2 * significand in [1, 2); the midpoint is 1.5.
    power = exponent.astype(np.int64) - 1 + (2.0 * significand >= 1.5)
    codes = power + E8M0_BIAS
    codes = np.where(values < 2.0**-126, np.where(values > 2.0**-127, 1, 0), codes)
    too_large = (codes > 0xFE) | (values == np.inf)
    codes = np.where(too_large, 0xFE if saturate else E8M0_NAN, codes)
    codes = np.where(np.isnan(values), E8M0_NAN, codes)
    return codes.astype(np.uint8)


def decode_e8m0(bits: Any) -> np.ndarray:
    """float32 values ``2**(code - 127)`` of E8M0 codes (``0xFF`` is NaN; ``2**-127`` is a float32 subnormal)."""
    codes = as_codes(bits, bits=8, what="decode_e8m0")
    values = np.where(codes == E8M0_NAN, np.nan, np.exp2(codes.astype(np.float64) - E8M0_BIAS))
    return values.astype(np.float32)


def pack_fp4(codes: Any) -> np.ndarray:
    """Pack 4-bit codes two per byte, flattened in C order, first code in the low nibble (ONNX FLOAT4E2M1 order).

    An odd count leaves the high nibble of the last byte zero; pass the count to :func:`unpack_fp4` to drop it.
    """
    flat = as_codes(codes, bits=4, what="pack_fp4").reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, dtype=np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: Any, count: int | None = None) -> np.ndarray:
    """1-D uint8 array of 4-bit codes from bytes made by :func:`pack_fp4` (``count`` codes, default all)."""
    data = as_codes(packed, bits=8, what="unpack_fp4").reshape(-1)
    codes = np.empty(data.size * 2, dtype=np.uint8)
    codes[0::2] = data & 0x0F
    codes[1::2] = data >> 4
    if count is None:
        return codes
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= codes.size:
        raise QuantizationError(
            f"unpack_fp4: count={count!r} is not a whole number of codes between 0 and {codes.size} "
            f"({data.size} packed bytes)",
            hint="pass the number of elements of the original tensor (its size), or None for every nibble",
        )
    return codes[: int(count)]


def encode_int(x: Any, *, bits: int, signed: bool = True, tensor_name: str = "input") -> np.ndarray:
    """Round to integers (nearest, ties to even) and clamp to the ``bits``-bit range; int8 if signed else uint8.

    ``bits`` is 2..8 (INT4 is ``bits=4``; pack INT4 codes with ``pack_fp4(codes & 0xF)``). NaN raises
    :class:`QuantizationError`; ±inf clamps like any out-of-range value.
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 8:
        raise QuantizationError(f"encode_int: bits={bits!r} is not an integer width in 2..8", hint="use bits=8 or bits=4")
    values = as_float64(x, what="encode_int", tensor_name=tensor_name)
    nan = np.isnan(values)
    if nan.any():
        raise QuantizationError(
            f"encode_int: tensor '{tensor_name}' holds NaN {describe_positions(nan)}; integers have no NaN",
            hint="find where the NaN comes from and fix it before quantizing",
        )
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return np.clip(np.rint(values), low, high).astype(np.int8 if signed else np.uint8)
