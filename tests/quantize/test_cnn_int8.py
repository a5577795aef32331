"""Static int8 on convolutional graphs the way third-party CNNs are built (PP-OCR, MobileNet): float
consumers must not read past a Q/DQ pair that applies a folded Relu, and a quantized Conv keeps its output
quantized so that ONNX Runtime runs it as ``QLinearConv`` instead of a float Conv on dequantized weights."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def _save(nodes: list, inits: list, outputs: list[tuple[str, list]], path: Path, channels: int = 8) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", channels, 12, 12])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _conv(rng: np.random.Generator, name: str, cin: int, cout: int, k: int, inits: list, x: str, y: str, group: int = 1) -> object:
    """A k x k Conv ("same" padding) with seeded weight and bias initializers appended to ``inits``."""
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin // group, k, k)).astype(np.float32), f"{name}_w"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.2, cout).astype(np.float32), f"{name}_b"))
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, pads=[k // 2] * 4, kernel_shape=[k, k], group=group)


def se_like(path: Path) -> Path:
    """conv1 -> Relu -> {conv2 (kept float by the recipe), conv3}: PP-OCR's squeeze-excite convolutions."""
    rng = np.random.default_rng(0)
    inits: list = []
    nodes = [
        _conv(rng, "conv1", 8, 16, 3, inits, "image", "c1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        _conv(rng, "conv2", 16, 4, 1, inits, "r1", "squeezed"),
        _conv(rng, "conv3", 16, 8, 3, inits, "r1", "features"),
    ]
    return _save(nodes, inits, [("squeezed", ["N", 4, 12, 12]), ("features", ["N", 8, 12, 12])], path)


def silu_between(path: Path) -> Path:
    """conv1 -> x * Sigmoid(x) (float ops only) -> conv2: conv1's output has no quantized reader."""
    rng = np.random.default_rng(1)
    inits: list = []
    nodes = [
        _conv(rng, "conv1", 8, 16, 3, inits, "image", "c1"),
        helper.make_node("Sigmoid", ["c1"], ["gate"], name="sigmoid"),
        helper.make_node("Mul", ["c1", "gate"], ["silu"], name="silu"),
        _conv(rng, "conv2", 16, 8, 3, inits, "silu", "features"),
    ]
    return _save(nodes, inits, [("features", ["N", 8, 12, 12])], path)


def _batches(count: int, seed: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(0, 1, (8, 8, 12, 12)).astype(np.float32)} for _ in range(count)]


def _quantize(fp32: Path, tmp_path: Path, **spec: object) -> Path:
    out = tmp_path / "int8.onnx"
    quantize_model(fp32, out, QuantizationSpec(calibrator="minmax", **spec), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                   _batches(4), tmp_path, cache_dir=tmp_path / "cache")
    return out


def _run(path: Path, feeds: dict[str, np.ndarray], optimized: Path | None = None) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_float_consumer_of_a_folded_relu_reads_the_relu_output(tmp_path):
    """conv2 (float) reads conv1's output after the Relu the quantizer folded into conv1's Q: reading the
    tensor before the Q would skip the Relu (negative values leak into conv2)."""
    fp32 = se_like(tmp_path / "fp32.onnx")
    int8 = _quantize(fp32, tmp_path, exclude_nodes=("conv2",))
    feeds = _batches(1, seed=9)[0]
    want, got = _run(fp32, feeds), _run(int8, feeds)
    assert _cosine(got["squeezed"], want["squeezed"]) > 0.99
    assert _cosine(got["features"], want["features"]) > 0.99
    conv2 = next(n for n in onnx.load(str(int8)).graph.node if n.name == "conv2")
    assert conv2.input[1] == "conv2_w", "conv2 was excluded: float weights"


