from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate.graph_cost import ALL_CLASSES, ELEMENTWISE, OP_CLASSES, EstimateError, graph_costs, op_class
from tests.estimate.graphs import cnn, mlp, qdq_matmul


def test_cnn_counts_match_hand_counts() -> None:
    cost = graph_costs(cnn(16), {"batch": 4})
    nodes = {n.name: n for n in cost.nodes}
    # Conv: 2 x N x C_out x H x W x C_in x k x k
    assert nodes["conv"].ops == 2 * 4 * 16 * 8 * 8 * 3 * 3 * 3
    assert nodes["conv"].bytes_read == (4 * 3 * 64 + 16 * 27) * 4 and nodes["conv"].bytes_written == 4 * 16 * 64 * 4
    assert nodes["relu"].fused and nodes["relu"].ops == 0 and nodes["relu"].op_class == ELEMENTWISE  # fused into the conv
    assert nodes["fc"].ops == 2 * 4 * 1024 * 10 and nodes["fc"].op_class == "matmul"
    assert nodes["flat"].fused and nodes["flat"].bytes == 0  # a Reshape moves no data
    assert cost.weight_bytes == (16 * 27 + 1024 * 10) * 4 + 2 * 8
    assert cost.dims == {"batch": 4} and cost.assumptions == ()
    assert all(n.precision == "fp32" for n in cost.nodes)
    # peak activations: the conv output and its relu alive together (conv input freed after the conv)
    assert cost.peak_activation_bytes == 2 * 4 * 16 * 64 * 4


def test_work_scales_with_the_benchmark_batch() -> None:
    one, eight = graph_costs(cnn(), {"batch": 1}), graph_costs(cnn(), {"batch": 8})
    assert eight.total_ops == pytest.approx(8 * one.total_ops)


def test_a_dim_not_given_is_taken_as_one_and_said() -> None:
    cost = graph_costs(cnn(), {})
    assert cost.dims == {} and any("('batch') not given: taken as 1" in a for a in cost.assumptions)


def test_qdq_pattern_counts_at_int8_and_fuses_its_qdq_nodes() -> None:
    cost = graph_costs(qdq_matmul())
    nodes = {n.name: n for n in cost.nodes}
    assert nodes["mm"].precision == "int8" and nodes["mm"].ops == 2 * 8 * 64 * 32
    assert all(nodes[n].fused and nodes[n].bytes == 0 for n in ("q", "dq", "dq_w"))
    assert cost.by_class()["quantize"]["nodes"] == 0


