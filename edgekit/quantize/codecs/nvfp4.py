"""NVIDIA's NVFP4: FP4 E2M1 elements in blocks of 16, one FP8 E4M3 scale per block, one FP32 scale per tensor.

Two-level scaling as NVIDIA TensorRT Model Optimizer computes it for weights
(``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``, ``NVFP4QTensor.get_weights_scaling_factor_2``,
``get_weights_scaling_factor`` and ``quantize``), all arithmetic in float32::

    tensor_scale = amax(|x|) / (6 * 448)                   # E2M1 max * E4M3 max
    block_scale  = e4m3(amax(|block|) / (6 * tensor_scale)) # round to nearest even; 0 -> 1.0 for all-zero blocks
    codes        = e2m1(x / (block_scale * tensor_scale))   # round to nearest even, clamped to ±6
    x_hat        = e2m1_value * (block_scale * tensor_scale)

The TensorRT ``DynamicQuantize`` layer takes the per-tensor "double quantization" scale as an input and computes
the block scales the same way (docs.nvidia.com/deeplearning/tensorrt/latest/_static/operators/DynamicQuantize.html);
cuDNN's block-scale quantize rounds the block scale up instead of to nearest
(docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/BlockScaling.html), which this codec does not model.

Choices beyond Model Optimizer's code, so that every input gives finite codes:

* an all-zero tensor gets ``tensor_scale = 1.0`` (Model Optimizer would divide 0 by 0);
* a nonzero block whose scale rounds to zero in E4M3 (its amax below about ``2**-10 / 448`` of the tensor amax)
  gets the smallest E4M3 scale ``2**-9`` instead of a division by zero;
* with a caller-supplied ``tensor_amax`` smaller than the real one, block scales saturate at 448 and elements at ±6;
* NaN and ±inf raise :class:`~edgekit.errors.QuantizationError` naming the tensor and index: one non-finite value
  would make the per-tensor scale, and so the whole tensor, meaningless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs.blocks import check_block_and_axis, check_encoded, from_blocks, to_blocks
from edgekit.quantize.codecs.elements import E2M1, E4M3, decode_e2m1, decode_e4m3
from edgekit.quantize.codecs.minifloat import as_float64, describe_positions, encode_minifloat

NVFP4_BLOCK_SIZE = 16
_E2M1_MAX = np.float32(6.0)
_E4M3_MAX = np.float32(448.0)
_E4M3_ONE = 0x38  # code of 1.0
_E4M3_SMALLEST = 0x01  # code of 2**-9


@dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """An NVFP4-encoded tensor.

    ``codes``: E2M1 codes, one per uint8, shaped ``(*rest, n_blocks, block)`` (blocked axis moved last, zero-padded).
    ``block_scales_e4m3``: FP8 E4M3 codes ``(*rest, n_blocks)``. ``tensor_scale``: the FP32 per-tensor scale.
    """

    codes: np.ndarray
    block_scales_e4m3: np.ndarray
    tensor_scale: float
    shape: tuple[int, ...]
    axis: int = -1
    block: int = NVFP4_BLOCK_SIZE

    def __post_init__(self) -> None:
        shape, axis = check_encoded(self.codes, self.block_scales_e4m3, self.shape, self.block, self.axis,
                                    code_bits=4, what="NVFP4Tensor")
        scale = float(self.tensor_scale)
        if not (np.isfinite(scale) and scale > 0):
            raise QuantizationError(f"NVFP4Tensor: tensor_scale={self.tensor_scale!r} is not a positive finite number",
                                    hint="build it with nvfp4_quantize rather than by hand")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "tensor_scale", scale)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed encoding: two codes per byte, one byte per block scale, four for the tensor scale."""
        return -(-self.codes.size // 2) + self.block_scales_e4m3.size + 4


def nvfp4_quantize(x: Any, block: int = NVFP4_BLOCK_SIZE, axis: int = -1, *, tensor_amax: float | None = None,
                   tensor_name: str = "input") -> NVFP4Tensor:
    """Encode ``x`` (read as float32) as NVFP4 along ``axis``.

    ``tensor_amax`` replaces ``max |x|`` in the per-tensor scale (a calibrated activation range, say).
    """
    values = as_float64(x, what="nvfp4_quantize", tensor_name=tensor_name)
    with np.errstate(over="ignore"):
        values32 = values.astype(np.float32)
    non_finite = ~np.isfinite(values32)
    if non_finite.any():
        raise QuantizationError(
            f"nvfp4_quantize: tensor '{tensor_name}' holds {float(values[non_finite].flat[0])!r} "
            f"{describe_positions(non_finite)}; NVFP4 needs finite float32 values for its per-tensor scale",
            hint="find where the NaN/inf comes from and fix it before quantizing",
        )
    axis = check_block_and_axis(values.shape, block, axis, what="nvfp4_quantize", tensor_name=tensor_name)
    tensor_scale = _tensor_scale(values32, tensor_amax, tensor_name)
    blocks = to_blocks(values32, int(block), axis)
    block_amax = np.max(np.abs(blocks), axis=-1)
    block_scale = block_amax / (_E2M1_MAX * tensor_scale)
    block_scale = np.where(block_scale == 0, np.float32(1.0), block_scale)
    scale_codes, _ = encode_minifloat(block_scale.astype(np.float64), E4M3, saturate=True)
    scale_codes = np.where(scale_codes == 0, _E4M3_SMALLEST, scale_codes).astype(np.uint8)
    total_scale = decode_e4m3(scale_codes) * tensor_scale
    codes, _ = encode_minifloat((blocks / total_scale[..., None]).astype(np.float64), E2M1, saturate=True)
    return NVFP4Tensor(codes=codes, block_scales_e4m3=scale_codes, tensor_scale=float(tensor_scale),
                       shape=values.shape, axis=axis, block=int(block))


def _tensor_scale(values32: np.ndarray, tensor_amax: float | None, tensor_name: str) -> np.float32:
    if tensor_amax is None:
        amax = np.float32(np.max(np.abs(values32))) if values32.size else np.float32(0.0)
    else:
        is_number = isinstance(tensor_amax, (int, float, np.number)) and not isinstance(tensor_amax, bool)
        with np.errstate(over="ignore"):
            amax = np.float32(tensor_amax) if is_number else np.float32(np.nan)
        if not (np.isfinite(amax) and amax > 0):
            raise QuantizationError(
                f"nvfp4_quantize: tensor_amax={tensor_amax!r} for tensor '{tensor_name}' is not a positive number "
                "within the float32 range",
                hint="pass the calibrated max |x| of the tensor, or None to use the tensor's own",
            )
    if amax == 0:
        return np.float32(1.0)
    scale = amax / (_E2M1_MAX * _E4M3_MAX)
    if scale == 0:
        raise QuantizationError(
            f"nvfp4_quantize: tensor '{tensor_name}' has max |x| = {float(amax)!r}, too small for an FP32 "
            f"per-tensor scale (amax / 2688 underflows to zero)",
            hint="multiply the tensor by a power of two before quantizing and divide the result by it afterwards",
        )
    return np.float32(scale)


def nvfp4_dequantize(tensor: NVFP4Tensor) -> np.ndarray:
    """float32 values of an :class:`NVFP4Tensor` in the original shape: ``e2m1 * (e4m3_scale * tensor_scale)``."""
    total_scale = decode_e4m3(tensor.block_scales_e4m3) * np.float32(tensor.tensor_scale)
    values = decode_e2m1(tensor.codes) * total_scale[..., None]
    return from_blocks(values, tensor.shape, tensor.axis)
