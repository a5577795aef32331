"""NVFP4: scales against a PyTorch re-derivation of Model Optimizer's recipe, reconstruction error, edge cases."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs import FORMATS, NVFP4Tensor, decode_e4m3, nvfp4_dequantize, nvfp4_quantize


def modelopt_style_reference(values: np.ndarray, block: int = 16) -> tuple[float, np.ndarray, np.ndarray]:
    """NVIDIA Model Optimizer's NVFP4 weight recipe written out in torch float32 (last axis, multiple of block).

    Returns (tensor scale, E4M3 block-scale codes, E2M1 codes); E2M1 rounding by ml_dtypes (saturating RNE).
    """
    x = torch.from_numpy(values).float()
    tensor_scale = x.abs().max() / (6.0 * 448.0)
    blocks = x.reshape(*x.shape[:-1], -1, block)
    block_scale = blocks.abs().amax(dim=-1) / (6.0 * tensor_scale)
    block_scale[block_scale == 0] = 1.0
    block_scale_fp8 = block_scale.to(torch.float8_e4m3fn)
    scaled = blocks / (block_scale_fp8.float() * tensor_scale).unsqueeze(-1)
    codes = scaled.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return float(tensor_scale), block_scale_fp8.view(torch.uint8).numpy(), codes


def gaussian(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, (*shape[:-1], 1)))  # rows of different ranges
    return rows.astype(np.float32)


def test_scales_and_codes_match_the_model_optimizer_recipe_bit_for_bit() -> None:
    values = gaussian((16, 64))
    values[3, 16:32] = 0.0  # an all-zero block takes scale 1.0
    tensor = nvfp4_quantize(values)
    tensor_scale, block_scales, codes = modelopt_style_reference(values)
    assert tensor.tensor_scale == tensor_scale == np.float32(np.abs(values).max()) / np.float32(2688.0)
    assert np.array_equal(tensor.block_scales_e4m3, block_scales)
    assert np.array_equal(tensor.codes, codes)
    assert tensor.block_scales_e4m3[3, 1] == 0x38  # 1.0
    assert tensor.block_scales_e4m3.max() == 0x7E  # the block holding the tensor's amax gets scale 448


def test_reconstruction_error_is_at_most_one_scale_step_per_block() -> None:
    values = gaussian((32, 80), seed=1)
    tensor = nvfp4_quantize(values)
    decoded = nvfp4_dequantize(tensor)
    assert decoded.shape == values.shape and decoded.dtype == np.float32
    total_scale = np.repeat(decode_e4m3(tensor.block_scales_e4m3) * np.float32(tensor.tensor_scale), 16, axis=-1)
    # Half of E2M1's largest step (2) is 1 scale; E4M3 rounding of the block scale can push |x| / scale up to
    # 6 * (1 + 2**-4), so a clamped value is off by less than 1 scale too.
    assert (np.abs(decoded - values) <= total_scale * 1.0000001).all()
    relative_rms = np.sqrt(np.mean((decoded - values) ** 2, axis=-1) / np.mean(values**2, axis=-1))
    assert (relative_rms < 0.15).all()


def test_zero_tensor_encodes_to_zeros_with_unit_scales() -> None:
    tensor = nvfp4_quantize(np.zeros((2, 32), np.float32))
    assert tensor.tensor_scale == 1.0
    assert (tensor.block_scales_e4m3 == 0x38).all() and (tensor.codes == 0).all()
    assert (nvfp4_dequantize(tensor) == 0).all()
    assert nvfp4_quantize(np.zeros((0, 16))).codes.shape == (0, 1, 16)


def test_tiny_block_next_to_a_huge_one_stays_finite() -> None:
    values = np.zeros((1, 32), np.float32)
    values[0, 0] = 1.0e6
    values[0, 16] = 1.0e-3  # block scale 448 * 1e-9, below E4M3's smallest subnormal
    tensor = nvfp4_quantize(values)
    assert tensor.block_scales_e4m3.tolist() == [[0x7E, 0x01]]
    decoded = nvfp4_dequantize(tensor)
    assert np.isfinite(decoded).all() and decoded[0, 0] == pytest.approx(1.0e6, rel=0.01) and decoded[0, 16] == 0.0


def test_calibrated_tensor_amax_below_the_real_one_saturates() -> None:
    values = np.linspace(-10, 10, 32, dtype=np.float32).reshape(2, 16)
    tensor = nvfp4_quantize(values, tensor_amax=5.0)
    assert tensor.tensor_scale == np.float32(5.0) / np.float32(2688.0)
    assert (tensor.block_scales_e4m3 == 0x7E).all()
    decoded = nvfp4_dequantize(tensor)
    assert np.abs(decoded).max() == pytest.approx(5.0, rel=1e-6) and decoded[0, 0] < 0


@pytest.mark.parametrize(("shape", "axis"), [((3, 20), -1), ((17,), 0), ((40, 2), 0)])
def test_lengths_that_are_not_a_multiple_of_16_round_trip_in_shape(shape: tuple[int, ...], axis: int) -> None:
    values = gaussian(shape, seed=2)
    tensor = nvfp4_quantize(values, axis=axis)
    decoded = nvfp4_dequantize(tensor)
    assert decoded.shape == shape
    assert np.abs(decoded - values).max() <= np.abs(values).max() / 6 * 1.07
    assert tensor.nbytes == FORMATS["nvfp4"].encoded_bytes(shape, axis=axis)


def test_non_finite_values_are_rejected_with_their_position() -> None:
    values = np.ones((2, 16), np.float32)
    values[1, 4] = np.inf
    with pytest.raises(QuantizationError, match=r"tensor 'act' holds inf at index \(1, 4\); NVFP4 needs finite"):
        nvfp4_quantize(values, tensor_name="act")
    with pytest.raises(QuantizationError, match=r"holds 1e\+300 at index \(0,\)"):
        nvfp4_quantize(np.array([1e300]))  # beyond float32


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), 1e300, "3"])
def test_bad_tensor_amax_is_rejected(bad: object) -> None:
    with pytest.raises(QuantizationError, match=r"tensor_amax=.* for tensor 'w' is not a positive number within the float32"):
        nvfp4_quantize(np.ones(16), tensor_amax=bad, tensor_name="w")


def test_amax_too_small_for_a_tensor_scale_is_rejected() -> None:
    with pytest.raises(QuantizationError, match=r"max \|x\| = 1\.40129.*e-45, too small for an FP32 per-tensor scale"):
        nvfp4_quantize(np.array([1.4e-45, 0.0], np.float32))


def test_hand_built_tensors_are_checked() -> None:
    good = nvfp4_quantize(np.ones((2, 16)))
    with pytest.raises(QuantizationError, match=r"NVFP4Tensor: codes uint8\(2, 1, 16\) .* do not fit shape \(2, 32\)"):
        NVFP4Tensor(good.codes, good.block_scales_e4m3, good.tensor_scale, (2, 32))
    with pytest.raises(QuantizationError, match=r"NVFP4Tensor: tensor_scale=0\.0 is not a positive finite number"):
        NVFP4Tensor(good.codes, good.block_scales_e4m3, 0.0, (2, 16))
    with pytest.raises(QuantizationError, match="block=-16 for tensor 'codes' is not a positive whole number"):
        NVFP4Tensor(good.codes, good.block_scales_e4m3, 1.0, (2, 16), block=-16)
