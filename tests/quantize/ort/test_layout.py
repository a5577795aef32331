"""Static int8 shaped for ONNX Runtime's NHWC integer convolutions: stem convolutions stay float (with the
reason in the plan) and are computed channels-last, and a conv feature map feeding a classifier is flattened
channels-last, with the classifier's weight rows permuted so that the model computes the same function."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.ort import layout
from edgekit.quantize.plan import make_plan
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def cnn(path: Path, in_channels: int, *, flatten: str = "Reshape", seed: int = 0) -> Path:
    """image [N, C, 6, 6] -> Conv(C->8) -> Relu -> Conv(8->8) -> Relu -> MaxPool 2 -> flatten [N, 72] -> Gemm -> logits [N, 5]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, in_channels, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b2"),
        numpy_helper.from_array(rng.normal(0, 0.2, (5, 72)).astype(np.float32), "wc"),
        numpy_helper.from_array(rng.normal(0, 0.1, 5).astype(np.float32), "bc"),
        numpy_helper.from_array(np.array([-1, 72], np.int64), "flat_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p2", "flat_shape"], ["flat"], name="flatten") if flatten == "Reshape"
        else helper.make_node("Flatten", ["p2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "wc", "bc"], ["logits"], name="classifier", transB=1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", in_channels, 6, 6])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def batches(in_channels: int, count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"image": rng.random((16, in_channels, 6, 6), dtype=np.float32)} for _ in range(count)]


def run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]


def optimized_ops(path: Path, tmp_path: Path) -> collections.Counter:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"{path.stem}.optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return collections.Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


def quantize(tmp_path: Path, fp32: Path, in_channels: int, target: str = "x86-64-cpu", backend: Backend = Backend.ONNXRUNTIME,
             flatten_channels_last: bool | None = None, stem_channels_last: bool | None = None, name: str = "int8"):
    spec = QuantizationSpec()
    plan = None
    if flatten_channels_last is not None or stem_channels_last is not None:  # the refined plan, with a rewrite switched as asked
        from edgekit.quantize.ort.static_plan import static_int8_plan

        plan = static_int8_plan(make_plan(spec, get_target(target), backend, Precision.INT8), fp32)
        if flatten_channels_last is not None:
            plan = replace(plan, channels_last_flatten=flatten_channels_last)
        if stem_channels_last is not None:
            plan = replace(plan, channels_last_stem=stem_channels_last)
    work = tmp_path / name
    work.mkdir()
    return quantize_model(fp32, work / "model.onnx", spec, get_target(target), backend, Precision.INT8, batches(in_channels), work,
                          plan=plan, cache_dir=tmp_path / "cache")


def test_a_stem_convolution_stays_float_and_the_plan_says_why(tmp_path):
    fp32 = cnn(tmp_path / "stem.onnx", in_channels=1)
    assert layout.stem_convolutions(fp32).keys() == {"conv1"}
    quantized = quantize(tmp_path, fp32, 1)
    why = quantized.plan.excluded["conv1"]
    assert "stem convolution (reduction 9 < 16)" in why and "conv2" not in quantized.plan.excluded
    assert quantized.plan.to_manifest()["excluded"]["conv1"] == why
    graph = onnx.load(str(quantized.path)).graph
    producers = {out: node for node in graph.node for out in node.output}
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    # conv1 is computed channels-last in float: one-hot patches of the image times its float kernel
    patches, gemm = (next(n for n in graph.node if n.name == f"conv1_channels_last_{part}") for part in ("patches", "gemm"))
    assert patches.input[0] == "image" and gemm.input[1] in inits and inits[gemm.input[1]].dtype == np.float32
    conv2 = next(n for n in graph.node if n.name == "conv2")
    assert producers[conv2.input[0]].op_type == "DequantizeLinear" and producers[conv2.input[1]].op_type == "DequantizeLinear"
    feeds = batches(1, 1)[0]
    np.testing.assert_allclose(run(quantized.path, feeds), run(fp32, feeds), atol=0.15)


def test_a_float_stem_is_computed_channels_last_without_the_transpose(tmp_path):
    """The rewritten stem computes the same function, and ONNX Runtime's uint8 transpose in front of its NHWC
    integer convolution is gone (the patches' reorder to NHWC is fused into ReorderOutput)."""
    fp32 = cnn(tmp_path / "stem.onnx", in_channels=1)
    before = quantize(tmp_path, fp32, 1, stem_channels_last=False, name="nchw")
    after = quantize(tmp_path, fp32, 1, stem_channels_last=True, name="nhwc")
    assert after.plan.channels_last_stem and "conv1" in after.plan.excluded
    for batch in (1, 32):
        feeds = {"image": np.random.default_rng(batch).random((batch, 1, 6, 6), dtype=np.float32)}
        np.testing.assert_allclose(run(after.path, feeds), run(before.path, feeds), rtol=1e-5, atol=1e-5)
    ops_before, ops_after = optimized_ops(before.path, tmp_path), optimized_ops(after.path, tmp_path)
    assert ops_before["Transpose"] >= 1 and ops_after["Transpose"] == ops_before["Transpose"] - 1
    assert ops_after["QLinearConv"] == ops_before["QLinearConv"] == 1
    # auto's check that the writers quantized what the plan says knows the rewritten stem is the excluded conv1
    from edgekit.quantize.ort.builder import unquantized_nodes

    assert unquantized_nodes(after.path, after.plan) == []
    assert layout.rewritten_from("conv1_channels_last_gemm", after.plan.excluded) == "conv1"
    assert layout.rewritten_from("conv2_channels_last_gemm", after.plan.excluded) is None


