"""Static int8 on a graph whose If branch reads a Relu output from the outer scope (Silero VAD: the decoder's
If reads the last encoder ReLU by name). ONNX Runtime's quantizer folds that Relu into the Conv's QuantizeLinear
and renames only main-graph readers, so without edgekit's rewiring the branch read the Conv's output before
the Relu, and negative values reached everything after it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.static_qdq import rewire_subgraph_readers_of_folded
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def encoder_then_if(path: Path) -> Path:
    """x -> Conv1d -> Relu -> Conv1d -> Relu ("features") -> If(by_rate) whose branches read "features" from
    the outer scope (one through Squeeze/Unsqueeze, one through Identity) -> Sigmoid of a 1x1 Conv head."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name) for name, shape in
             [("w0", (16, 4, 3)), ("b0", (16,)), ("w1", (16, 16, 3)), ("b1", (16,)), ("head_w", (1, 16, 1)), ("head_b", (1,))]]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    then_branch = helper.make_graph([helper.make_node("Unsqueeze", ["features", "axes"], ["u"]), helper.make_node("Squeeze", ["u", "axes"], ["t_out"])],
                                    "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)], [axes])
    else_branch = helper.make_graph([helper.make_node("Identity", ["features"], ["e_out"])], "else", [],
                                    [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1]),
             helper.make_node("Relu", ["c1"], ["features"], name="relu1"),
             helper.make_node("Shape", ["features"], ["features_shape"], name="shape"),
             helper.make_node("If", ["by_rate"], ["decoded"], name="by_rate_if", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Conv", ["decoded", "head_w", "head_b"], ["logit"], name="head"),
             helper.make_node("Sigmoid", ["logit"], ["prob"], name="sigmoid")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 24]),
                                           helper.make_tensor_value_info("by_rate", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1, 24]),
                               helper.make_tensor_value_info("decoded", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("features_shape", TensorProto.INT64, [3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _batches(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (8, 4, 24)).astype(np.float32), "by_rate": np.array(bool(i % 2))} for i in range(count)]


def _run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_if_branch_reading_a_folded_relu_gets_the_relu_output(tmp_path):
    fp32 = encoder_then_if(tmp_path / "fp32.onnx")
    int8 = tmp_path / "int8.onnx"
    quantize_model(fp32, int8, QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                   _batches(4, seed=1), tmp_path, cache_dir=tmp_path / "cache")
    graph = onnx.load(str(int8)).graph
    assert "relu1" not in {n.name for n in graph.node}, "the quantizer folds relu1 into conv1's QuantizeLinear"
    branch_reads = {name for n in graph.node if n.op_type == "If" for a in n.attribute for b in a.g.node for name in b.input}
    assert "features" not in branch_reads, "a branch still reads conv1's output before the folded Relu"
    for feeds in _batches(2, seed=9):  # both branches
        want, got = _run(fp32, feeds), _run(int8, feeds)
        assert got["decoded"].min() >= 0.0, "negative values passed the Relu"
        assert _cosine(got["decoded"], want["decoded"]) > 0.99
        assert ((got["prob"] > 0.5) == (want["prob"] > 0.5)).mean() > 0.95


def test_branch_reading_a_folded_relu_without_dequantize_is_an_error(tmp_path):
    """A folded Relu whose value no DequantizeLinear gives back: the error names the branch node, the tensor
    and the exclusion that keeps it float."""
    model = onnx.load(str(encoder_then_if(tmp_path / "fp32.onnx")))
    graph = model.graph
    relu = next(n for n in graph.node if n.name == "relu1")
    graph.node.remove(relu)
    next(n for n in graph.node if n.name == "conv1").output[0] = "features"  # folded, as ONNX Runtime does, and no Q/DQ
    try:
        rewire_subgraph_readers_of_folded(model, {"features": "Relu"}, "fp32.onnx")
    except QuantizationError as exc:
        assert "fp32.onnx: subgraph node" in str(exc) and "'features'" in str(exc) and "Relu" in str(exc)
        assert "quantization.exclude_nodes" in exc.hint
    else:
        raise AssertionError("no error for a branch that reads a folded Relu with no DequantizeLinear")