def test_quantized_conv_with_only_float_readers_keeps_its_output_quantized(tmp_path):
    """conv1's readers (Sigmoid, Mul) are float; its output keeps a Q/DQ pair all the same, so ONNX Runtime
    fuses both convolutions into QLinearConv (without it conv1 ran as a float Conv on dequantized weights)."""
    fp32 = silu_between(tmp_path / "fp32.onnx")
    int8 = _quantize(fp32, tmp_path)
    feeds = _batches(1, seed=9)[0]
    optimized = tmp_path / "optimized.onnx"
    got = _run(int8, feeds, optimized)["features"]
    assert _cosine(got, _run(fp32, feeds)["features"]) > 0.99
    ops = collections.Counter(n.op_type for n in onnx.load(str(optimized)).graph.node)
    assert ops["QLinearConv"] == 2, ops
    assert ops["Conv"] == 0 and ops["FusedConv"] == 0, ops


def _dynamic(fp32: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    return quantize_model(fp32, tmp_path / "dynamic.onnx", QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                          Precision.INT8_DYNAMIC, None, tmp_path)


def test_int8_dynamic_on_a_cnn_refuses_to_label_a_float_model(tmp_path):
    """A graph whose weights are all in Conv nodes: int8-dynamic leaves them float (ConvInteger is slower than
    float on ONNX Runtime's CPU), so it quantizes nothing; the build stops and says why and what to use, as
    int8 and int4 do, instead of writing a bundle labelled int8-dynamic that holds the float model."""
    fp32 = silu_between(tmp_path / "fp32.onnx")
    with pytest.raises(QuantizationError) as info:
        _dynamic(fp32, tmp_path)
    message = info.value.message
    assert message.startswith("fp32.onnx: int8-dynamic quantized nothing: 2 Conv node(s) hold the rest and stay float"), message
    assert "ConvInteger" in message and "use int8 (static, calibrated)" in message


def _one_matmul(path: Path) -> Path:
    """One MatMul (``mm``) of a 16x16 weight: a transformer's weights in miniature."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (16, 16)).astype(np.float32), "w")]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_int8_dynamic_with_every_weighted_node_excluded_refuses(tmp_path):
    """The recipe excludes the one MatMul (or its op type): nothing is quantized, and the error says so."""
    _one_matmul(tmp_path / "fp32.onnx")
    for spec, says in ((QuantizationSpec(exclude_nodes=("mm",)), "no weights of MatMul/Gemm left to quantize (1 node(s) excluded"),
                       (QuantizationSpec(exclude_op_types=("MatMul", "Gemm")), "1 MatMul node(s) hold the rest and stay float, excluded by quantization.exclude_op_types")):
        with pytest.raises(QuantizationError, match="int8-dynamic quantized nothing") as info:
            quantize_model(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx", spec, get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                           Precision.INT8_DYNAMIC, None, tmp_path)  # fmt: skip
        assert says in info.value.message, info.value.message
    # exclude_op_types: [Gemm] keeps the MatMul quantized (before, the op types were fixed for int8-dynamic)
    spec = QuantizationSpec(exclude_op_types=("Gemm",))
    result = quantize_model(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx", spec, get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                            Precision.INT8_DYNAMIC, None, tmp_path)  # fmt: skip
    assert result.plan.op_types == ("MatMul",)


def test_int8_dynamic_names_the_share_it_quantized(tmp_path):
    """Convolutions holding most weights beside one classifier Gemm: the note gives the Gemm's share."""
    from tests.quantize.ort.test_layout import cnn

    result = _dynamic(cnn(tmp_path / "fp32.onnx", 8), tmp_path)
    note = result.plan.notes[-1]
    # weights: conv1 8*8*9 = 576, conv2 8*8*9 = 576, classifier 5*72 = 360 -> 360 / 1512 = 23.8 %
    assert note.startswith("int8-dynamic quantized 1 MatMul/Gemm node(s), 23.8% of the weights: 2 Conv node(s) hold the rest"), note
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(result.path)).graph.node} or "DynamicQuantizeLinear" in {
        n.op_type for n in onnx.load(str(result.path)).graph.node}


def test_int8_dynamic_on_a_transformer_has_no_warning(tmp_path):
    """MatMul weights only: nothing to say."""
    _one_matmul(tmp_path / "fp32.onnx")
    result = _dynamic(tmp_path / "fp32.onnx", tmp_path)
    assert not any(note.startswith("int8-dynamic quantized") for note in result.plan.notes)
    assert "warnings" not in result.to_manifest()


