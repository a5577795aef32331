"""The format registry: every entry fake-quantizes, sizes add up, bad requests fail with useful errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgekit.errors import QuantizationError
from edgekit.quantize.codecs import (
    FORMATS,
    decode_e2m1,
    decode_e4m3,
    encode_e2m1,
    encode_e4m3,
    mx_dequantize,
    mx_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
    pack_fp4,
    quantize_dequantize,
)

WEIGHTS = np.random.default_rng(0).standard_normal((8, 70)).astype(np.float32) * 0.05


def test_the_registry_holds_exactly_the_supported_formats() -> None:
    assert set(FORMATS) == {"fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"}
    assert all(name == spec.name for name, spec in FORMATS.items())


@pytest.mark.parametrize(
    ("name", "bits", "block", "scale", "max_value"),
    [
        ("fp8_e4m3", 8.0, None, None, 448.0),
        ("fp8_e5m2", 8.0, None, None, 57344.0),
        ("fp4_e2m1", 4.0, None, None, 6.0),
        ("mxfp8_e4m3", 8.25, 32, "e8m0", 448.0),
        ("mxfp8_e5m2", 8.25, 32, "e8m0", 57344.0),
        ("mxfp4", 4.25, 32, "e8m0", 6.0),
        ("nvfp4", 4.5, 16, "e4m3", 6.0),
    ],
)
def test_format_specs(name: str, bits: float, block: int | None, scale: str | None, max_value: float) -> None:
    spec = FORMATS[name]
    assert (spec.effective_bits_per_value, spec.block_size, spec.scale_format, spec.max_value) == (bits, block, scale, max_value)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_fake_quantizes_with_bounded_error(name: str) -> None:
    spec = FORMATS[name]
    scale = None if spec.block_size else float(np.abs(WEIGHTS).max()) / spec.max_value
    decoded = quantize_dequantize(WEIGHTS, name, scale=scale)
    assert decoded.shape == WEIGHTS.shape and decoded.dtype == np.float32
    relative_rms = float(np.sqrt(np.mean((decoded - WEIGHTS) ** 2) / np.mean(WEIGHTS**2)))
    assert 0 < relative_rms < (0.08 if spec.element_bits == 8 else 0.2)
    if name != "nvfp4":  # a second pass keeps every value (NVFP4 may re-round its E4M3 block scales)
        assert np.array_equal(quantize_dequantize(decoded, name, scale=scale), decoded)


def test_fake_quant_is_the_codec_round_trip() -> None:
    assert np.array_equal(quantize_dequantize(WEIGHTS * 1e4, "fp8_e4m3"), decode_e4m3(encode_e4m3(WEIGHTS * 1e4)))
    assert np.array_equal(quantize_dequantize(WEIGHTS, "mxfp4", axis=0), mx_dequantize(mx_quantize(WEIGHTS, "e2m1", axis=0)))
    assert np.array_equal(quantize_dequantize(WEIGHTS, "nvfp4"), nvfp4_dequantize(nvfp4_quantize(WEIGHTS)))
    scale = 0.25
    expected = decode_e2m1(encode_e2m1(WEIGHTS.astype(np.float64) / scale)) * scale
    assert np.array_equal(quantize_dequantize(WEIGHTS, "fp4_e2m1", scale=scale), expected)


def test_fp8_fake_quant_saturates_and_passes_nan() -> None:
    decoded = quantize_dequantize(np.array([1e6, -1e6, np.nan, -0.0]), "fp8_e4m3")
    assert decoded[:2].tolist() == [448.0, -448.0] and np.isnan(decoded[2]) and np.signbit(decoded[3])
    assert quantize_dequantize(np.array([1e6, np.inf]), "fp8_e5m2").tolist() == [57344.0, np.inf]


def test_fp4_fake_quant_names_the_tensor_holding_nan() -> None:
    with pytest.raises(QuantizationError, match=r"tensor 'head\.bias' holds NaN at index \(2,\)"):
        quantize_dequantize(np.array([0.0, 1.0, np.nan]), "fp4_e2m1", tensor_name="head.bias")


def test_unknown_format_and_bad_scales_are_rejected() -> None:
    with pytest.raises(QuantizationError, match=r"unknown format 'int3' for tensor 'w'") as info:
        quantize_dequantize(WEIGHTS, "int3", tensor_name="w")
    assert "mxfp4" in str(info.value)
    with pytest.raises(QuantizationError, match=r"format 'nvfp4' computes its own block scales; scale=2\.0 was given"):
        quantize_dequantize(WEIGHTS, "nvfp4", scale=2.0)
    for bad in (0.0, -1.0, float("inf"), "1"):
        with pytest.raises(QuantizationError, match=r"scale=.* for tensor 'input' is not a positive finite number"):
            quantize_dequantize(WEIGHTS, "fp8_e4m3", scale=bad)


@pytest.mark.parametrize("shape", [(8, 70), (5,), (3, 4, 33)])
def test_encoded_bytes_counts_what_the_encoders_produce(shape: tuple[int, ...]) -> None:
    values = np.ones(shape, np.float32)
    assert FORMATS["fp8_e4m3"].encoded_bytes(shape) == encode_e4m3(values).nbytes
    assert FORMATS["fp4_e2m1"].encoded_bytes(shape) == pack_fp4(encode_e2m1(values)).nbytes
    assert FORMATS["mxfp8_e4m3"].encoded_bytes(shape) == mx_quantize(values, "e4m3").nbytes
    assert FORMATS["mxfp4"].encoded_bytes(shape) == mx_quantize(values, "e2m1").nbytes
    assert FORMATS["nvfp4"].encoded_bytes(shape) == nvfp4_quantize(values).nbytes
    with pytest.raises(QuantizationError, match=r"nvfp4\.encoded_bytes: axis=5 is not an axis of tensor 'shape'"):
        FORMATS["nvfp4"].encoded_bytes(shape, axis=5)


def test_the_codecs_import_neither_torch_nor_ml_dtypes() -> None:
    code = "import sys, edgekit.quantize.codecs; print(sorted({'torch', 'ml_dtypes', 'onnx'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
