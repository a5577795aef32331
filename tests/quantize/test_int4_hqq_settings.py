"""int4.method hqq: refused with symmetric: true at recipe validation (HQQ always writes a zero point per block, so the
manifest must not record symmetric), recorded as symmetric: false when symmetric is not written, and refused with a
QuantizationError, not a raw AssertionError from ONNX Runtime, on the TensorRT backend (hqq writes MatMulNBits)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import QuantizationError, RecipeError
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.int4 import write_int4
from edgekit.quantize.plan import make_plan
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import Int4Spec, QuantizationSpec, load_recipe
from edgekit.target import get_target
from tests.conftest import TINY_RECIPE


def _recipe_with_int4(tiny_recipe, int4: str):
    return tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net") + f"  quantization:\n    int4: {int4}\n")


def test_recipe_refuses_hqq_with_symmetric_true(tiny_recipe):
    path = _recipe_with_int4(tiny_recipe, "{method: hqq, symmetric: true}")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "int4.method hqq is always asymmetric" in message
    assert "symmetric: true cannot hold" in message
    assert "use int4.method: rtn for symmetric int4" in message
    assert str(path) in message


def test_recipe_hqq_without_symmetric_records_asymmetric(tiny_recipe):
    recipe = load_recipe(_recipe_with_int4(tiny_recipe, "{method: hqq}"))
    assert recipe.build.quantization.int4.symmetric is False
    plan = make_plan(recipe.build.quantization, get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT4)
    assert plan.to_manifest()["int4"]["symmetric"] is False
    assert Int4Spec().symmetric is True and Int4Spec(method="rtn", symmetric=False).symmetric is False  # rtn unchanged
    assert Int4Spec(method="hqq", symmetric=False).symmetric is False


def _matmul(path):
    rng = np.random.default_rng(0)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_hqq_on_tensorrt_is_a_quantization_error_naming_the_fix(tmp_path):
    src = _matmul(tmp_path / "fp32.onnx")
    spec = QuantizationSpec(int4=Int4Spec(method="hqq"))
    plan = make_plan(spec, get_target("nvidia-h100"), Backend.TENSORRT, Precision.INT4)
    with pytest.raises(QuantizationError) as info:
        write_int4(src, tmp_path / "int4.onnx", plan)
    assert "hqq writes MatMulNBits, ONNX Runtime only" in str(info.value)
    assert "use int4.method: rtn for TensorRT" in str(info.value)
    with pytest.raises(QuantizationError, match="hqq writes MatMulNBits, ONNX Runtime only"):
        quantize_model(src, tmp_path / "int4.onnx", spec, get_target("nvidia-h100"), Backend.TENSORRT, Precision.INT4, None, tmp_path)
    assert not (tmp_path / "int4.onnx").exists()


def test_hqq_plan_claiming_symmetric_is_refused_by_the_writer(tmp_path):
    src = _matmul(tmp_path / "fp32.onnx")
    plan = make_plan(QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT4)
    plan = plan.__class__(**{**plan.__dict__, "int4": {**plan.int4, "method": "hqq", "symmetric": True}})
    with pytest.raises(QuantizationError, match="int4.method hqq is always asymmetric"):
        write_int4(src, tmp_path / "int4.onnx", plan)


def test_hqq_on_onnxruntime_still_writes_matmulnbits(tmp_path):
    src = _matmul(tmp_path / "fp32.onnx")
    plan = make_plan(QuantizationSpec(int4=Int4Spec(method="hqq")), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT4)
    out = write_int4(src, tmp_path / "int4.onnx", plan)
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["MatMulNBits"]
