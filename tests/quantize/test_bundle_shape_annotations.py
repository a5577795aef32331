"""ONNX Runtime bundles are written without pre-processing's shape annotations (``graph.value_info`` from
symbolic shape inference): ONNX Runtime infers them again and runs faster without them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.graph_files import preprocess, quantized_ops
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target

from .test_static_with_dynamic_nodes import mobilenet_like


def mlp(path: Path) -> Path:
    """tokens [N, T, 16] -> MatMul -> Relu -> MatMul: every intermediate shape is symbolic."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 32)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (32, 8)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["tokens", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "T", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("precision", [Precision.INT8, Precision.INT8_DYNAMIC])
def test_int8_bundles_carry_no_shape_annotations(tmp_path, precision):
    rng = np.random.default_rng(4)
    if precision is Precision.INT8:
        fp32, batches = mobilenet_like(tmp_path / "fp32.onnx"), [{"image": rng.normal(0, 1, (4, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    else:
        fp32, batches = mlp(tmp_path / "fp32.onnx"), [{"tokens": rng.normal(0, 1, (2, 5, 16)).astype(np.float32)}]
    assert len(onnx.load(str(preprocess(fp32, tmp_path / "pre.onnx"))).graph.value_info)  # what the writers start from has them
    out = tmp_path / "model.onnx"
    quantize_model(fp32, out, QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, precision, batches, tmp_path,
                   cache_dir=tmp_path / "cache")
    written = onnx.load(str(out))
    assert len(written.graph.value_info) == 0
    assert quantized_ops(out)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, batches[0])[0]
    want = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, batches[0])[0]
    assert float(np.sum(got * want) / (np.linalg.norm(got) * np.linalg.norm(want))) > 0.98
