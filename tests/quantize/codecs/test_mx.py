"""OCP MX block formats (MXFP8, MXFP4): scales re-derived from the spec, elements against ml_dtypes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs import FORMATS, MXTensor, decode_e8m0, mx_dequantize, mx_quantize

ELEMENTS = {  # name: (emax_elem from the spec's table, largest value, mantissa bits, exponent bias, ml_dtypes type)
    "e4m3": (8, 448.0, 3, 7, ml_dtypes.float8_e4m3fn),
    "e5m2": (15, 57344.0, 2, 15, ml_dtypes.float8_e5m2),
    "e2m1": (2, 6.0, 1, 1, ml_dtypes.float4_e2m1fn),
}


def spread_values(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values whose block maxima span many binades, with exact powers of two and values just below them."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
    flat = values.reshape(-1)
    flat[::7] = np.exp2(rng.integers(-10, 10, flat[::7].shape)).astype(np.float32)
    flat[3::11] = np.nextafter(flat[3::11], np.float32(0))
    return values


def spec_shared_exponent(block: np.ndarray, emax_elem: int) -> int:
    """The spec's line, block by block in plain Python: floor(log2(max |V_i|)) - emax_elem, floored at -127."""
    amax = max(abs(float(v)) for v in block)
    if amax == 0:
        return -127
    return max(math.floor(math.log2(amax)) - emax_elem, -127)


@pytest.mark.parametrize("elem", sorted(ELEMENTS))
def test_scales_and_elements_match_a_re_derivation_from_the_spec(elem: str) -> None:
    emax_elem, max_value, _, _, ml_type = ELEMENTS[elem]
    values = spread_values((6, 64))
    tensor = mx_quantize(values, elem)
    assert tensor.codes.shape == (6, 2, 32) and tensor.scales_e8m0.shape == (6, 2)
    for row in range(6):
        for b in range(2):
            block = values[row, 32 * b : 32 * (b + 1)]
            shared_exp = spec_shared_exponent(block, emax_elem)
            assert int(tensor.scales_e8m0[row, b]) == shared_exp + 127
            # P_i = quantize(V_i / X) with round-to-nearest-even, clamped to the element max (ml_dtypes does RNE).
            scaled = np.clip(block.astype(np.float64) / 2.0**shared_exp, -max_value, max_value)
            assert np.array_equal(tensor.codes[row, b], scaled.astype(ml_type).view(np.uint8))


@pytest.mark.parametrize("elem", sorted(ELEMENTS))
def test_round_trip_error_is_within_half_an_element_step_unless_clamped(elem: str) -> None:
    emax_elem, max_value, mantissa_bits, bias, _ = ELEMENTS[elem]
    values = spread_values((8, 96), seed=1).astype(np.float64)
    tensor = mx_quantize(values, elem)
    decoded = mx_dequantize(tensor).astype(np.float64)
    scale = np.repeat(decode_e8m0(tensor.scales_e8m0).astype(np.float64), 32, axis=-1)
    scaled = np.abs(values) / scale
    exponent = np.maximum(np.floor(np.log2(np.where(scaled > 0, scaled, 1.0))), 1 - bias)  # subnormals: emin
    half_step = 2.0 ** (exponent - mantissa_bits - 1) * scale
    error = np.abs(decoded - values)
    in_range = scaled <= max_value
    assert (error[in_range] <= half_step[in_range]).all()
    # Clamped elements lie in (max, 2**(emax + 1)) * X, so they are off by less than 2**(emax+1) - max steps of X.
    assert (error[~in_range] < (2.0 ** (emax_elem + 1) - max_value) * scale[~in_range]).all()
    assert (np.abs(decoded) <= np.abs(values) + half_step).all()


def test_zero_block_gets_the_smallest_scale_and_decodes_to_zero() -> None:
    values = np.zeros((2, 64), np.float32)
    values[1, 32:] = np.linspace(-1, 1, 32)
    values[0, 5] = -0.0
    tensor = mx_quantize(values, "e2m1")
    assert tensor.scales_e8m0.tolist() == [[0, 0], [0, 127 - 2]]
    decoded = mx_dequantize(tensor)
    assert (decoded[0] == 0).all() and (decoded[1, :32] == 0).all() and np.signbit(decoded[0, 5])


