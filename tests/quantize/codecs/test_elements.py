"""FP8 E4M3 / E5M2, FP4 E2M1 and E8M0 codecs, bit for bit against ml_dtypes and PyTorch casts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs import (
    decode_e2m1,
    decode_e4m3,
    decode_e5m2,
    decode_e8m0,
    encode_e2m1,
    encode_e4m3,
    encode_e5m2,
    encode_e8m0,
    encode_int,
    pack_fp4,
    unpack_fp4,
)

ALL_BYTES = np.arange(256, dtype=np.uint8)
ALL_NIBBLES = np.arange(16, dtype=np.uint8)
FP8 = {
    "e4m3": (encode_e4m3, decode_e4m3, ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    "e5m2": (encode_e5m2, decode_e5m2, ml_dtypes.float8_e5m2, torch.float8_e5m2),
}


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as values, NaN equal to NaN, and -0.0 distinct from +0.0."""
    with np.errstate(invalid="ignore"):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b)))


# --- decoding: every code -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_decode_matches_ml_dtypes_and_torch_for_all_256_codes(name: str) -> None:
    _, decode, ml_type, torch_type = FP8[name]
    ours = decode(ALL_BYTES)
    assert ours.dtype == np.float32 and ours.shape == (256,)
    assert same_floats(ours, ALL_BYTES.view(ml_type).astype(np.float32))
    assert same_floats(ours, torch.from_numpy(ALL_BYTES.copy()).view(torch_type).float().numpy())


