"""Exact round-to-nearest-even encoding of real numbers into small sign/exponent/mantissa formats.

One :class:`Minifloat` describes a format (FP8 E4M3, FP8 E5M2, FP4 E2M1); :func:`encode_minifloat` and
:func:`decode_minifloat` are the shared, format-neutral core behind the public ``encode_*``/``decode_*``
functions of :mod:`edgekit.quantize.codecs.elements`.

How encoding stays exact: every input is widened to float64 (exact for float16/bfloat16/float32), split into
``|x| = m * 2**e`` with :func:`numpy.frexp`, and divided by the format's quantum at that exponent, which is a
power of two, so the division is exact. :func:`numpy.rint` then rounds half to even, and the rounded integer
*is* the code: for a format with ``M`` mantissa bits and smallest normal exponent ``emin``, the magnitude code of
``r * 2**(e_eff - M)`` is ``((e_eff - emin) << M) + r`` whether the result is subnormal, normal, or carried into
the next binade by rounding. A code above the largest finite code is an overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError


@dataclass(frozen=True)
class Minifloat:
    """A binary floating-point format with one sign bit, ``exponent_bits`` and ``mantissa_bits``.

    ``max_code`` is the largest finite magnitude code; ``inf_code`` / ``nan_code`` are the magnitude codes of
    infinity / the canonical NaN (``None`` when the format has none).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_code: int
    inf_code: int | None
    nan_code: int | None

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def min_normal_exponent(self) -> int:
        return 1 - self.bias

    @property
    def max_value(self) -> float:
        return float(magnitude_values(self)[self.max_code])

    @property
    def max_exponent(self) -> int:
        """The exponent of the largest normal value (``emax`` in the OCP MX spec)."""
        return (self.max_code >> self.mantissa_bits) - self.bias


def magnitude_values(fmt: Minifloat) -> np.ndarray:
    """float64 value of every magnitude code ``0 .. 2**(bits-1) - 1`` (inf/NaN where the format says so)."""
    codes = np.arange(1 << (fmt.bits - 1), dtype=np.int64)
    exponent_field = codes >> fmt.mantissa_bits
    mantissa = codes & ((1 << fmt.mantissa_bits) - 1)
    subnormal = mantissa * 2.0 ** (fmt.min_normal_exponent - fmt.mantissa_bits)
    normal = ((1 << fmt.mantissa_bits) + mantissa) * np.exp2((exponent_field - fmt.bias - fmt.mantissa_bits).astype(np.float64))
    values = np.where(exponent_field == 0, subnormal, normal)
    values[fmt.max_code + 1 :] = np.nan
    if fmt.inf_code is not None:
        values[fmt.inf_code] = np.inf
    return values


def decode_table(fmt: Minifloat) -> np.ndarray:
    """float32 value of every code ``0 .. 2**bits - 1``, sign bit included (-0.0 for the negative zero code)."""
    magnitudes = magnitude_values(fmt)
    return np.concatenate([magnitudes, -magnitudes]).astype(np.float32)


