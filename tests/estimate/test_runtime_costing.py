"""Costing rules of a host that runs the model itself: the If branch taken, the graph ONNX Runtime optimised
(its fusions instead of guessed ones), the kernel kind of each node and its micro-benchmarked efficiency."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate import graph_costs
from edgekit.estimate.graph_cost import EstimateError, node_kind
from edgekit.estimate.hardware import Hardware
from edgekit.estimate.host_kernels import efficiency_at, subgraph_costs_us
from edgekit.estimate.roofline import apply_factors, host_factors, roofline
from edgekit.estimate.runtime_graph import runtime_graph_costs
from tests.estimate.graphs import cnn

OPSET = [helper.make_opsetid("", 17)]


def _branch(name: str, matmuls: int) -> onnx.GraphProto:
    """x[4,64] -> MatMul x ``matmuls`` (or one Neg when 0) -> the branch's output."""
    nodes, current = [], "x"
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [current, "w"], [f"{name}{i}"], name=f"{name}_mm{i}"))
        current = f"{name}{i}"
    if not matmuls:
        nodes.append(helper.make_node("Neg", ["x"], [f"{name}0"], name=f"{name}_neg"))
        current = f"{name}0"
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(current, TensorProto.FLOAT, [4, 64])])


def if_model(condition: onnx.NodeProto | None = None) -> onnx.ModelProto:
    """flag -> If(then: 3 MatMuls 4x64x64, else: one Neg) -> Relu; ``condition`` replaces the flag's source."""
    weight = numpy_helper.from_array(np.full((64, 64), 0.01, np.float32), "w")
    nodes = [condition] if condition is not None else []
    cond = condition.output[0] if condition is not None else "flag"
    nodes += [helper.make_node("If", [cond], ["b"], then_branch=_branch("then", 3), else_branch=_branch("else", 0), name="choose"),
              helper.make_node("Relu", ["b"], ["y"], name="relu")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "if", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], [weight])
    return helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("custom.example", 1)])


def test_an_if_counts_the_nodes_of_the_branch_its_inputs_take() -> None:
    taken = graph_costs(if_model(), input_values={"x": np.ones((4, 64), np.float32), "flag": np.array(True)})
    names = {n.name for n in taken.nodes}
    assert {"then_mm0", "then_mm1", "then_mm2"} <= names and "else_neg" not in names
    assert taken.total_ops == pytest.approx(3 * 2 * 4 * 64 * 64)  # the MatMuls (the Relu after the last is its epilogue)
    (call,) = [n for n in taken.nodes if n.subgraph_calls]
    assert call.op_type == "If" and call.ops == 0 and call.bytes == 0
    assert any("condition read at the benchmark inputs" in a for a in taken.assumptions)
    other = graph_costs(if_model(), input_values={"x": np.ones((4, 64), np.float32), "flag": np.array(False)})
    assert "else_neg" in {n.name for n in other.nodes} and other.total_ops < 10 * 4 * 64


def test_an_if_whose_condition_cannot_be_read_counts_the_larger_branch() -> None:
    unknown = helper.make_node("NotAnOp", ["x"], ["cond"], domain="custom.example", name="opaque")  # ONNX Runtime cannot run it
    cost = graph_costs(if_model(unknown))
    assert {"then_mm0", "then_mm1", "then_mm2"} <= {n.name for n in cost.nodes}
    assert any("larger branch" in a for a in cost.assumptions)


def test_nested_ifs_are_resolved_level_by_level() -> None:
    inner = helper.make_node("If", ["flag"], ["inner"], then_branch=_branch("deep", 2), else_branch=_branch("shallow", 0), name="inner_if")
    outer_then = helper.make_graph([inner], "outer_then", [], [helper.make_tensor_value_info("inner", TensorProto.FLOAT, [4, 64])])
    model = if_model()
    next(a for a in model.graph.node[0].attribute if a.name == "then_branch").g.CopyFrom(outer_then)  # the inner If
    cost = graph_costs(model, input_values={"x": np.ones((4, 64), np.float32), "flag": np.array(True)})
    assert {"deep_mm0", "deep_mm1"} <= {n.name for n in cost.nodes}
    assert sum(n.subgraph_calls for n in cost.nodes) == 2


