"""The TensorRT-shaped cost model: ONNX nodes grouped into the layers TensorRT fuses, each costed once with a
launch cost per layer (issue 31 item 1). Structure (which nodes form which layer, which bytes a layer moves) and
numbers (time = the layer roofline / efficiency + launch) are both checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate import estimate, graph_costs, hardware_for, write_calibration
from edgekit.estimate.calibration import CalibrationEntry
from edgekit.estimate.roofline import TENSORRT_EFFICIENCY, TENSORRT_LAYER_LAUNCH_US, TENSORRT_MEMORY_SHARE, Factors
from edgekit.estimate.tensorrt_layers import fuse_layers, layer_work, tensorrt_roofline
from edgekit.target import get_target
from tests.estimate.graphs import qdq_matmul

TARGET = "jetson-orin-nano-super"


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def residual_block(channels: int = 64, size: int = 32) -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> Conv -> BN -> Add(x) -> Relu -> Reshape: two TensorRT layers (the second conv
    carries the residual Add and the Relu in its epilogue); the Reshape is a view."""
    c = channels
    inits = [numpy_helper.from_array(np.full((c, c, 3, 3), 0.01, np.float32), "w1"),
             numpy_helper.from_array(np.full((c, c, 3, 3), 0.01, np.float32), "w2"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]  # fmt: skip
    for i in (1, 2):
        inits += [numpy_helper.from_array(np.ones(c, np.float32), f"{k}{i}") for k in ("g", "b", "m", "v")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("BatchNormalization", ["c1", "g1", "b1", "m1", "v1"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("BatchNormalization", ["c2", "g2", "b2", "m2", "v2"], ["n2"], name="bn2"),
             helper.make_node("Add", ["n2", "x"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
             helper.make_node("Reshape", ["r2", "shape"], ["y"], name="flat")]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c * size * size])
    return _model(nodes, [x], [y], inits)


def attention(seq: int = 128, dim: int = 64) -> onnx.ModelProto:
    """q, k, v [1, seq, dim] -> MatMul(q, k^T) -> Div -> Softmax -> MatMul(., v): one fused attention layer."""
    inits = [numpy_helper.from_array(np.array(8.0, np.float32), "scale")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Div", ["s", "scale"], ["ss"], name="scale_div"),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]  # fmt: skip
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, seq, dim]) for n in ("q", "k", "v")]
    return _model(nodes, ins, [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, seq, dim])], inits)


def test_conv_bn_relu_and_the_residual_add_fuse_into_two_layers() -> None:
    cost = graph_costs(residual_block())
    layers = fuse_layers(cost)
    assert [[m.name for m in layer.members] for layer in layers] == [["conv1", "bn1", "relu1"], ["conv2", "bn2", "residual", "relu2"]]
    assert [layer.op_class for layer in layers] == ["conv", "conv"]
    work = layer_work(cost, hardware_for(get_target(TARGET)))
    activation = 64 * 32 * 32 * 4.0  # one fp32 [1, 64, 32, 32] tensor
    weights = 64 * 64 * 9 * 4.0 + 4 * 64 * 4.0  # the conv's and its BatchNorm's (folded into the conv by TensorRT)
    bandwidth = hardware_for(get_target(TARGET)).bandwidth_bytes_s
    # layer 1 reads x and its weights, writes r1; layer 2 reads r1, x (the residual) and its weights, writes r2
    assert work[0].memory_s == pytest.approx((activation + weights + activation) / bandwidth)
    assert work[1].memory_s == pytest.approx((2 * activation + weights + activation) / bandwidth)


def test_attention_is_one_layer_whose_scores_never_reach_memory() -> None:
    cost = graph_costs(attention())
    [layer] = fuse_layers(cost)
    assert layer.op_class == "attention" and [m.name for m in layer.members] == ["qk", "scale_div", "softmax", "pv"]
    [work] = layer_work(cost, hardware_for(get_target(TARGET)))
    q = 128 * 64 * 4.0  # q, k, v and o: the [128, 128] scores are not counted
    assert work.memory_s == pytest.approx((4 * q + 4.0) / hardware_for(get_target(TARGET)).bandwidth_bytes_s)  # + the scale
    assert work.compute_s > 0


