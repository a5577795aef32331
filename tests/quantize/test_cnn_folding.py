"""The exact float rewrites static int8 applies to CNNs before quantization (edgekit.quantize.cnn_folding),
checked on graphs shaped like Paddle2ONNX's PP-OCR export: same outputs under ONNX Runtime, fewer ops."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.quantize.cnn_folding import fold_for_int8


def _const(inits: list, name: str, value: object) -> str:
    inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
    return name


def ppocr_block(path: Path, *, pad_second: bool) -> Path:
    """conv1 -> Mul(scalar) -> Add(scalar) -> HardSwish expansion (Add 3, Clip 0..6, Mul, Div 6)
    -> Mul(scalar) -> Add(scalar) -> conv2 (1x1, padded or not)."""
    rng = np.random.default_rng(0)
    inits: list = []
    w1 = _const(inits, "w1", rng.normal(0, 0.3, (8, 4, 3, 3)))
    b1 = _const(inits, "b1", rng.normal(0, 0.1, 8))
    w2 = _const(inits, "w2", rng.normal(0, 0.3, (6, 8, 1, 1)))
    b2 = _const(inits, "b2", rng.normal(0, 0.1, 6))
    nodes = [
        helper.make_node("Conv", ["x", w1, b1], ["c1"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Mul", ["c1", _const(inits, "lab_scale", [1.7])], ["s1"], name="lab_mul"),
        helper.make_node("Add", ["s1", _const(inits, "lab_bias", [0.2])], ["a1"], name="lab_add"),
        helper.make_node("Add", ["a1", _const(inits, "three", 3.0)], ["h1"], name="hs_add"),
        helper.make_node("Clip", ["h1", _const(inits, "zero", 0.0), _const(inits, "six", 6.0)], ["h2"], name="hs_clip"),
        helper.make_node("Mul", ["a1", "h2"], ["h3"], name="hs_mul"),
        helper.make_node("Div", ["h3", "six"], ["hs"], name="hs_div"),
        helper.make_node("Mul", ["hs", _const(inits, "lab2_scale", [0.8])], ["s2"], name="lab2_mul"),
        helper.make_node("Add", ["s2", _const(inits, "lab2_bias", [-0.1])], ["a2"], name="lab2_add"),
        helper.make_node("Conv", ["a2", w2, b2], ["y"], name="conv2", kernel_shape=[1, 1], pads=[1, 1, 1, 1] if pad_second else [0, 0, 0, 0]),
    ]
    out_hw = 12 if pad_second else 10
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, out_hw, out_hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_folds_affine_pairs_and_hardswish_exactly(tmp_path):
    fp32 = ppocr_block(tmp_path / "fp32.onnx", pad_second=False)
    folded, counts = fold_for_int8(fp32, tmp_path / "folded.onnx")
    assert (counts.conv_affine, counts.hardswish, counts.affine_into_conv) == (2, 1, 1)
    assert "1 HardSwish expansions as x * HardSigmoid(x)" in counts.note()
    ops = collections.Counter(n.op_type for n in onnx.load(str(folded)).graph.node)
    assert ops == {"Conv": 2, "HardSigmoid": 1, "Mul": 1}, ops
    x = np.random.default_rng(1).normal(0, 2, (3, 4, 10, 10)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(fp32, x), rtol=1e-4, atol=1e-4)


def test_padded_conv_keeps_the_affine_pair_in_front(tmp_path):
    """Folding d into a padded Conv's bias would add d on the zero border too: that pair stays."""
    fp32 = ppocr_block(tmp_path / "fp32.onnx", pad_second=True)
    folded, counts = fold_for_int8(fp32, tmp_path / "folded.onnx")
    assert counts.affine_into_conv == 0 and counts.conv_affine == 2 and counts.hardswish == 1
    ops = collections.Counter(n.op_type for n in onnx.load(str(folded)).graph.node)
    assert ops["Mul"] == 2 and ops["Add"] == 1, ops
    x = np.random.default_rng(2).normal(0, 2, (2, 4, 10, 10)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(fp32, x), rtol=1e-4, atol=1e-4)


def test_a_graph_without_the_patterns_is_not_rewritten(tmp_path):
    from tests.quantize.ort.test_layout import cnn

    fp32 = cnn(tmp_path / "fp32.onnx", 3)
    folded, counts = fold_for_int8(fp32, tmp_path / "folded.onnx")
    assert folded == fp32 and counts.note() is None and not (tmp_path / "folded.onnx").exists()


def test_a_constant_that_would_change_the_rank_is_not_folded(tmp_path):
    """Conv1d [N, 4, 10] times a [1, 1, 1, 1] constant broadcasts to rank 4: folding it would change the shape."""
    inits: list = []
    w = _const(inits, "w", np.ones((4, 4, 3), np.float32))
    nodes = [helper.make_node("Conv", ["x", w], ["c"], name="conv", pads=[1, 1], kernel_shape=[3]),
             helper.make_node("Mul", ["c", _const(inits, "k", np.full((1, 1, 1, 1), 2.0))], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "N", 4, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    folded, counts = fold_for_int8(tmp_path / "fp32.onnx", tmp_path / "folded.onnx")
    assert counts.conv_affine == 0 and folded == tmp_path / "fp32.onnx"
