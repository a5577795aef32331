"""Exact NumPy codecs for low-precision number formats: FP8 (E4M3, E5M2), FP4 (E2M1), E8M0 scales, the OCP
Microscaling block formats (MXFP8, MXFP4) and NVIDIA's NVFP4.

Encoders round to nearest, ties to even, bit-for-bit as ml_dtypes and PyTorch casts do; decoders return float32.
:func:`quantize_dequantize` with the :data:`FORMATS` registry is the entry point for estimating a model's accuracy
and size in a format the host cannot run. Pure NumPy: nothing here imports torch.
"""

from __future__ import annotations

from edgekit.quantize.codecs.elements import (
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
from edgekit.quantize.codecs.formats import FORMATS, FormatSpec, quantize_dequantize
from edgekit.quantize.codecs.mx import MX_BLOCK_SIZE, MXTensor, mx_dequantize, mx_quantize
from edgekit.quantize.codecs.nvfp4 import NVFP4_BLOCK_SIZE, NVFP4Tensor, nvfp4_dequantize, nvfp4_quantize

__all__ = [
    "FORMATS",
    "MX_BLOCK_SIZE",
    "NVFP4_BLOCK_SIZE",
    "FormatSpec",
    "MXTensor",
    "NVFP4Tensor",
    "decode_e2m1",
    "decode_e4m3",
    "decode_e5m2",
    "decode_e8m0",
    "encode_e2m1",
    "encode_e4m3",
    "encode_e5m2",
    "encode_e8m0",
    "encode_int",
    "mx_dequantize",
    "mx_quantize",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "pack_fp4",
    "quantize_dequantize",
    "unpack_fp4",
]