def residual_with_depthwise(path: Path) -> Path:
    """conv1 -> Relu -> depthwise conv2 (3x3, 16 groups) -> Add(residual) -> conv3, beside a MatMul + bias Add
    on a second input that no convolution reaches."""
    rng = np.random.default_rng(4)
    inits: list = []
    nodes = [
        _conv(rng, "conv1", 8, 16, 3, inits, "image", "c1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    ]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (16, 1, 3, 3)).astype(np.float32), "dw_w"))
    nodes.append(helper.make_node("Conv", ["r1", "dw_w"], ["c2"], name="depthwise", pads=[1, 1, 1, 1], kernel_shape=[3, 3], group=16))
    nodes.append(helper.make_node("Add", ["r1", "c2"], ["res"], name="residual"))
    nodes.append(_conv(rng, "conv3", 16, 8, 1, inits, "res", "features"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "proj_w"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "proj_b"))
    nodes.append(helper.make_node("MatMul", ["tokens", "proj_w"], ["mm"], name="proj"))
    nodes.append(helper.make_node("Add", ["mm", "proj_b"], ["projected"], name="proj_bias"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 8, 12, 12]),
                                           helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8, 12, 12]),
                               helper.make_tensor_value_info("projected", TensorProto.FLOAT, ["N", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_residual_add_and_depthwise_conv_stay_in_the_integer_chain(tmp_path):
    """The residual Add runs as QLinearAdd and the depthwise 3x3 (reduction 9) as QLinearConv: it is not a
    stem. The MatMul's bias Add, which no convolution reaches, keeps float inputs and output."""
    fp32 = residual_with_depthwise(tmp_path / "fp32.onnx")
    rng = np.random.default_rng(5)
    batches = [{"image": rng.normal(0, 1, (8, 8, 12, 12)).astype(np.float32), "tokens": rng.normal(0, 1, (8, 16)).astype(np.float32)}
               for _ in range(4)]
    out = tmp_path / "int8.onnx"
    result = quantize_model(fp32, out, QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                            batches, tmp_path, cache_dir=tmp_path / "cache")
    assert "depthwise" not in result.plan.excluded
    quantized_inputs = {n.input[0] for n in onnx.load(str(out)).graph.node if n.op_type == "QuantizeLinear"}
    assert "res" in quantized_inputs and "projected" not in quantized_inputs and "mm" not in quantized_inputs
    optimized = tmp_path / "optimized.onnx"
    feeds = {"image": batches[0]["image"][:2], "tokens": batches[0]["tokens"][:2]}
    got, want = _run(out, feeds, optimized), _run(fp32, feeds)
    assert _cosine(got["features"], want["features"]) > 0.99
    assert _cosine(got["projected"], want["projected"]) > 0.99
    ops = collections.Counter(n.op_type for n in onnx.load(str(optimized)).graph.node)
    assert ops["QLinearConv"] == 3 and ops["QLinearAdd"] == 1, ops


def test_recurrent_and_control_flow_ops_are_named_in_the_plan(tmp_path):
    """An LSTM inside an If branch and the If itself: both plans say they stay float and why."""
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(6)
    hidden, features = 4, 3
    lstm_inits = [nh.from_array(rng.normal(0, 0.3, (1, 4 * hidden, features)).astype(np.float32), "W"),
                  nh.from_array(rng.normal(0, 0.3, (1, 4 * hidden, hidden)).astype(np.float32), "R")]
    branch = helper.make_graph([helper.make_node("LSTM", ["seq", "W", "R"], ["lstm_y"], name="decoder_lstm", hidden_size=hidden)], "then",
                               [], [helper.make_tensor_value_info("lstm_y", TensorProto.FLOAT, None)], lstm_inits)
    other = helper.make_graph([helper.make_node("Identity", ["zeros"], ["other_y"], name="passthrough")], "else", [],
                              [helper.make_tensor_value_info("other_y", TensorProto.FLOAT, None)],
                              [nh.from_array(np.zeros((2, 1, 1, hidden), np.float32), "zeros")])
    nodes = [helper.make_node("If", ["flag"], ["y"], name="by_rate", then_branch=branch, else_branch=other),
             helper.make_node("MatMul", ["seq", "proj_w"], ["z"], name="proj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("seq", TensorProto.FLOAT, [2, 1, features]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 1, 5])],
                              [nh.from_array(rng.normal(0, 0.3, (features, 5)).astype(np.float32), "proj_w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    batches = [{"seq": rng.normal(0, 1, (2, 1, features)).astype(np.float32), "flag": np.array(True)} for _ in range(2)]
    static = quantize_model(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"),
                            Backend.ONNXRUNTIME, Precision.INT8, batches, tmp_path, cache_dir=tmp_path / "cache")
    dynamic = _dynamic(tmp_path / "fp32.onnx", tmp_path)
    want = "kept float: 1 If, 1 LSTM (recurrent state would accumulate quantization error; control-flow bodies are not quantized)"
    assert want in static.plan.notes and want in dynamic.plan.notes
    feeds = batches[0]
    np.testing.assert_allclose(_run(tmp_path / "int8.onnx", feeds)["y"], _run(tmp_path / "fp32.onnx", feeds)["y"], rtol=1e-5, atol=1e-6)


def _heads_model(path: Path, concatenated: bool) -> Path:
    """features -> MatMul (trunk) -> Relu -> {MatMul boxes -> Sigmoid, MatMul scores} -> Concat (or scores only)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
             for name, shape in (("trunk_w", (16, 16)), ("box_w", (16, 4)), ("cls_w", (16, 6)))]
    nodes = [helper.make_node("MatMul", ["x", "trunk_w"], ["t"], name="trunk"), helper.make_node("Relu", ["t"], ["h"], name="act"),
             helper.make_node("MatMul", ["h", "cls_w"], ["scores"], name="scores_head")]
    if concatenated:
        nodes += [helper.make_node("MatMul", ["h", "box_w"], ["b"], name="box_head"), helper.make_node("Sigmoid", ["b"], ["boxes"], name="box_sigmoid"),
                  helper.make_node("Concat", ["boxes", "scores"], ["y"], name="detections", axis=-1)]
    else:
        nodes += [helper.make_node("Identity", ["scores"], ["y"], name="logits")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 10 if concatenated else 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_heads_of_an_output_that_mixes_boxes_and_scores_stay_float(tmp_path):
    from edgekit.quantize.ort.static_plan import mixed_output_heads

    rng = np.random.default_rng(8)
    batches = [{"x": rng.normal(0, 1, (4, 5, 16)).astype(np.float32)} for _ in range(3)]
    fp32 = _heads_model(tmp_path / "fp32.onnx", concatenated=True)
    result = quantize_model(fp32, tmp_path / "int8.onnx", QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                            Precision.INT8, batches, tmp_path, cache_dir=tmp_path / "cache")
    assert set(result.plan.excluded) == {"box_head", "scores_head"}
    assert "concatenates 2 heads of different ranges (boxes beside scores): kept float" in result.plan.excluded["box_head"]
    assert "2 output head(s) kept float: their output mixes boxes and scores" in result.plan.notes
    readers = {n.name: list(n.input) for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node}
    assert readers["box_head"][1] == "box_w" and readers["scores_head"][1] == "cls_w"  # float weights
    assert readers["trunk"][1] != "trunk_w"  # the trunk is quantized
    assert mixed_output_heads(_heads_model(tmp_path / "classifier.onnx", concatenated=False)) == {}


def test_a_narrow_convolution_inside_the_network_is_not_a_stem(tmp_path):
    """MobileNetV2 0.5x has 1x1 convolutions over 8 channels (reduction 8, under the stem rule's 16) deep
    inside; only a convolution that reads the input (through Pad/normalisation) is a stem."""
    from edgekit.quantize.ort import layout

    rng = np.random.default_rng(9)
    inits: list = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    nodes = [helper.make_node("Pad", ["image", "pads"], ["padded"], name="pad"),
             _conv(rng, "stem", 8, 8, 1, inits, "padded", "s"), helper.make_node("Relu", ["s"], ["r"], name="relu"),
             _conv(rng, "inner", 8, 16, 1, inits, "r", "features")]
    fp32 = _save(nodes, inits, [("features", ["N", 16, 14, 14])], tmp_path / "fp32.onnx")
    assert set(layout.stem_convolutions(fp32)) == {"stem"}
