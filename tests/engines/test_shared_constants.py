"""share_constants on graphs with duplicated constants: fewer bytes, the same results in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.engines.shared_constants import share_constants


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _weight(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(32, 32)).astype(np.float32)


def _folded_branches() -> onnx.ModelProto:
    """Two If branches, each with its own copy of the same folded weight (as ONNX Runtime writes them),
    and both named alike apart from the branch prefix."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("MatMul", ["x", f"{name}/w"], [f"{name}/mm"]), helper.make_node(op, [f"{name}/mm"], [f"{name}/y"])],
                                 name, [], [helper.make_tensor_value_info(f"{name}/y", TensorProto.FLOAT, [2, 32])],
                                 [numpy_helper.from_array(_weight(), f"{name}/w")])

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0), helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg"))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_branch_copies_become_one_main_graph_constant_with_the_same_results() -> None:
    model = _folded_branches()
    before = model.ByteSize()
    x = np.random.default_rng(1).normal(size=(2, 32)).astype(np.float32)
    expected = [_run(model, x), _run(model, -np.abs(x))]  # both branches taken
    shared = share_constants(model)
    onnx.checker.check_model(model, full_check=True)
    assert shared == {"initializers_shared": 1, "bytes_saved": numpy_helper.from_array(_weight(), "then/w").ByteSize()}
    assert model.ByteSize() < before - 32 * 32 * 4 * 0.9
    assert [t.name for t in model.graph.initializer if t.dims == [32, 32]] in (["then/w.shared"], ["else/w.shared"])
    for outcome, x_in in zip(expected, (x, -np.abs(x))):
        np.testing.assert_array_equal(_run(model, x_in)[0], outcome[0])


def test_main_graph_duplicates_are_merged_but_outputs_and_inputs_keep_their_names() -> None:
    weight = _weight()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]), helper.make_node("Add", ["a", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32]), helper.make_tensor_value_info("w2", TensorProto.FLOAT, [32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("w3", TensorProto.FLOAT, [32, 32])],
        [numpy_helper.from_array(weight, n) for n in ("w1", "w2", "w3", "w4")])
    graph.node.append(helper.make_node("MatMul", ["x", "w4"], ["c"]))
    graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).normal(size=(2, 32)).astype(np.float32)
    expected = _run(model, x)
    assert share_constants(model)["initializers_shared"] == 1  # w4 -> w1; w2 is an input, w3 an output
    assert sorted(t.name for t in model.graph.initializer) == ["w1", "w2", "w3"]
    assert [o.name for o in model.graph.output] == ["y", "w3", "c"]
    for got, want in zip(_run(model, x), expected):
        np.testing.assert_array_equal(got, want)


def test_a_constant_a_branch_returns_stays_in_its_branch() -> None:
    """ONNX Runtime folds ``Transpose(W)`` in each If branch into an initializer that is the branch's output. Hoisted
    and renamed, the branch would return an outer-scope value directly, which ONNX Runtime refuses to load
    ("Subgraph output ... is an outer scope value being returned directly"): such constants are not shared."""
    weight = _weight(3)

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([], name, [], [helper.make_tensor_value_info(f"{name}_wt", TensorProto.FLOAT, [32, 32])],
                                 [numpy_helper.from_array(weight.T.copy(), f"{name}_wt")])

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0), helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["wt"], then_branch=branch("then"), else_branch=branch("else")),
         helper.make_node("MatMul", ["x", "wt"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(4).normal(size=(2, 32)).astype(np.float32)
    expected = [_run(model, x)[0], _run(model, -np.abs(x))[0]]
    assert share_constants(model) == {"initializers_shared": 0, "bytes_saved": 0}
    onnx.checker.check_model(model, full_check=True)
    branches = {attribute.name: attribute.g for attribute in model.graph.node[2].attribute}
    assert {key: [t.name for t in g.initializer] for key, g in branches.items()} == {"then_branch": ["then_wt"], "else_branch": ["else_wt"]}
    assert {key: [o.name for o in g.output] for key, g in branches.items()} == {"then_branch": ["then_wt"], "else_branch": ["else_wt"]}
    for want, x_in in zip(expected, (x, -np.abs(x))):  # ONNX Runtime loads and runs it, both branches
        np.testing.assert_array_equal(_run(model, x_in)[0], want)
        np.testing.assert_allclose(want, x_in @ weight.T, rtol=1e-5, atol=1e-5)