def test_qdq_folds_into_the_int8_gemm() -> None:
    layers = fuse_layers(graph_costs(qdq_matmul()))
    assert [[m.name for m in layer.members] for layer in layers] == [["mm"]]


def test_a_jetson_estimate_times_layers_with_a_launch_cost_each() -> None:
    target = get_target(TARGET)
    model = residual_block()
    result = estimate(model, target)
    hardware = hardware_for(target)
    assert hardware.layer_model == "tensorrt"
    expected = 0.0
    for work in layer_work(graph_costs(model), hardware):
        prior = TENSORRT_EFFICIENCY[work.op_class]
        expected += max(work.compute_s / prior, work.memory_s / TENSORRT_MEMORY_SHARE) * 1e3 + TENSORRT_LAYER_LAUNCH_US / 1e3
    assert result.p50_ms == pytest.approx(expected)
    assert result.by_class["conv"]["nodes"] == 2  # layers, not ONNX nodes
    assert result.factors[0].startswith("ESTIMATE") and "launch cost per layer" in result.factors[0]
    assert any("8 ONNX nodes run as 2 fused layers" in f for f in result.factors)
    per_node = estimate(model, target, layer_model="per-node")
    assert per_node.p50_ms > result.p50_ms  # seven nodes with an overhead each and the unfused passes


def test_fp32_convs_run_as_tf32_as_tensorrt_builds_them() -> None:
    target = get_target(TARGET)
    hardware = hardware_for(target)
    [first, _] = layer_work(graph_costs(residual_block(256, 64)), hardware)
    assert first.precision == "tf32"
    result = estimate(residual_block(256, 64), target)
    assert any("TF32" in f for f in result.factors)


def test_fleet_calibration_scales_the_layer_model(tmp_path) -> None:
    target = get_target(TARGET)
    slow = Factors({k: v / 2 for k, v in TENSORRT_EFFICIENCY.items()}, 2 * TENSORRT_LAYER_LAUNCH_US, 0.5, "test fit")
    path = write_calibration(tmp_path / "cal.json", [CalibrationEntry(target.name, "MAXN_SUPER", slow, 3, 40.0, 5.0)])
    base = estimate(residual_block(), target)
    fitted = estimate(residual_block(), target, calibration=path)
    assert fitted.p50_ms == pytest.approx(2 * base.p50_ms)
    assert fitted.calibration["calibrated"] and any("test fit" in f for f in fitted.factors)


def test_the_per_node_model_stays_for_cpu_targets() -> None:
    assert hardware_for(get_target("raspberry-pi-5")).layer_model == "per-node"
    line = tensorrt_roofline(graph_costs(residual_block()), hardware_for(get_target(TARGET)))
    assert line.counted_nodes == 2


def test_cli_layers_option_picks_the_model(tmp_path, capsys) -> None:
    import json

    from edgekit.cli.main import main

    path = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(path))
    assert main(["estimate", str(path), "--target", TARGET, "--json", "--nodes"]) == 0
    layered = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["estimate", str(path), "--target", TARGET, "--layers", "per-node", "--json", "--nodes"]) == 0
    per_node = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [n["name"] for n in layered["nodes"]] == ["conv1", "conv2"]
    assert [n["op_type"] for n in layered["nodes"]] == ["Conv+BatchNormalization+Relu", "Conv+BatchNormalization+Add+Relu"]
    assert len(per_node["nodes"]) > 2 and per_node["p50_ms"] > layered["p50_ms"]
    assert "launch cost per layer" in layered["factors"][0] and "per-node overhead" in per_node["factors"][0]
