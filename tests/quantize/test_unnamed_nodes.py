"""Nameless nodes get names in int8 pre-processing, so plans can keep, exclude and check them by name
(PP-PicoDet's appended DFL MatMul had none, and auto's int8 build failed on a node named '')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.quantize.ort.graph_files import name_unnamed_nodes, preprocess, quantizable_nodes


def _model_with_nameless_nodes(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    bins = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(8, 1), "bins")
    shape = numpy_helper.from_array(np.array([1, 4, 8, 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),  # nameless
        helper.make_node("Relu", ["c"], ["r"], name="Relu_unnamed_0"),  # a name the generator must step over
        helper.make_node("Reshape", ["r", "shape"], ["r4"]),
        helper.make_node("Softmax", ["r4"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "bins"], ["y"]),  # nameless, like PicoDet's appended decoding
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 1])], [weights, bins, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_preprocess_names_every_node_uniquely_and_keeps_given_names(tmp_path: Path) -> None:
    source = _model_with_nameless_nodes(tmp_path / "m.onnx")
    out = preprocess(source, tmp_path / "pre.onnx")
    nodes = onnx.load(str(out)).graph.node
    names = [node.name for node in nodes]
    assert all(names), names
    assert len(set(names)) == len(names)
    assert "Relu_unnamed_0" in names
    assert any(node.op_type == "MatMul" and node.name.startswith("MatMul_unnamed_") for node in nodes)
    # The named MatMul can now be listed, kept float and checked by name.
    assert quantizable_nodes(out, ("Conv", "MatMul")) == [n.name for n in nodes if n.op_type in ("Conv", "MatMul")]


def test_naming_is_a_no_op_on_a_fully_named_model(tmp_path: Path) -> None:
    source = _model_with_nameless_nodes(tmp_path / "m.onnx")
    out = preprocess(source, tmp_path / "pre.onnx")
    before = out.read_bytes()
    assert name_unnamed_nodes(out) == 0
    assert out.read_bytes() == before
