"""int4 is weight-only on MatMul/Gemm: a build that leaves most weights float (a CNN) says so in its plan's notes, its
warnings and the build log, as int8-dynamic does; a MatMul-dominated model gets no such note."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def _cnn(path, conv_out: int):
    """Conv (conv_out x 16 x 3 x 3) -> GlobalAveragePool -> Flatten -> Gemm (10 x conv_out)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "Wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "Wg"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(rng.normal(size=(conv_out, 16, 3, 3)).astype(np.float32), "Wc"),
                               numpy_helper.from_array(rng.normal(size=(10, conv_out)).astype(np.float32), "Wg")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _matmuls(path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"), helper.make_node("MatMul", ["h", "W2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), n) for n in ("W1", "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _int4(src, tmp_path):
    return quantize_model(src, tmp_path / "int4.onnx", QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                          Precision.INT4, None, tmp_path)


def test_int4_on_a_cnn_notes_and_warns_that_most_weights_stay_float(tmp_path, caplog):
    src = _cnn(tmp_path / "cnn.onnx", conv_out=64)  # Conv 9216 weights, Gemm 640: int4 covers 6.5 %
    with caplog.at_level(logging.WARNING, logger="edgekit.quantize.stage"):
        out = _int4(src, tmp_path)
    assert out.plan is not None and out.plan.precision is Precision.INT4
    note = next((n for n in out.plan.notes if n.startswith("int4 quantized")), None)
    assert note is not None, out.plan.notes
    assert "only 6.5% of the weights" in note
    assert "1 Conv node(s) hold the rest and stay float" in note
    assert "for a convolutional model use int8 (static, calibrated)" in note
    assert out.to_manifest()["warnings"] == [note]
    assert note in out.to_manifest()["plan"]["notes"]
    assert any(note in record.getMessage() for record in caplog.records)
    assert any(n.op_type == "MatMulNBits" for n in onnx.load(str(out.path)).graph.node)


def test_int4_on_matmul_weights_has_no_coverage_note(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="edgekit.quantize.stage"):
        out = _int4(_matmuls(tmp_path / "mm.onnx"), tmp_path)
    assert out.plan is not None
    assert not any(n.startswith("int4 quantized") for n in out.plan.notes)
    assert "warnings" not in out.to_manifest()
    assert not any("of the weights" in record.getMessage() for record in caplog.records)