def encode_minifloat(values: np.ndarray, fmt: Minifloat, *, saturate: bool) -> tuple[np.ndarray, np.ndarray]:
    """Round float64 ``values`` to ``fmt`` (nearest, ties to even). Returns ``(codes uint8, unrepresentable mask)``.

    Saturation: finite values beyond the largest finite value become ``±max`` when ``saturate``; otherwise they
    become ±inf (formats with infinity) or NaN (formats with NaN only). Infinite inputs keep their infinity where
    the format has one (as ONNX ``Cast(saturate=1)`` does for E5M2) and saturate to ``±max`` otherwise when
    ``saturate``. NaN becomes the canonical NaN with the input's sign. Inputs the format cannot hold at all (NaN
    without a NaN code, overflow without saturation and without inf/NaN codes) are flagged in the returned mask;
    their codes are ``±max`` and the caller decides whether that is an error.
    """
    magnitude = np.abs(values)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", over="ignore"):
        finite_magnitude = np.where(finite, magnitude, 0.0)
        _, exponent = np.frexp(finite_magnitude)
        floor_log2 = np.where(finite_magnitude > 0, exponent.astype(np.int64) - 1, fmt.min_normal_exponent)
        effective_exponent = np.maximum(floor_log2, fmt.min_normal_exponent)
        scaled = np.ldexp(finite_magnitude, (fmt.mantissa_bits - effective_exponent).astype(np.int32))
        rounded = np.rint(scaled).astype(np.int64)
    codes = ((effective_exponent - fmt.min_normal_exponent) << fmt.mantissa_bits) + rounded

    nan = np.isnan(values)
    infinite = np.isinf(values)
    overflow = finite & (codes > fmt.max_code)
    unrepresentable = np.zeros(values.shape, dtype=bool)
    codes = np.where(overflow | infinite, fmt.max_code, codes)
    if not saturate:
        overflow_code = fmt.inf_code if fmt.inf_code is not None else fmt.nan_code
        if overflow_code is None:
            unrepresentable |= overflow | infinite
        else:
            codes = np.where(overflow | infinite, overflow_code, codes)
    elif fmt.inf_code is not None:
        codes = np.where(infinite, fmt.inf_code, codes)
    if fmt.nan_code is None:
        unrepresentable |= nan
    else:
        codes = np.where(nan, fmt.nan_code, codes)
    codes = np.where(np.signbit(values), codes | fmt.sign_bit, codes)
    return codes.astype(np.uint8), unrepresentable


def decode_minifloat(codes: np.ndarray, fmt: Minifloat) -> np.ndarray:
    """float32 values of uint8 ``codes`` (already checked to be below ``2**fmt.bits``)."""
    return decode_table(fmt)[codes]


def as_float64(x: Any, *, what: str, tensor_name: str) -> np.ndarray:
    """Widen real numbers (NumPy floats and ints, ml_dtypes floats, nested lists) to a float64 array."""
    array = np.asarray(x)
    if array.dtype.kind in "cSUOMm" or array.dtype.kind == "V" and array.dtype.names is not None:
        raise QuantizationError(
            f"{what}: tensor '{tensor_name}' has dtype {array.dtype}, which is not a real number type",
            hint="pass a float or integer NumPy array (float32 weights or activations)",
        )
    try:
        with np.errstate(invalid="ignore"):  # signalling NaN payloads warn on widening; they stay NaN
            return array.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise QuantizationError(
            f"{what}: tensor '{tensor_name}' of dtype {array.dtype} cannot be read as real numbers ({exc})",
            hint="pass a float or integer NumPy array",
        ) from exc


def as_codes(codes: Any, *, bits: int, what: str) -> np.ndarray:
    """Check that ``codes`` are integers in ``[0, 2**bits)`` and return them as uint8."""
    array = np.asarray(codes)
    if array.dtype.kind not in "ui":
        raise QuantizationError(
            f"{what}: codes have dtype {array.dtype}; expected an unsigned integer array of {bits}-bit codes",
            hint="pass the uint8 array returned by the matching encode_* function",
        )
    bad = (array < 0) | (array >= (1 << bits))
    if bad.any():
        raise QuantizationError(
            f"{what}: code {int(array[bad].flat[0])} {describe_positions(bad)} does not fit in {bits} bits",
            hint=f"codes of this format lie in 0..{(1 << bits) - 1}; unpack packed bytes first (unpack_fp4)",
        )
    return array.astype(np.uint8)


def describe_positions(mask: np.ndarray) -> str:
    """``"at index (1, 3)"`` (plus ``" and N more"``) for the first True entry of ``mask``."""
    positions = np.argwhere(mask)
    first = tuple(int(i) for i in positions[0]) if mask.ndim else ()
    more = len(positions) - 1 if mask.ndim else 0
    return f"at index {first}" + (f" (and {more} more)" if more else "")