@pytest.mark.parametrize("why", ["float consumer", "grouped", "quantized stem"])
def test_stems_the_rewrite_cannot_help_are_left_alone(tmp_path, why):
    fp32 = cnn(tmp_path / "stem.onnx", in_channels=1)
    if why == "float consumer":  # a plain float model: nothing NHWC downstream
        model = onnx.load(str(fp32))
    else:
        model = onnx.load(str(quantize(tmp_path, fp32, 1, stem_channels_last=False).path))
        conv1 = next(n for n in model.graph.node if n.name == "conv1")
        if why == "grouped":
            conv1.attribute.append(helper.make_attribute("group", 1))
            conv1.attribute[-1].i = 2
        else:  # its weight read through a DequantizeLinear, as an int8 stem would be
            model.graph.node.insert(0, helper.make_node("DequantizeLinear", ["w1_q", "w1_scale"], ["w1_dq"], name="w1_dequantize"))
            conv1.input[1] = "w1_dq"
    before = model.SerializeToString()
    assert layout.stem_channels_last(model) == []
    assert model.SerializeToString() == before


def test_a_wide_first_convolution_is_quantized(tmp_path):
    fp32 = cnn(tmp_path / "wide.onnx", in_channels=2)  # reduction 18
    assert layout.stem_convolutions(fp32) == {}
    assert "conv1" not in quantize(tmp_path, fp32, 2).plan.excluded


@pytest.mark.parametrize("flatten", ["Reshape", "Flatten"])
def test_channels_last_flatten_computes_the_same_and_drops_the_transpose(tmp_path, flatten):
    fp32 = cnn(tmp_path / "wide.onnx", in_channels=2, flatten=flatten)
    before = quantize(tmp_path, fp32, 2, flatten_channels_last=False, name="nchw")
    after = quantize(tmp_path, fp32, 2, flatten_channels_last=True, name="nhwc")
    feeds = {"image": np.random.default_rng(7).random((32, 2, 6, 6), dtype=np.float32)}
    np.testing.assert_allclose(run(after.path, feeds), run(before.path, feeds), rtol=1e-5, atol=1e-5)
    # The classifier's int8 weight: the same values, its 72 input columns in (h, w, c) order.
    weights = [{i.name: numpy_helper.to_array(i) for i in onnx.load(str(q.path)).graph.initializer} for q in (before, after)]
    name = next(n for n in weights[0] if n.startswith("wc") and weights[0][n].dtype == np.int8 and weights[0][n].ndim == 2)
    order = np.arange(72).reshape(8, 3, 3).transpose(1, 2, 0).reshape(-1)
    np.testing.assert_array_equal(weights[1][name], weights[0][name][:, order])
    # ONNX Runtime runs the convolutions in NHWC: the NCHW flatten needed a transpose back, the NHWC one none.
    assert optimized_ops(before.path, tmp_path)["Transpose"] == optimized_ops(after.path, tmp_path)["Transpose"] + 1
    assert optimized_ops(after.path, tmp_path)["QLinearConv"] == 2


def test_flatten_of_a_float_tensor_is_left_alone(tmp_path):
    """A flatten whose input does not come from a quantized convolution keeps its NCHW order."""
    fp32 = cnn(tmp_path / "wide.onnx", in_channels=2)
    model = onnx.load(str(fp32))
    before = model.SerializeToString()
    assert layout.flatten_channels_last(model) == []
    assert model.SerializeToString() == before


def test_a_shared_classifier_weight_is_left_alone(tmp_path):
    quantized = quantize(tmp_path, cnn(tmp_path / "wide.onnx", in_channels=2), 2, flatten_channels_last=False)
    model = onnx.load(str(quantized.path))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    model.graph.node.append(helper.make_node("Identity", [gemm.input[1]], ["weight_again"], name="second_reader"))
    assert layout.flatten_channels_last(model) == []


def test_tensorrt_plans_keep_the_stem_and_the_layout(tmp_path):
    """TensorRT chooses its own layouts and runs int8 stems well: neither rewrite applies."""
    from edgekit.quantize.ort.static_plan import static_int8_plan

    fp32 = cnn(tmp_path / "stem.onnx", in_channels=1)
    plan = static_int8_plan(make_plan(QuantizationSpec(), get_target("jetson-orin-nano-8gb"), Backend.TENSORRT, Precision.INT8), fp32)
    assert "conv1" not in plan.excluded and not plan.channels_last_flatten and not plan.channels_last_stem
