"""collect_activations on a real ONNX Runtime session over a tiny model built in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.quantize.calibration import CalibrationError, CalibratorSpec, collect_activations, default_activation_tensors
from edgekit.quantize.calibration.collect import constant_tensors

from .conftest import mlp_model, weights

MINMAX = CalibratorSpec.create("minmax", symmetric=False)


def by_hand(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    w1, w2 = weights()
    x = np.concatenate([batch["x"] for batch in batches])
    hidden = x @ w1
    activated = np.maximum(hidden, 0.0)
    return {"x": x, "hidden": hidden, "activated": activated, "y": activated @ w2}


def test_default_tensors_are_the_activation_inputs_of_both_matmuls(mlp_path: Path) -> None:
    assert default_activation_tensors(onnx.load(str(mlp_path))) == ["x", "activated"]


def test_minmax_ranges_equal_numpy_on_the_same_intermediates(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    ranges = collect_activations(mlp_path, None, iter(mlp_batches), MINMAX)
    expected = by_hand(mlp_batches)
    assert list(ranges) == ["x", "activated"]
    for name, found in ranges.items():
        assert found.method == "minmax" and not found.symmetric
        assert found.min == pytest.approx(float(expected[name].min()), rel=1e-6, abs=1e-7)
        assert found.max == pytest.approx(float(expected[name].max()), rel=1e-6, abs=1e-7)
    assert ranges["activated"].min == 0.0


def test_explicit_tensors_include_graph_outputs_and_the_model_file_is_untouched(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    before = mlp_path.read_bytes()
    ranges = collect_activations(mlp_path, ["hidden", "y", "hidden"], mlp_batches, CalibratorSpec.create("minmax"))
    expected = by_hand(mlp_batches)
    assert list(ranges) == ["hidden", "y"]
    for name in ranges:
        assert ranges[name].max == pytest.approx(float(np.abs(expected[name]).max()), rel=1e-6)
        assert ranges[name].min == -ranges[name].max
    assert mlp_path.read_bytes() == before


def test_entropy_through_the_session(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    ranges = collect_activations(mlp_path, None, mlp_batches, CalibratorSpec.create("entropy"))
    amax = float(np.abs(by_hand(mlp_batches)["activated"]).max())
    assert 0.0 < ranges["activated"].max <= amax


def test_model_with_external_data(tmp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    directory = tmp_path / "external"
    (directory / "weights").mkdir(parents=True)
    path = directory / "mlp.onnx"
    onnx.save(mlp_model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights/mlp.bin", size_threshold=0)
    assert (directory / "weights" / "mlp.bin").is_file()
    ranges = collect_activations(path, None, mlp_batches, MINMAX, work_dir=tmp_path)
    assert ranges["activated"].max == pytest.approx(float(by_hand(mlp_batches)["activated"].max()), rel=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["external"]  # the temporary copy is gone

    (directory / "weights" / "mlp.bin").unlink()
    with pytest.raises(CalibrationError, match="external data file 'weights/mlp.bin' is missing") as info:
        collect_activations(path, None, mlp_batches, MINMAX)
    assert "copy the weight files together with the model" in str(info.value)


def test_constants_and_weights_feeding_matmul_are_not_activations() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c_value", TensorProto.FLOAT, [2, 2], [1, 0, 0, 1])),
            helper.make_node("Transpose", ["c"], ["c_t"]),
            helper.make_node("MatMul", ["x", "c_t"], ["h"]),
            helper.make_node("Gemm", ["h", "h", "bias"], ["g"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor("bias", TensorProto.FLOAT, [2], [0.0, 0.0])],
    )
    model = helper.make_model(graph)
    assert constant_tensors(model.graph) == {"bias", "c", "c_t"}
    assert default_activation_tensors(model) == ["x", "h"]


def test_unknown_tensor_names_and_weights_are_rejected(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    with pytest.raises(CalibrationError, match="the graph has no tensor named 'Hidden'") as info:
        collect_activations(mlp_path, ["Hidden"], mlp_batches, MINMAX)
    assert "similar names: hidden" in str(info.value)
    with pytest.raises(CalibrationError, match="tensor 'w1' is a weight"):
        collect_activations(mlp_path, ["w1"], mlp_batches, MINMAX)
    with pytest.raises(CalibrationError, match="tensor_names must be a list of tensor names, got the string 'hidden'") as info:
        collect_activations(mlp_path, "hidden", mlp_batches, MINMAX)
    assert "pass ['hidden']" in str(info.value)


def test_batches_that_do_not_fit_the_model(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    with pytest.raises(CalibrationError, match=r"calibration batch 1 has no input 'x' \(has \['image'\]\)") as info:
        collect_activations(mlp_path, None, [mlp_batches[0], {"image": mlp_batches[0]["x"]}], MINMAX)
    assert "the model's inputs: x" in str(info.value)
    with pytest.raises(CalibrationError, match="ONNX Runtime failed on calibration batch 0") as info:
        collect_activations(mlp_path, None, [{"x": np.zeros((2, 7), dtype=np.float32)}], MINMAX)
    assert "dtypes and shapes" in str(info.value)
    with pytest.raises(CalibrationError, match="calibration batch 0 is a list"):
        collect_activations(mlp_path, None, [[1.0]], MINMAX)  # type: ignore[list-item]
    with pytest.raises(CalibrationError, match="no calibration batches were given"):
        collect_activations(mlp_path, None, [], MINMAX)


def test_nan_in_an_intermediate_names_tensor_and_batch(mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    poisoned = {"x": np.full((2, 4), np.nan, dtype=np.float32)}
    with pytest.raises(CalibrationError, match=r"tensor 'x', calibration batch 3: activations contain NaN"):
        collect_activations(mlp_path, None, [*mlp_batches, poisoned], MINMAX)


def test_missing_or_unreadable_model(tmp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    with pytest.raises(CalibrationError, match="ONNX model not found"):
        collect_activations(tmp_path / "absent.onnx", None, mlp_batches, MINMAX)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x00not a model")
    with pytest.raises(CalibrationError, match="is not a readable ONNX model"):
        collect_activations(broken, None, mlp_batches, MINMAX)


def test_model_without_matmul_needs_explicit_tensors(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    with pytest.raises(CalibrationError, match="no tensors to calibrate .the model has no MatMul, Gemm or Conv") as info:
        collect_activations(path, None, [{"x": np.ones(2, dtype=np.float32)}], MINMAX)
    assert "pass tensor_names explicitly" in str(info.value)
    ranges = collect_activations(path, ["y"], [{"x": np.array([-1.0, 3.0], dtype=np.float32)}], MINMAX)
    assert (ranges["y"].min, ranges["y"].max) == (0.0, 3.0)


def test_tensor_of_unknown_type_is_reported(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["m"], domain="vendor"), helper.make_node("Relu", ["m"], ["y"])],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor", 1)], ir_version=9)
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    with pytest.raises(CalibrationError, match="the element type of tensor 'm' cannot be inferred"):
        collect_activations(path, ["m"], [{"x": np.ones(2, dtype=np.float32)}], MINMAX)
    with pytest.raises(CalibrationError, match="ONNX Runtime cannot load the model for calibration") as info:
        collect_activations(path, ["y"], [{"x": np.ones(2, dtype=np.float32)}], MINMAX)
    assert "opset and IR version" in str(info.value)