def test_matmul_nbits_counts_its_packed_weights_at_four_bits() -> None:
    k, n, block = 64, 32, 32
    packed = numpy_helper.from_array(np.zeros((n, k // block, block // 2), np.uint8), "wq")
    scales = numpy_helper.from_array(np.ones((n * k // block,), np.float32), "sc")
    node = helper.make_node("MatMulNBits", ["x", "wq", "sc"], ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block, name="mm4")
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, n])], [packed, scales])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    (mm,) = graph_costs(model).nodes
    assert mm.ops == 2 * 8 * k * n
    assert mm.weight_bytes == k * n / 2 + (n * k // block) * 4  # 4-bit weights: half a byte each, plus scales


def test_softmax_is_normalisation_and_every_class_has_ops() -> None:
    cost = graph_costs(mlp(32), {"batch": 2})
    nodes = {n.name: n for n in cost.nodes}
    assert nodes["add0"].fused and nodes["relu0"].fused  # bias add then activation: the MatMul's epilogue
    classes = cost.by_class()
    assert classes["normalization"]["nodes"] == 1 and classes["normalization"]["ops"] == 5 * 2 * 32
    assert set(classes) <= set(ALL_CLASSES)


@pytest.mark.parametrize("cls", list(OP_CLASSES))
def test_every_op_class_is_reachable(cls: str) -> None:
    assert all(op_class(op) == cls for op in OP_CLASSES[cls])
    assert op_class("Add") == ELEMENTWISE


def test_a_file_that_is_not_a_model_is_an_estimate_error(tmp_path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a protobuf at all \xff\xfe")
    with pytest.raises(EstimateError, match="not a readable ONNX model"):
        graph_costs(bad)
    with pytest.raises(EstimateError, match="no ONNX model at"):
        graph_costs(tmp_path / "missing.onnx")


def test_shapes_unknown_to_onnx_inference_come_from_an_onnxruntime_probe(tmp_path) -> None:
    # NonZero's output length depends on the data: ONNX shape inference cannot know it; a run can.
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Relu", ["nzf"], ["y"], name="relu")]  # fmt: skip
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    path = tmp_path / "probe.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    cost = graph_costs(path)
    assert cost.shape_source == "onnxruntime probe"
    assert {n.name: n for n in cost.nodes}["relu"].bytes_written == 0  # zero input: no non-zero elements


def test_nodes_computed_from_constants_only_are_folded() -> None:
    a = numpy_helper.from_array(np.ones((64, 64), np.float32), "a")
    nodes = [helper.make_node("Sin", ["a"], ["s"], name="const_sin"),  # constant subgraph: folded at load time
             helper.make_node("Mul", ["x", "s"], ["y"], name="mul")]  # fmt: skip
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [a])  # fmt: skip
    cost = {n.name: n for n in graph_costs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).nodes}
    assert cost["const_sin"].fused and cost["const_sin"].ops == 0
    assert cost["mul"].ops == 64 * 64 and cost["mul"].weight_bytes == 64 * 64 * 4  # the folded result is read like a weight


def test_an_activation_whose_input_has_other_readers_is_not_fused() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Add", ["m", "r"], ["y"], name="residual")]  # fmt: skip
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    graph = helper.make_graph(nodes, "branch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])  # fmt: skip
    cost = {n.name: n for n in graph_costs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).nodes}
    assert not cost["relu"].fused and cost["relu"].ops == 64 and not cost["residual"].fused


def test_integer_matmul_counts_at_int8_with_one_byte_weights() -> None:
    w = numpy_helper.from_array(np.ones((64, 32), np.int8), "w")
    node = helper.make_node("MatMulInteger", ["x", "w"], ["y"], name="mmi")
    graph = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("x", TensorProto.UINT8, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [8, 32])], [w])  # fmt: skip
    (mm,) = graph_costs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).nodes
    assert mm.precision == "int8" and mm.ops == 2 * 8 * 64 * 32
    assert mm.weight_bytes == 64 * 32 and mm.bytes_read == 64 * 32 + 8 * 64 and mm.bytes_written == 8 * 32 * 4


def test_a_qdq_pattern_with_fp8_weights_counts_at_fp8() -> None:
    model = qdq_matmul()
    for init in model.graph.initializer:
        if init.name == "w_q":
            init.CopyFrom(helper.make_tensor("w_q", TensorProto.FLOAT8E4M3FN, [64, 32], [0] * (64 * 32), raw=False))
        if init.name == "z":
            init.CopyFrom(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0]))
    nodes = {n.name: n for n in graph_costs(model).nodes}
    assert nodes["mm"].precision == "fp8"


def test_ops_of_a_custom_domain_are_costed_as_elementwise_and_said_to_be_unknown() -> None:
    """A graph from elsewhere with a custom-domain op: costed (1 op an element), and the assumptions say which op and
    that its cost is unknown; ONNX's own ops and ONNX Runtime's contrib ops (com.microsoft) are not listed."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Gelu", ["a"], ["b"], domain="com.microsoft"),
             helper.make_node("Frobnicate", ["b"], ["c"], domain="acme.ops"), helper.make_node("Frobnicate", ["c"], ["y"], domain="acme.ops")]
    model = helper.make_model(helper.make_graph(nodes, "custom", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("acme.ops", 1)])  # fmt: skip
    cost = graph_costs(model)
    assert [n.op_class for n in cost.nodes] == [ELEMENTWISE] * 4
    (note,) = [a for a in cost.assumptions if "neither ONNX nor ONNX Runtime" in a]
    assert note.startswith("2 node(s) of ops neither ONNX nor ONNX Runtime defines (acme.ops::Frobnicate x2) costed as elementwise")
    assert "Relu" not in note and "Gelu" not in note
    assert not any("neither ONNX" in a for a in graph_costs(cnn()).assumptions)
