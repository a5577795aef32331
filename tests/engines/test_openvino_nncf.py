"""int8 on the openvino engine from NNCF (``build.quantization.quantizer: nncf``): the digits demo quantized by real
NNCF on its calibration batches, built and self-checked on real OpenVINO, inside the recipe's accuracy budget, with the
quantizer and its version in the manifest; and every build the quantizer does not apply to refused naming the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from edgekit.engines.openvino_nncf import check_quantizer, count_samples, quantize_with_nncf
from edgekit.errors import QuantizationError
from edgekit.pipeline import build
from edgekit.precision import Backend, Precision
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.conftest import REPO
from tests.hidden_module import hide_module

pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
nncf = pytest.importorskip("nncf", reason="NNCF is not installed (pip install 'edgekit[openvino]')")


def _recipe(tmp_path: Path) -> Path:
    data = yaml.safe_load((REPO / "recipes" / "digits-cnn.yaml").read_text())
    data.setdefault("build", {})["quantization"] = {"quantizer": "nncf"}
    path = tmp_path / "digits-nncf.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_nncf_int8_digits_within_budget_recorded_and_self_checked(tmp_path: Path) -> None:
    result = build(_recipe(tmp_path), "x86-64-cpu", precision="int8", out=tmp_path / "b", backend="openvino")
    quantization = result.manifest["quantization"]
    assert quantization["plan"] is None  # not edgekit's QDQ plan
    record = quantization["quantizer"]
    assert (record["name"], record["version"], record["target_device"]) == ("nncf", nncf.__version__, "CPU")
    assert record["samples"] == 256  # the recipe's 8 calibration batches of 32
    ops = [node.op_type for node in onnx.load(str(tmp_path / "b" / "model.onnx")).graph.node]
    assert ops.count("QuantizeLinear") >= 3 and "Conv" in ops  # a QDQ ONNX graph: the bundle stays ONNX
    accuracy = result.manifest["accuracy"]
    assert accuracy["passed"] and accuracy["drop"] <= 0.005  # the recipe's top-1 budget
    assert result.manifest["backend"]["openvino"]["inference_precision_hint"] == "f32"
    bundle = open_bundle(tmp_path / "b", verify=True)
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed


@pytest.mark.parametrize(("backend", "precision"), [(Backend.ONNXRUNTIME, Precision.INT8), (Backend.OPENVINO, Precision.FP32),
                                                    (Backend.OPENVINO, "auto")])  # fmt: skip
def test_nncf_applies_only_to_int8_on_openvino(backend: Backend, precision: Precision | str) -> None:
    with pytest.raises(QuantizationError, match="build.quantization.quantizer is nncf, which quantizes int8 for the openvino backend"):
        check_quantizer(QuantizationSpec(quantizer="nncf"), backend, precision, "r.yaml")
    check_quantizer(QuantizationSpec(), backend, precision, "r.yaml")  # edgekit's own quantizer: nothing to refuse
    check_quantizer(QuantizationSpec(quantizer="nncf"), Backend.OPENVINO, Precision.INT8, "r.yaml")


def test_a_recipe_asking_nncf_for_another_backend_stops_at_load(tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="this build is int8 on onnxruntime"):
        build(_recipe(tmp_path), "x86-64-cpu", precision="int8", out=tmp_path / "b", backend="onnxruntime")
    assert not (tmp_path / "b").exists()


def test_without_nncf_the_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "nncf")
    with pytest.raises(QuantizationError, match="nncf needs NNCF, which is not installed") as err:
        build(_recipe(tmp_path), "x86-64-cpu", precision="int8", out=tmp_path / "b", backend="openvino")
    assert "edgekit[openvino]" in (err.value.hint or "")


def _two_input_model(path: Path, first: str) -> Path:
    """``x`` float32[batch, 16] -> MatMul -> ``y``, after a first input that is a scalar (``scale``) or a state whose
    batch is axis 1 (``state`` [2, batch, 16]): neither starts with the batch dim."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    inputs = {"scale": helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
              "state": helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 16])}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mul", ["h", "scale" if first == "scale" else "one"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])]
    if first == "state":
        nodes.append(helper.make_node("Identity", ["state"], ["state_out"]))
        outputs.append(helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [2, "batch", 16]))
    graph = helper.make_graph(nodes, "two_inputs", [inputs[first], helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              outputs, [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(1, np.float32), "one")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


@pytest.mark.parametrize("first", ["scale", "state"])
def test_samples_are_counted_along_the_batch_dim_whatever_the_first_input(tmp_path: Path, first: str) -> None:
    rng = np.random.default_rng(1)
    batches = [{"scale": np.array(1.0, np.float32)} if first == "scale" else {"state": np.zeros((2, 4, 16), np.float32)} for _ in range(3)]
    for batch in batches:
        batch["x"] = rng.normal(size=(4, 16)).astype(np.float32)
    model = _two_input_model(tmp_path / "m.onnx", first)
    record = quantize_with_nncf(model, tmp_path / "m.int8.onnx", QuantizationSpec(quantizer="nncf"), get_target("x86-64-cpu"), batches)
    assert (record["batches"], record["samples"]) == (3, 12)  # 3 batches of 4 items along x's batch axis


def test_without_a_batch_dim_each_batch_is_one_sample(tmp_path: Path) -> None:
    model = onnx.load(str(_two_input_model(tmp_path / "m.onnx", "scale")))
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 4  # x static: [4, 16]
    batches = [{"scale": np.array(1.0, np.float32), "x": np.zeros((4, 16), np.float32)}] * 5
    assert count_samples(model, ["scale", "x"], batches) == 5