def test_each_if_adds_the_measured_subgraph_invocation_to_the_estimate() -> None:
    cost = graph_costs(if_model(), input_values={"x": np.ones((4, 64), np.float32), "flag": np.array(True)})
    plain = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0)
    with_if = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0, subgraph_overhead_us=25.0)
    base = apply_factors(roofline(cost, plain), host_factors(plain))[1]
    line = roofline(cost, with_if)
    assert line.fixed_ms == pytest.approx(0.025)
    assert apply_factors(line, host_factors(with_if))[1] == pytest.approx(base + 0.025)
    call, inside = subgraph_costs_us(1, runs=5)
    assert all(math.isfinite(v) and 0 <= v < 10_000 for v in (call, inside))


def test_nodes_run_inside_a_taken_branch_pay_the_measured_per_node_premium() -> None:
    cost = graph_costs(if_model(), input_values={"x": np.ones((4, 64), np.float32), "flag": np.array(True)})
    inside = {n.name for n in cost.nodes if n.in_subgraph}
    assert {"then_mm0", "then_mm1", "then_mm2"} <= inside and "relu" not in inside
    run = [n for n in cost.nodes if n.in_subgraph and not n.fused]
    host = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0, subgraph_overhead_us=25.0, subgraph_node_us=2.0)
    line = roofline(cost, host)
    assert line.fixed_ms == pytest.approx((25.0 + 2.0 * len(run)) / 1e3)
    # every node ONNX Runtime runs, the branch's included, also pays the top-level dispatch (the factors' overhead)
    factors = host_factors(host)
    timed, total = apply_factors(line, factors)
    work = sum(n.roofline_ms / factors.efficiency.get(n.op_class, 1.0) for n in timed)
    assert total == pytest.approx(work + len(timed) * 1e-3 + line.fixed_ms)


