"""Loop / Scan bodies: their work is counted per iteration counted, and a while loop's "no limit" is not a trip count
(review: a torch-style while Loop, M = INT64_MAX, was estimated at ~700,000 years; a body's work was never counted)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate.graph_cost import graph_costs
from edgekit.estimate.hardware import hardware_for
from edgekit.estimate.tensorrt_layers import layer_work, tf32_peak
from edgekit.target import get_target

OPSET = [helper.make_opsetid("", 17)]
N = 32


def _value(name: str, dtype: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _matmul_loop(trips: int, cond: str = "") -> onnx.ModelProto:
    """x[N,N] -> Loop (M = ``trips``, condition ``cond`` or none) whose body multiplies by the outer weight W[N,N]."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_in", "W"], ["x_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [_value("i", TensorProto.INT64, []), _value("cond_in", TensorProto.BOOL, []), _value("x_in", TensorProto.FLOAT, None)],
        [_value("cond_out", TensorProto.BOOL, []), _value("x_out", TensorProto.FLOAT, None)])  # fmt: skip
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "M"), numpy_helper.from_array(np.eye(N, dtype=np.float32), "W"),
             numpy_helper.from_array(np.array(True), "keep")]  # fmt: skip
    loop = helper.make_node("Loop", ["M", cond, "x"], ["y"], body=body, name="loop")
    graph = helper.make_graph([loop], "g", [_value("x", TensorProto.FLOAT, [N, N])], [_value("y", TensorProto.FLOAT, [N, N])], inits)
    return helper.make_model(graph, opset_imports=OPSET)


def test_a_loop_body_s_work_is_counted_per_iteration() -> None:
    cost = graph_costs(_matmul_loop(100))
    (loop,) = cost.nodes
    assert loop.ops == 100 * 2 * N**3
    assert (loop.op_class, loop.kind, loop.precision) == ("matmul", "matmul", "fp32")
    per_iteration = (N * N * 4) * 3  # reads x_in and W, writes x_out (the condition's Identity is a view: none)
    assert loop.body_bytes == 100 * per_iteration
    assert loop.subgraph_calls == 100 and loop.body_node_calls == 200
    assert (f"Loop 'loop': its body's work ({2 * N**3:,} ops, {per_iteration:,} bytes an iteration) is counted x 100 "
            "iteration(s), as one matmul node") in cost.assumptions  # fmt: skip
    assert "1 Loop/Scan node(s): each body node's dispatch and one subgraph call are counted per iteration" in cost.assumptions


def test_a_while_loop_s_huge_trip_count_is_unknown_and_one_iteration_counted() -> None:
    cost = graph_costs(_matmul_loop(np.iinfo(np.int64).max, cond="keep"))
    (loop,) = cost.nodes
    assert loop.subgraph_calls == 1 and loop.body_node_calls == 2 and loop.ops == 2 * N**3
    assert ("Loop 'loop' runs while its condition holds (trip count 2,147,483,648 or more): iterations unknown, one counted"
            in cost.assumptions)  # fmt: skip
    assert any("(1 without a known trip count: one iteration counted)" in a for a in cost.assumptions)


def test_a_large_trip_count_without_a_condition_is_taken_as_given() -> None:
    (loop,) = graph_costs(_matmul_loop(2**31)).nodes
    assert loop.subgraph_calls == 2**31


def test_a_scan_body_is_costed_at_the_shape_of_one_slice() -> None:
    body = helper.make_graph([helper.make_node("MatMul", ["row", "W"], ["out"])], "body",
                             [_value("row", TensorProto.FLOAT, None)], [_value("out", TensorProto.FLOAT, None)])  # fmt: skip
    scan = helper.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1, name="scan")
    weight = numpy_helper.from_array(np.zeros((8, 16), np.float32), "W")
    graph = helper.make_graph([scan], "g", [_value("x", TensorProto.FLOAT, [5, 4, 8])], [_value("y", TensorProto.FLOAT, None)], [weight])
    cost = graph_costs(helper.make_model(graph, opset_imports=OPSET))
    (node,) = cost.nodes
    assert node.ops == 5 * 2 * 4 * 8 * 16  # one slice [4, 8] x [8, 16], five times: the scan axis holds 5 (was 1 counted)
    assert node.subgraph_calls == 5 and node.op_class == "matmul"
    assert not any("without a known trip count" in a for a in cost.assumptions)


def test_a_scan_along_another_axis_counts_that_axis_length() -> None:
    body = helper.make_graph([helper.make_node("MatMul", ["row", "W"], ["out"])], "body",
                             [_value("row", TensorProto.FLOAT, None)], [_value("out", TensorProto.FLOAT, None)])  # fmt: skip
    scan = helper.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1, scan_input_axes=[1], name="scan")
    weight = numpy_helper.from_array(np.zeros((5, 16), np.float32), "W")
    graph = helper.make_graph([scan], "g", [_value("x", TensorProto.FLOAT, [4, 7, 5])], [_value("y", TensorProto.FLOAT, None)], [weight])
    (node,) = graph_costs(helper.make_model(graph, opset_imports=OPSET)).nodes
    assert node.subgraph_calls == 7 and node.ops == 7 * 2 * 4 * 5 * 16  # scan axis 1: seven slices [4, 5]


def test_tensorrt_runs_a_loop_as_a_layer_carrying_its_body_s_work() -> None:
    hardware = hardware_for(get_target("jetson-orin-nano-8gb"))
    (layer,) = layer_work(graph_costs(_matmul_loop(10)), hardware)
    assert (layer.name, layer.op_class, layer.precision) == ("loop", "matmul", "tf32")
    assert layer.compute_s == pytest.approx(10 * 2 * N**3 / tf32_peak(hardware))
