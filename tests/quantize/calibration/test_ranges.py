"""(scale, zero point) checked by running ONNX QuantizeLinear -> DequantizeLinear in the reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgekit.quantize.calibration import CalibrationError, TensorRange

ZERO_POINT_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "fp8_e4m3": TensorProto.FLOAT8E4M3FN}


def quantize_dequantize(values: np.ndarray, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]), helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"])],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [values.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [values.size])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]), helper.make_tensor("zp", ZERO_POINT_TYPES[dtype], [], [zero_point])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return ReferenceEvaluator(model).run(None, {"x": values.astype(np.float32)})[0]


CASES = [
    (TensorRange(-3.7, 3.7, "entropy", True), "int8", True),
    (TensorRange(-3.7, 3.7, "entropy", True), "uint8", True),
    (TensorRange(0.0, 5.3, "minmax", False), "uint8", False),
    (TensorRange(-1.7, 6.2, "minmax", False), "uint8", False),
    (TensorRange(-1.7, 6.2, "minmax", False), "int8", False),
    (TensorRange(0.4, 2.9, "minmax", False), "uint8", False),  # widened to include 0.0
    (TensorRange(-9.0, -2.0, "minmax", False), "int8", False),
    (TensorRange(-0.013, 0.05, "percentile", False), "uint8", False),
]


@pytest.mark.parametrize(("found", "dtype", "symmetric"), CASES)
def test_zero_is_exact_and_the_ends_are_within_half_a_step(found: TensorRange, dtype: str, symmetric: bool) -> None:
    scale, zero_point = found.scale_zero_point(dtype, symmetric)
    low, high = (-found.amax, found.amax) if symmetric else (min(found.min, 0.0), max(found.max, 0.0))
    probes = np.array([0.0, low, high, 0.5 * (low + high)], dtype=np.float32)
    restored = quantize_dequantize(probes, scale, zero_point, dtype)
    assert restored[0] == 0.0
    tolerance = 0.5 * scale * (1 + 1e-5)
    assert abs(restored[1] - low) <= tolerance
    assert abs(restored[2] - high) <= tolerance
    assert abs(restored[3] - probes[3]) <= tolerance
    if symmetric:
        assert zero_point == (0 if dtype == "int8" else 128)
        assert scale == pytest.approx(found.amax / 127, rel=1e-7)
    else:
        assert scale == pytest.approx((high - low) / 255, rel=1e-7)


def test_int8_symmetric_maps_amax_to_127() -> None:
    scale, zero_point = TensorRange(-2.54, 2.54, "entropy", True).scale_zero_point("int8")
    assert (scale, zero_point) == (pytest.approx(0.02), 0)
    assert np.float32(scale) == scale  # what the graph stores


def test_fp8_e4m3_maps_amax_to_448_and_zero_to_zero() -> None:
    found = TensorRange(-12.5, 12.5, "entropy", True)
    scale, zero_point = found.scale_zero_point("fp8_e4m3")
    assert zero_point == 0 and scale == pytest.approx(12.5 / 448, rel=1e-7)
    restored = quantize_dequantize(np.array([0.0, 12.5, -12.5, 1.0], dtype=np.float32), scale, zero_point, "fp8_e4m3")
    assert restored[0] == 0.0
    np.testing.assert_allclose(restored[1:3], [12.5, -12.5], rtol=1e-6)
    assert abs(restored[3] - 1.0) <= 1.0 / 16  # e4m3 keeps 3 mantissa bits


def test_quantization_errors_name_the_fix() -> None:
    found = TensorRange(-1.0, 2.0, "minmax", False)
    with pytest.raises(CalibrationError, match="fp8_e4m3 quantization is symmetric only") as info:
        found.scale_zero_point("fp8_e4m3")
    assert "symmetric=True" in str(info.value)
    with pytest.raises(CalibrationError, match="unknown quantized dtype 'int4'") as info:
        found.scale_zero_point("int4")  # type: ignore[arg-type]
    assert "int8, uint8, fp8_e4m3" in str(info.value)
    with pytest.raises(CalibrationError, match="min 2.0 > max 1.0"):
        TensorRange(2.0, 1.0, "minmax", False)
    with pytest.raises(CalibrationError, match="is not finite"):
        TensorRange(float("nan"), 1.0, "minmax", False)


def test_json_round_trip_and_malformed_json() -> None:
    found = TensorRange(-0.25, 3.0, "percentile", False)
    assert TensorRange.from_json(found.to_json(), "x") == found
    with pytest.raises(CalibrationError, match="cache.json: ranges.t: expected an object with keys min, max, method, symmetric"):
        TensorRange.from_json({"min": 0.0}, "cache.json: ranges.t")
    with pytest.raises(CalibrationError, match="min and max must be numbers"):
        TensorRange.from_json({"min": "0", "max": 1.0, "method": "minmax", "symmetric": False}, "where")
    with pytest.raises(CalibrationError, match="method must be a string and symmetric a boolean"):
        TensorRange.from_json({"min": 0.0, "max": 1.0, "method": 3, "symmetric": False}, "where")