def test_e2m1_decode_matches_ml_dtypes_for_all_16_codes() -> None:
    ours = decode_e2m1(ALL_NIBBLES)
    assert same_floats(ours, ALL_NIBBLES.view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    assert ours[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.signbit(ours[8]) and ours[8] == 0


def test_e8m0_decode_matches_ml_dtypes_and_torch_for_all_256_codes() -> None:
    ours = decode_e8m0(ALL_BYTES)
    assert same_floats(ours, ALL_BYTES.view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    assert same_floats(ours, torch.from_numpy(ALL_BYTES.copy()).view(torch.float8_e8m0fnu).float().numpy())
    assert ours[127] == 1.0 and ours[0] == np.float32(2.0**-127) and np.isnan(ours[255])


def test_special_codes_decode_to_the_documented_values() -> None:
    assert np.isnan(decode_e4m3(np.array([0x7F, 0xFF]))).all()
    assert decode_e4m3(np.array([0x7E, 0xFE])).tolist() == [448.0, -448.0]
    assert decode_e5m2(np.array([0x7B, 0x7C, 0xFC])).tolist() == [57344.0, np.inf, -np.inf]
    assert np.isnan(decode_e5m2(np.array([0x7D, 0x7E, 0x7F, 0xFE]))).all()
    assert decode_e4m3(np.array([0x01]))[0] == 2.0**-9 and decode_e5m2(np.array([0x01]))[0] == 2.0**-16


# --- encoding: dense sweeps -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_encode_without_saturation_matches_ml_dtypes_bit_for_bit(name: str, float32_sweep: np.ndarray) -> None:
    # ml_dtypes' astype does not saturate: overflow is NaN (E4M3) or inf (E5M2), like saturate=False.
    encode, _, ml_type, _ = FP8[name]
    ours = encode(float32_sweep, saturate=False)
    with np.errstate(invalid="ignore", over="ignore"):
        reference = float32_sweep.astype(ml_type).view(np.uint8)
    mismatch = ours != reference
    assert not mismatch.any(), f"{mismatch.sum()} mismatches, first at {float32_sweep[mismatch][:5]}"


def test_e4m3_encode_with_saturation_matches_torch_bit_for_bit(float32_sweep: np.ndarray) -> None:
    # torch's float8_e4m3fn cast saturates finite overflow and ±inf to ±448 and keeps NaN (sign included).
    reference = torch.from_numpy(float32_sweep).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(encode_e4m3(float32_sweep, saturate=True), reference)


def test_e5m2_encode_without_saturation_matches_torch(float32_sweep: np.ndarray) -> None:
    # torch's float8_e5m2 cast overflows to inf; its NaN is 0x7F where ours (and ml_dtypes') is 0x7E: compare NaN-ness.
    ours = encode_e5m2(float32_sweep, saturate=False)
    reference = torch.from_numpy(float32_sweep).to(torch.float8_e5m2).view(torch.uint8).numpy()
    nan = np.isnan(float32_sweep)
    assert np.array_equal(ours[~nan], reference[~nan])
    assert np.isnan(decode_e5m2(ours[nan])).all() and np.isnan(decode_e5m2(reference[nan])).all()


@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_saturation_clamps_finite_overflow_and_agrees_in_range(name: str, float32_sweep: np.ndarray) -> None:
    encode, decode, _, _ = FP8[name]
    max_value = float(decode(np.array([0x7E if name == "e4m3" else 0x7B]))[0])
    saturated, plain = encode(float32_sweep, saturate=True), encode(float32_sweep, saturate=False)
    plain_values = decode(plain)
    overflowed = np.isfinite(float32_sweep) & ~np.isfinite(plain_values)
    assert overflowed.any()
    assert np.array_equal(decode(saturated[overflowed]), np.copysign(max_value, float32_sweep[overflowed]))
    in_range = np.isfinite(plain_values)
    assert np.array_equal(saturated[in_range], plain[in_range])


def test_fp8_infinities_follow_onnx_saturate_semantics() -> None:
    infinities = np.array([np.inf, -np.inf], np.float32)
    assert encode_e4m3(infinities, saturate=True).tolist() == [0x7E, 0xFE]  # ±448
    assert encode_e4m3(infinities, saturate=False).tolist() == [0x7F, 0xFF]  # NaN: E4M3 has no inf
    assert encode_e5m2(infinities, saturate=True).tolist() == [0x7C, 0xFC]  # E5M2 keeps ±inf
    assert encode_e5m2(infinities, saturate=False).tolist() == [0x7C, 0xFC]


def test_rounding_ties_go_to_the_even_mantissa() -> None:
    # E4M3 around 1: step 1/8. 1 + 1/16 ties between 1 (even) and 1.125 (odd) -> 1; 1 + 3/16 -> 1.25 (even).
    ties = np.array([1 + 1 / 16, 1 + 3 / 16, 464.0, -464.0, 2.0**-10, 3 * 2.0**-10], np.float32)
    assert decode_e4m3(encode_e4m3(ties)).tolist() == [1.0, 1.25, 448.0, -448.0, 0.0, 2.0**-8]
    # E5M2: 61440 ties between 57344 (odd mantissa) and the first value past max -> overflow to inf.
    assert decode_e5m2(encode_e5m2(np.array([61440.0, 61439.0]), saturate=False)).tolist() == [np.inf, 57344.0]
    # E2M1: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    e2m1_ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert decode_e2m1(encode_e2m1(e2m1_ties)).tolist() == [0, 1, 1, 2, 2, 4, 4]


def test_subnormals_and_negative_zero_are_exact() -> None:
    subnormals = np.array([2.0**-9, 3 * 2.0**-9, 7 * 2.0**-9, -2.0**-9], np.float32)
    assert encode_e4m3(subnormals).tolist() == [0x01, 0x03, 0x07, 0x81]
    assert encode_e5m2(np.array([2.0**-16, 3 * 2.0**-16])).tolist() == [0x01, 0x03]
    assert encode_e2m1(np.array([0.5, -0.5])).tolist() == [0x1, 0x9]
    negative_zeros = np.array([-0.0, -1e-30], np.float32)
    assert encode_e4m3(negative_zeros).tolist() == [0x80, 0x80]
    assert encode_e5m2(negative_zeros).tolist() == [0x80, 0x80]
    assert encode_e2m1(negative_zeros).tolist() == [0x8, 0x8]
    assert same_floats(decode_e4m3(encode_e4m3(negative_zeros)), np.array([-0.0, -0.0]))


def test_nan_encodes_to_the_canonical_nan_with_its_sign() -> None:
    nans = np.array([np.nan, -np.nan], np.float32)
    assert encode_e4m3(nans).tolist() == [0x7F, 0xFF]
    assert encode_e5m2(nans).tolist() == [0x7E, 0xFE]


def test_e2m1_encode_matches_ml_dtypes_for_every_non_nan_float32(float32_sweep: np.ndarray) -> None:
    # ml_dtypes' float4_e2m1fn saturates (it has no inf), which is saturate=True.
    values = float32_sweep[~np.isnan(float32_sweep)]
    reference = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    assert np.array_equal(encode_e2m1(values, saturate=True), reference)


def test_e2m1_rejects_nan_naming_tensor_and_index() -> None:
    values = np.zeros((2, 3), np.float32)
    values[1, 2] = np.nan
    values[0, 1] = np.nan
    with pytest.raises(QuantizationError, match=r"tensor 'fc1\.weight' holds NaN at index \(0, 1\) \(and 1 more\)"):
        encode_e2m1(values, tensor_name="fc1.weight")


def test_e2m1_without_saturation_rejects_values_beyond_six() -> None:
    assert encode_e2m1(np.array([6.9, np.inf])).tolist() == [0x7, 0x7]
    message = r"holds 7\.0 at index \(1,\) \(and 1 more\), beyond FP4 E2M1's largest value 6"
    with pytest.raises(QuantizationError, match=message) as info:
        encode_e2m1(np.array([1.0, 7.0, 100.0]), saturate=False)
    assert "saturate=True" in str(info.value)
    with pytest.raises(QuantizationError, match="holds -inf"):
        encode_e2m1(np.array([-np.inf]), saturate=False)
    assert encode_e2m1(np.array([6.9]), saturate=False).tolist() == [0x7]  # rounds down to 6: representable


def test_e8m0_encode_matches_ml_dtypes_for_every_positive_float32(float32_sweep: np.ndarray) -> None:
    positive = float32_sweep[(float32_sweep > 0) | np.isnan(float32_sweep)]
    with np.errstate(invalid="ignore"):
        reference = positive.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(encode_e8m0(positive), reference)
    torch_reference = torch.from_numpy(positive).to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    nan = np.isnan(positive)
    assert np.array_equal(encode_e8m0(positive)[~nan], torch_reference[~nan])


def test_e8m0_rounding_overflow_and_saturation() -> None:
    values = np.array([1.0, 1.49, 1.5, 3.0, 0.75, 2.0**-127, 2.0**-140, 2.0**127, 1.5 * 2.0**127, np.inf, np.nan])
    assert encode_e8m0(values).tolist() == [127, 127, 128, 129, 127, 0, 0, 254, 255, 255, 255]
    assert encode_e8m0(values, saturate=True).tolist()[-4:] == [254, 254, 254, 255]


@pytest.mark.parametrize("bad", [0.0, -0.0, -2.0, -np.inf])
def test_e8m0_rejects_zero_and_negative_scales(bad: float) -> None:
    with pytest.raises(QuantizationError, match=r"tensor 'scales' holds .* at index \(1,\); E8M0 scales are positive"):
        encode_e8m0(np.array([1.0, bad]), tensor_name="scales")


def test_inputs_of_other_real_dtypes_encode_like_their_float32_values() -> None:
    values = np.array([0.1, -3.3, 300.0, 1e-3], np.float32)
    expected = encode_e4m3(values)
    bfloat16 = values.astype(ml_dtypes.bfloat16)
    assert np.array_equal(encode_e4m3(bfloat16), encode_e4m3(bfloat16.astype(np.float32)))
    assert np.array_equal(encode_e4m3(values.astype(np.float64)), expected)
    assert encode_e4m3([1, 2, 3]).tolist() == [0x38, 0x40, 0x44]
    assert encode_e4m3(np.float32(2.0)).shape == ()


@pytest.mark.parametrize("bad", [np.array([1 + 2j]), np.array(["1.0"]), np.array([object()], dtype=object)])
def test_non_real_inputs_are_rejected(bad: np.ndarray) -> None:
    with pytest.raises(QuantizationError, match=r"encode_e4m3: tensor 'w' has dtype .* not a real number type"):
        encode_e4m3(bad, tensor_name="w")


def test_raw_byte_arrays_are_rejected() -> None:
    with pytest.raises(QuantizationError, match=r"tensor 'raw' of dtype \|V4 cannot be read as real numbers"):
        encode_e5m2(np.zeros(2, dtype="V4"), tensor_name="raw")


def test_decoders_reject_codes_out_of_range_or_not_integers() -> None:
    with pytest.raises(QuantizationError, match=r"decode_e2m1: code 16 at index \(1,\) does not fit in 4 bits"):
        decode_e2m1(np.array([3, 16]))
    with pytest.raises(QuantizationError, match=r"decode_e4m3: code -1 at index \(0,\) does not fit in 8 bits"):
        decode_e4m3(np.array([-1]))
    with pytest.raises(QuantizationError, match="decode_e5m2: codes have dtype float32"):
        decode_e5m2(np.array([1.0], np.float32))


# --- FP4 packing and integers ----------------------------------------------------------------------------------------


def test_pack_fp4_puts_the_first_code_in_the_low_nibble_like_onnx() -> None:
    from onnx import TensorProto, helper, numpy_helper

    values = np.array([0.5, -6.0, 1.5, 3.0, -0.0], np.float32)
    codes = encode_e2m1(values)
    packed = pack_fp4(codes)
    assert packed.tolist() == [0x1 | 0xF << 4, 0x3 | 0x5 << 4, 0x8]
    onnx_tensor = helper.make_tensor("t", TensorProto.FLOAT4E2M1, [5], values)  # ONNX packs FLOAT4E2M1 itself
    assert list(onnx_tensor.int32_data) == packed.tolist()
    assert np.array_equal(unpack_fp4(packed, count=5), codes)
    assert np.array_equal(numpy_helper.to_array(onnx_tensor).astype(np.float32), decode_e2m1(codes))


def test_pack_and_unpack_round_trip_every_pair_of_codes() -> None:
    codes = np.stack(np.meshgrid(ALL_NIBBLES, ALL_NIBBLES), axis=-1).reshape(-1)
    assert np.array_equal(unpack_fp4(pack_fp4(codes)), codes)
    assert unpack_fp4(pack_fp4(codes.reshape(16, 32)), count=7).tolist() == codes[:7].tolist()


def test_pack_and_unpack_reject_bad_input() -> None:
    with pytest.raises(QuantizationError, match="pack_fp4: code 16 at index"):
        pack_fp4(np.array([1, 16]))
    with pytest.raises(QuantizationError, match=r"unpack_fp4: count=5 is not a whole number of codes between 0 and 4"):
        unpack_fp4(np.array([1, 2], np.uint8), count=5)


def test_encode_int_rounds_half_to_even_and_saturates() -> None:
    values = np.array([0.5, 1.5, 2.5, -2.5, 127.4, 200.0, -200.0, np.inf])
    assert encode_int(values, bits=8).tolist() == [0, 2, 2, -2, 127, 127, -128, 127]
    assert encode_int(values, bits=4).tolist() == [0, 2, 2, -2, 7, 7, -8, 7]
    assert encode_int(np.array([-3.0, 300.0]), bits=8, signed=False).tolist() == [0, 255]
    assert encode_int(np.array([1.0]), bits=8).dtype == np.int8
    with pytest.raises(QuantizationError, match=r"encode_int: tensor 'x' holds NaN at index \(0,\)"):
        encode_int(np.array([np.nan]), bits=8, tensor_name="x")
    with pytest.raises(QuantizationError, match=r"bits=16 is not an integer width in 2\.\.8"):
        encode_int(values, bits=16)
