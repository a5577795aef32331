"""ONNX Runtime's default static plan written from the ranges auto's shared calibration collected: the same
model quantize_static writes from its own MinMax pass, with no second pass over the data."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import QuantizationError
from edgekit.quantize.ort import default_plan
from edgekit.quantize.ort.candidates import INT8_ORT_DEFAULT, ORT_DEFAULT
from edgekit.quantize.ort.sessions import ort_session
from edgekit.quantize.calibration import CalibratorSpec, calibrate
from tests.quantize.test_auto_plain import search


def small_cnn(path: Path) -> Path:
    """Conv-Relu-Conv + residual Add, pooled, a Gemm head: nothing cnn_folding rewrites, so auto's int8 graph
    is the graph ONNX Runtime's default plan quantizes."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.normal(0, 0.3, (4, 4, 3, 3)), "b1": rng.normal(0, 0.1, 4), "w2": rng.normal(0, 0.3, (4, 4, 3, 3)),
               "b2": rng.normal(0, 0.1, 4), "wh": rng.normal(0, 0.3, (4, 5)), "bh": rng.normal(0, 0.1, 5), "shape": np.array([0, -1])}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"], "add"),
             helper.make_node("GlobalAveragePool", ["s"], ["p"], "pool"),
             helper.make_node("Reshape", ["p", "shape"], ["f"], "flatten"),
             helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], "head")]
    inits = [numpy_helper.from_array(v.astype(np.int64 if k == "shape" else np.float32), k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def batches(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (4, 4, 10, 10)).astype(np.float32)} for _ in range(count)]


def quantize_static_defaults(model: Path, out: Path, data: list[dict[str, np.ndarray]]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(data)

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.batches, None)

    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def outputs(path: Path, data: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    session = ort_session(path)
    return [session.run(None, batch)[0] for batch in data]


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_ranges_from_an_edgekit_pass_write_the_model_quantize_static_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the module, not its function

    fp32 = small_cnn(tmp_path / "fp32.onnx")
    data = batches(3, seed=1)
    peer = quantize_static_defaults(fp32, tmp_path / "peer.onnx", data)
    names = default_plan.minmax_tensors(fp32)
    assert {"x", "c1", "r1", "c2", "s", "f", "y"} <= set(names)
    # one pass: the plan's own calibrator (percentile) on Conv inputs, and ONNX Runtime's MinMax tensors beside it
    result = calibrate(fp32, data, CalibratorSpec.create("percentile"), tensor_names=["x", "r1"], work_dir=tmp_path, also_minmax=names)
    assert set(result.ranges) == {"x", "r1"} and result.ranges["x"].method == "percentile" and result.minmax is not None
    assert result.minmax["x"].max == pytest.approx(float(max(b["x"].max() for b in data)))

    def no_second_pass(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("quantize_static ran its own calibration")

    monkeypatch.setattr(ort_quantize, "create_calibrator", no_second_pass)
    ours = default_plan.write_with_ranges(fp32, tmp_path / "ours.onnx", result.minmax)
    theirs, mine = initializers(peer), initializers(ours)
    assert theirs.keys() == mine.keys() and any(k.endswith("_scale") for k in mine)
    for name, value in theirs.items():  # scales, zero points and int8 weights
        np.testing.assert_allclose(mine[name], value, rtol=1e-6, err_msg=name)
    assert [n.op_type for n in onnx.load(str(ours)).graph.node] == [n.op_type for n in onnx.load(str(peer)).graph.node]
    for a, b in zip(outputs(ours, data), outputs(peer, data), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_missing_ranges_name_the_tensors(tmp_path: Path) -> None:
    fp32 = small_cnn(tmp_path / "fp32.onnx")
    with pytest.raises(QuantizationError, match="no MinMax range for .* tensor"):
        default_plan.write_with_ranges(fp32, tmp_path / "ours.onnx", {})


def test_auto_writes_onnx_runtimes_default_plan_without_its_own_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the module, not its function

    fp32 = small_cnn(tmp_path / "fp32.onnx")

    def no_second_pass(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("quantize_static ran its own calibration")

    monkeypatch.setattr(ort_quantize, "create_calibrator", no_second_pass)
    result = search(fp32, tmp_path, {"int8-static": 80.0, "int8-ort-default": 60.0, "exported": 90.0, "fp16": 140.0})
    rows = {row.name: row for row in result.table}
    assert result.chosen.name == INT8_ORT_DEFAULT and result.chosen.graph == ORT_DEFAULT and rows[INT8_ORT_DEFAULT].status == "chosen"
    assert result.stats["calibration_passes"] == 1
    monkeypatch.undo()
    peer = quantize_static_defaults(tmp_path / "work" / "fp32-exported.onnx", tmp_path / "peer.onnx", batches(3, seed=1))
    evaluation = batches(2, seed=5)
    for a, b in zip(outputs(result.model_path, evaluation), outputs(peer, evaluation), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_the_minmax_ranges_are_cached_beside_the_plans(tmp_path: Path) -> None:
    from edgekit.quantize.calibration import CalibrationCache

    fp32 = small_cnn(tmp_path / "fp32.onnx")
    data, cache = batches(2, seed=1), CalibrationCache(tmp_path / "cache")
    names = default_plan.minmax_tensors(fp32)
    spec = CalibratorSpec.create("percentile")
    first = calibrate(fp32, data, spec, tensor_names=["x", "r1"], cache=cache, work_dir=tmp_path, also_minmax=names)
    again = calibrate(fp32, data, spec, tensor_names=["x", "r1"], cache=cache, work_dir=tmp_path, also_minmax=names)
    assert not first.from_cache and again.from_cache and again.minmax == first.minmax and again.ranges == first.ranges
    # a plain int8 build cached the plan's ranges alone: the hit runs a MinMax-only pass (ResNet's int8-ort-default was
    # priced as a second calibration and skipped by auto's time budget), caches it, and says how long it took
    other = CalibrationCache(tmp_path / "other")
    plain = calibrate(fp32, data, spec, tensor_names=["r1"], cache=other, work_dir=tmp_path)
    hit = calibrate(fp32, data, spec, tensor_names=["r1"], cache=other, work_dir=tmp_path, also_minmax=names)
    assert not plain.from_cache and hit.from_cache and hit.ranges == plain.ranges
    assert hit.minmax == first.minmax and hit.minmax_only_seconds > 0
    second = calibrate(fp32, data, spec, tensor_names=["r1"], cache=other, work_dir=tmp_path, also_minmax=names)
    assert second.minmax == first.minmax and second.minmax_only_seconds == 0.0  # cached beside now