def _loop_model(trips: int | None) -> onnx.ModelProto:
    """x[4,64] -> Loop (M = ``trips`` as a constant, or a graph input) whose body runs Neg, Relu, Neg on the carried value."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Neg", ["v_in"], ["a"]),
         helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Neg", ["b"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4, 64])])  # fmt: skip
    inits = [numpy_helper.from_array(np.array(True), "keep")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])]
    if trips is None:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trips, np.int64), "m"))
    loop = helper.make_node("Loop", ["m", "keep", "x"], ["y"], body=body, name="loop")
    graph = helper.make_graph([loop], "loop", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], inits)
    return helper.make_model(graph, opset_imports=OPSET)


def test_a_loop_body_pays_a_dispatch_per_node_and_an_invocation_per_iteration() -> None:
    (loop,) = [n for n in graph_costs(_loop_model(5)).nodes if n.op_type == "Loop"]
    assert loop.subgraph_calls == 5 and loop.body_node_calls == 5 * 4
    host = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0, subgraph_overhead_us=3.0, subgraph_node_us=0.5)
    (timed,) = [n for n in roofline(graph_costs(_loop_model(5)), host).nodes if n.op_type == "Loop"]
    assert timed.fixed_ms == pytest.approx((5 * 3.0 + 20 * (1.0 + 0.5)) / 1e3)
    unknown = graph_costs(_loop_model(None), input_values={"x": np.ones((4, 64), np.float32), "m": np.array(7)})
    (loop,) = [n for n in unknown.nodes if n.op_type == "Loop"]
    assert loop.subgraph_calls == 1 and loop.body_node_calls == 4  # a trip count that is not a constant counts once, said
    assert any("without a known trip count" in a for a in unknown.assumptions)


def test_the_graph_onnx_runtime_runs_is_costed_with_its_fusions(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(16), str(path))
    exported = graph_costs(path, {"batch": 4})
    ran = runtime_graph_costs(path, 1, dims={"batch": 4})
    assert "Relu" not in {n.op_type for n in ran.nodes}  # ONNX Runtime fused it into the convolution
    assert any("graph ONNX Runtime runs here" in a for a in ran.assumptions)
    conv_ops = sum(n.ops for n in ran.nodes if n.op_class == "conv")
    assert conv_ops == pytest.approx(sum(n.ops for n in exported.nodes if n.op_class == "conv"))
    # runtime fusion trusts the graph: the exported Relu is a node of its own there, a Reshape moves no bytes but runs
    literal = {n.name: n for n in graph_costs(path, {"batch": 4}, fusion="runtime").nodes}
    assert not literal["relu"].fused and literal["relu"].bytes > 0
    assert not literal["flat"].fused and literal["flat"].bytes == 0
    with pytest.raises(EstimateError, match="fusion 'guess' is not one of implicit, runtime"):
        graph_costs(path, fusion="guess")


def _conv(c_in: int, c_out: int, kernel: list[int], group: int = 1) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.zeros((c_out, c_in // group, *kernel), np.float32), "w")
    spatial = [8] * len(kernel)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, name="conv")
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, *spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])  # fmt: skip
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.mark.parametrize(("model", "kind"), [
    (_conv(32, 32, [3, 3]), "conv-dense"), (_conv(32, 64, [1, 1]), "conv-pointwise"), (_conv(32, 32, [3, 3], group=32), "conv-depthwise"),
    (_conv(3, 32, [3, 3]), "conv-stem"), (_conv(32, 32, [3]), "conv-1d-short"), (_conv(32, 32, [3, 3], group=4), "conv-other"),
])  # fmt: skip
def test_each_convolution_gets_the_kind_of_kernel_that_runs_it(model: onnx.ModelProto, kind: str) -> None:
    (node,) = graph_costs(model).nodes
    assert node_kind(node) == kind


def test_elementwise_kinds_and_measured_efficiency_by_size() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256])
    nodes = [helper.make_node("Tanh", ["x"], ["t"], name="tanh"), helper.make_node("Add", ["t", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "ew", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])])
    kinds = {n.name: node_kind(n) for n in graph_costs(helper.make_model(graph, opset_imports=OPSET)).nodes}
    assert kinds == {"tanh": "elementwise-transcendental", "add": "elementwise-simple"}
    points = [[1e-6, 0.2], [1e-4, 0.8]]
    assert efficiency_at(points, 1e-7) == 0.2 and efficiency_at(points, 1e-3) == 0.8  # clamped to the measured range
    assert efficiency_at(points, 1e-5) == pytest.approx(0.5)  # log-linear between the points


def test_a_micro_benchmarked_kind_divides_the_roofline_by_its_measured_efficiency() -> None:
    cost = graph_costs(_conv(32, 32, [3, 3]))
    plain = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0)
    (base,) = roofline(cost, plain).nodes
    measured = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0,
                        kernel_efficiency={"conv-dense": [[base.roofline_ms / 1e3, 0.25]]})  # fmt: skip
    (node,) = roofline(cost, measured).nodes
    assert node.roofline_ms == pytest.approx(base.roofline_ms / 0.25)
    factors = host_factors(measured)
    assert set(factors.efficiency.values()) == {1.0} and "micro-benchmarks" in factors.source


def test_the_kernel_micro_benchmark_gives_each_kind_it_ran_an_efficiency(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.estimate import host_kernels

    monkeypatch.setattr(host_kernels, "KERNELS", {k: host_kernels.KERNELS[k][:1] for k in ("conv-depthwise", "elementwise-simple")})
    monkeypatch.setattr(host_kernels, "RUNS", 3)
    points = host_kernels.kernel_efficiency(1, lambda node: (node.ops / 50e9) if node.ops else node.bytes / 10e9)
    assert set(points) == {"conv-depthwise", "elementwise-simple"}
    assert all(0 < eff <= host_kernels.MAX_EFFICIENCY and seconds > 0 for kind in points.values() for seconds, eff in kind)