def test_one_huge_outlier_sets_its_block_scale_and_flushes_small_neighbours() -> None:
    values = np.full((1, 64), 0.01, np.float32)
    values[0, 3] = 1.0e4  # floor(log2(1e4)) = 13
    tensor = mx_quantize(values, "e2m1")
    assert tensor.scales_e8m0.tolist() == [[127 + 13 - 2, 127 + math.floor(math.log2(0.01)) - 2]]
    decoded = mx_dequantize(tensor)
    assert decoded[0, 3] == 8192.0  # 1e4 / 2**11 = 4.88 -> 4, times 2**11
    assert (decoded[0, :32][np.arange(32) != 3] == 0).all()  # 0.01 / 2**11 is far below E2M1's 0.5
    assert np.allclose(decoded[0, 32:], 0.01, rtol=0.25)  # the next block keeps its own scale


def test_non_finite_values_make_their_block_nan_only() -> None:
    values = np.ones((3, 40), np.float32)
    values[0, 1], values[2, 39] = np.nan, -np.inf
    tensor = mx_quantize(values, "e4m3")
    assert tensor.scales_e8m0.tolist() == [[255, 119], [119, 119], [119, 255]]
    decoded = mx_dequantize(tensor)
    assert np.isnan(decoded[0, :32]).all() and (decoded[0, 32:] == 1).all()
    assert (decoded[1] == 1).all() and np.isnan(decoded[2, 32:]).all() and (decoded[2, :32] == 1).all()


@pytest.mark.parametrize(("shape", "axis"), [((3, 45), -1), ((5,), 0), ((2, 1), -1), ((33, 4), 0), ((2, 3, 70), 1)])
def test_lengths_that_are_not_a_multiple_of_the_block_are_padded_and_stripped(shape: tuple[int, ...], axis: int) -> None:
    values = spread_values(shape, seed=2)
    tensor = mx_quantize(values, "e5m2", axis=axis)
    decoded = mx_dequantize(tensor)
    assert decoded.shape == shape and decoded.dtype == np.float32
    moved, length = np.moveaxis(values, axis, -1), shape[axis]
    zeros = np.zeros((*moved.shape[:-1], 32 * -(-length // 32) - length), np.float32)
    reference = mx_dequantize(mx_quantize(np.concatenate([moved, zeros], axis=-1), "e5m2"))[..., :length]
    assert np.array_equal(decoded, np.moveaxis(reference, -1, axis))
    assert tensor.nbytes == FORMATS["mxfp8_e5m2"].encoded_bytes(shape, axis=axis)


def test_block_size_other_than_32_and_mxfp4_byte_count() -> None:
    values = spread_values((4, 48), seed=3)
    tensor = mx_quantize(values, "e2m1", block=16)
    assert tensor.scales_e8m0.shape == (4, 3) and tensor.codes.max() < 16
    assert mx_quantize(values, "e2m1").nbytes == 4 * 2 * (16 + 1) == FORMATS["mxfp4"].encoded_bytes((4, 48))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"elem": "e3m2"}, r"unknown MX element format 'e3m2' for tensor 'w'"),
        ({"block": 0}, r"block=0 for tensor 'w' is not a positive whole number"),
        ({"axis": 2}, r"axis=2 is not an axis of tensor 'w' with shape \(2, 3\)"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(QuantizationError, match=message):
        mx_quantize(np.ones((2, 3)), tensor_name="w", **kwargs)


def test_scalars_and_mismatched_tensors_are_rejected() -> None:
    with pytest.raises(QuantizationError, match="tensor 's' is a scalar; block formats need at least one axis"):
        mx_quantize(np.float32(1.0), tensor_name="s")
    good = mx_quantize(np.ones((2, 40)), "e2m1")
    with pytest.raises(QuantizationError, match=r"MXTensor: codes uint8\(2, 2, 32\) .* do not fit shape \(2, 80\)"):
        MXTensor(good.codes, good.scales_e8m0, (2, 80), "e2m1")
    with pytest.raises(QuantizationError, match="MXTensor: element codes above 15 for a 4-bit format"):
        MXTensor(good.codes + 16, good.scales_e8m0, (2, 40), "e2m1")
    with pytest.raises(QuantizationError, match="MXTensor: unknown element format 'fp4'"):
        MXTensor(good.codes, good.scales_e8m0, (2, 40), "fp4")
