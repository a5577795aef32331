"""Node kinds for the kernels the x86 misses of issue 31 showed (1-D convolutions, 7x7 depthwise convolutions,
LayerNorm, InstanceNorm / GroupNorm, GELU): how a node is classified, that ONNX Runtime's optimised graph keeps the
kind, that every micro-benchmarked kind gets a measured point on a real ONNX Runtime run, and that an estimate
divides a node's roofline by its own kind's point, not its class's prior."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate import graph_costs
from edgekit.estimate.graph_cost import CONV1D_SHORT_OUTPUT, LAYERNORM_NARROW, node_kind
from edgekit.estimate.hardware import Hardware
from edgekit.estimate.roofline import DEFAULT_EFFICIENCY, roofline
from edgekit.estimate.runtime_graph import runtime_graph_costs

OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(node: onnx.NodeProto, shape: list[int], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=OPSET)


def _conv(c_in: int, c_out: int, kernel: list[int], length: int, group: int = 1) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.full((c_out, c_in // group, *kernel), 0.01, np.float32), "w")
    pads = [k // 2 for k in kernel] * 2
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=pads, name="node")
    return _model(node, [2, c_in, *[length] * len(kernel)], [weight])


def _norm(op: str, shape: list[int]) -> onnx.ModelProto:
    width = shape[-1] if op == "LayerNormalization" else shape[1]
    inits = [numpy_helper.from_array(np.ones(width, np.float32), "s"), numpy_helper.from_array(np.zeros(width, np.float32), "b")]
    return _model(helper.make_node(op, ["x", "s", "b"], ["y"], name="node"), shape, inits)


def _unary(op: str, domain: str = "") -> onnx.ModelProto:
    return _model(helper.make_node(op, ["x"], ["y"], name="node", domain=domain), [4, 256], [])


@pytest.mark.parametrize(("model", "kind"), [
    (_conv(32, 32, [3], CONV1D_SHORT_OUTPUT * 4), "conv-1d"),
    (_conv(128, 128, [3], CONV1D_SHORT_OUTPUT // 4), "conv-1d-short"),  # a few outputs an image: GEMMs of few columns
    (_conv(1, 32, [9], 2048), "conv-1d-stem"),  # a waveform's first layer
    (_conv(32, 32, [3], 64, group=4), "conv-other"),  # grouped 1-D
    (_conv(8, 8, [3, 3, 3], 8), "conv-other"),  # 3-D
    (_conv(32, 32, [7, 7], 16, group=32), "conv-depthwise-large"),
    (_conv(32, 32, [5, 5], 16, group=32), "conv-depthwise-large"),
    (_conv(32, 32, [3, 3], 16, group=32), "conv-depthwise"),
    (_norm("LayerNormalization", [64, 384]), "layernorm"),
    (_norm("LayerNormalization", [64, LAYERNORM_NARROW // 2]), "layernorm-narrow"),
    (_norm("InstanceNormalization", [2, 32, 100]), "instancenorm"),
    (_unary("Gelu", "com.microsoft"), "gelu"),
    (_unary("Softmax"), "normalization"),  # not micro-benchmarked: the class prior
    (_unary("Tanh"), "elementwise-transcendental"),
])  # fmt: skip
def test_each_node_gets_the_kind_of_kernel_that_runs_it(model: onnx.ModelProto, kind: str) -> None:
    (node,) = graph_costs(model).nodes
    assert node_kind(node) == kind


def test_the_graph_onnx_runtime_runs_keeps_the_kinds() -> None:
    """Through ONNX Runtime's optimiser (Conv+Relu -> FusedConv, depthwise -> NCHWc Conv): the kinds survive."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1], name="conv1d"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Unsqueeze", ["r1", "axis"], ["u"], name="unsqueeze"),
             helper.make_node("Conv", ["u", "w2"], ["c2"], pads=[3, 3, 3, 3], group=32, name="dw7"),
             helper.make_node("Transpose", ["c2"], ["t"], perm=[0, 2, 3, 1], name="to_last"),
             helper.make_node("LayerNormalization", ["t", "s", "b"], ["n"], axis=-1, name="ln"),
             helper.make_node("Gelu", ["n"], ["y"], domain="com.microsoft", name="gelu")]  # fmt: skip
    inits = [numpy_helper.from_array(np.full((32, 32, 3), 0.01, np.float32), "w1"),
             numpy_helper.from_array(np.full((32, 1, 7, 7), 0.01, np.float32), "w2"),
             numpy_helper.from_array(np.array([2], np.int64), "axis"),
             numpy_helper.from_array(np.ones(32, np.float32), "s"), numpy_helper.from_array(np.zeros(32, np.float32), "b")]  # fmt: skip
    graph = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    cost = runtime_graph_costs(helper.make_model(graph, opset_imports=OPSET), 1)
    kinds = {node_kind(n) for n in cost.nodes if not n.fused}
    assert {"conv-1d", "conv-depthwise-large", "layernorm-narrow", "gelu"} <= kinds


def test_every_micro_benchmarked_kind_gets_a_measured_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind's smallest synthetic graph, run by ONNX Runtime, holds nodes of that kind (ONNX Runtime neither
    fuses nor folds them into another kind), so every kind the estimate looks up has a measured efficiency."""
    from edgekit.estimate import host_kernels

    monkeypatch.setattr(host_kernels, "KERNELS", {k: builders[:1] for k, builders in host_kernels.KERNELS.items()})
    monkeypatch.setattr(host_kernels, "RUNS", 2)
    points = host_kernels.kernel_efficiency(1, lambda node: (node.ops / 50e9) if node.ops else node.bytes / 10e9)
    assert set(points) == set(host_kernels.KERNELS)
    new = {"conv-1d", "conv-1d-short", "conv-1d-stem", "conv-depthwise-large", "layernorm", "layernorm-narrow", "instancenorm", "gelu"}
    assert new <= set(points)
    assert all(0 < efficiency <= host_kernels.MAX_EFFICIENCY for kind in new for _, efficiency in points[kind])


@pytest.mark.parametrize(("model", "kind"), [
    (_conv(128, 128, [3], 4), "conv-1d-short"), (_conv(32, 32, [7, 7], 16, group=32), "conv-depthwise-large"),
    (_norm("LayerNormalization", [64, 32]), "layernorm-narrow"), (_norm("InstanceNormalization", [2, 32, 100]), "instancenorm"),
    (_unary("Gelu", "com.microsoft"), "gelu"),
])  # fmt: skip
def test_a_node_takes_its_own_kinds_measured_efficiency(model: onnx.ModelProto, kind: str) -> None:
    cost = graph_costs(model)
    plain = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0)
    (base,) = roofline(cost, plain).nodes
    seconds = base.roofline_ms / 1e3
    (node,) = cost.nodes
    others = {k: [[seconds, 0.9]] for k in ("conv-1d", "conv-depthwise", "layernorm", "elementwise-transcendental", "normalization")}
    measured = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0,
                        kernel_efficiency={**others, kind: [[seconds, 0.125]]})  # fmt: skip
    (timed,) = roofline(cost, measured).nodes
    assert timed.roofline_ms == pytest.approx(base.roofline_ms / 0.125)
    without = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0, kernel_efficiency=others)
    (prior,) = roofline(cost, without).nodes  # a kind with no point falls back to its class's prior, not a neighbour's
    assert prior.roofline_ms == pytest.approx(base.roofline_ms / DEFAULT_EFFICIENCY["cpu"][node.op_class])
