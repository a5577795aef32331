"""The FP8 / MXFP8 / MXFP4 / NVFP4 graph writers and the decoded host twin.

The written graphs are checked three ways: their structure (ops, element and scale types, block sizes,
opsets), their weights against the codec (:func:`quantize_dequantize`, itself bit-exact with ml_dtypes and
torch), and their outputs against ONNX's own reference implementation of DequantizeLinear, which decodes
FLOAT4E2M1 / FLOAT8E8M0 independently of edgekit. TensorRT's run-time activation quantizers (``trt`` domain)
get reference implementations here, written on the codec's quantize functions; the twin's standard-ONNX
emulation of them must agree bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize import block_activations
from edgekit.quantize.codecs import decode_e2m1, decode_e4m3, decode_e8m0, mx_quantize, nvfp4_quantize, quantize_dequantize
from edgekit.quantize.codecs.blocks import from_blocks
from edgekit.quantize.float_writers import fold_weight_dequantize, write_float_format
from edgekit.quantize.plan import QuantizationPlan, make_plan
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target

FORMATS = [Precision.FP8, Precision.MXFP8, Precision.MXFP4, Precision.NVFP4]
BLOCK_FORMATS = [Precision.MXFP8, Precision.MXFP4, Precision.NVFP4]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """MatMul (64x32) -> Relu -> Gemm (transB, 16x32), and a Conv (3 input channels) on a second input."""
    rng = np.random.default_rng(0)
    weights = {
        "W1": rng.normal(size=(64, 32)).astype(np.float32),
        "W2": rng.normal(size=(16, 32)).astype(np.float32),
        "b2": rng.normal(size=16).astype(np.float32),
        "Wc": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="gemm", transB=1),
            helper.make_node("Conv", ["img", "Wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64]), helper.make_tensor_value_info("img", TensorProto.FLOAT, ["b", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16]), helper.make_tensor_value_info("c", TensorProto.FLOAT, ["b", 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path_factory.mktemp("float-writers") / "fp32.onnx"
    onnx.save(model, str(path))
    feeds = {"x": rng.normal(size=(5, 64)).astype(np.float32), "img": rng.normal(size=(5, 3, 8, 8)).astype(np.float32)}
    relu_out = np.maximum(feeds["x"] @ weights["W1"], 0)
    amax = {"x": float(np.abs(feeds["x"]).max()), "r": float(relu_out.max()), "img": float(np.abs(feeds["img"]).max())}
    return path, weights, feeds, amax


def _plan(precision: Precision, **changes) -> QuantizationPlan:
    plan = make_plan(QuantizationSpec(), get_target("jetson-agx-thor"), Backend.TENSORRT, precision)
    return QuantizationPlan(**{**plan.__dict__, **changes}) if changes else plan


def _write(small_model, precision: Precision, tmp_path: Path):
    path, _, _, amax = small_model
    out = tmp_path / f"{precision.value}.onnx"
    result = write_float_format(path, out, _plan(precision), amax)
    twin = fold_weight_dequantize(out, tmp_path / f"{precision.value}.twin.onnx")
    return out, twin, result


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _initializer_types(path: Path) -> dict[str, int]:
    return {i.name: i.data_type for i in onnx.load(str(path)).graph.initializer}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b))


def mxfp8_reference(x: np.ndarray, block: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT's MXFP8 quantizer, from the codec's MX encoder: E4M3 elements (ml_dtypes), E8M0 scales (decoded)."""
    encoded = mx_quantize(x, "e4m3", block, axis)
    elements = from_blocks(decode_e4m3(encoded.codes), encoded.shape, encoded.axis)
    return elements.astype(ml_dtypes.float8_e4m3fn), decode_e8m0(encoded.scales_e8m0)


def nvfp4_reference(x: np.ndarray, scale: np.ndarray, block: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT's FP4 quantizer, from the codec's NVFP4 encoder against the graph's tensor scale (amax = scale * 2688)."""
    encoded = nvfp4_quantize(x, block, axis, tensor_amax=float(np.float32(scale) * np.float32(2688.0)))
    assert np.float32(encoded.tensor_scale) == np.float32(scale)
    elements = from_blocks(decode_e2m1(encoded.codes), encoded.shape, encoded.axis)
    return elements.astype(ml_dtypes.float4_e2m1fn), decode_e4m3(encoded.block_scales_e4m3).astype(ml_dtypes.float8_e4m3fn)


class TRT_MXFP8DynamicQuantize(OpRun):  # noqa: N801 - TensorRT's op name
    op_domain = "trt"

    def _run(self, x, axis=None, block_size=None, output_dtype=None):  # noqa: ANN001
        return mxfp8_reference(x, block_size, axis)


class TRT_MXFP8DequantizeLinear(OpRun):  # noqa: N801
    op_domain = "trt"

    def _run(self, elements, scales, axis=None, block_size=None, output_dtype=None):  # noqa: ANN001
        return (elements.astype(np.float32) * np.repeat(scales, block_size, axis=axis)).astype(np.float32),


class TRT_FP4DynamicQuantize(OpRun):  # noqa: N801
    op_domain = "trt"

    def _run(self, x, scale, axis=None, block_size=None, scale_type=None):  # noqa: ANN001
        return nvfp4_reference(x, scale, block_size, axis)


TRT_REFERENCE_OPS = [TRT_MXFP8DynamicQuantize, TRT_MXFP8DequantizeLinear, TRT_FP4DynamicQuantize]


def test_fp8_writes_e4m3_weights_per_channel_and_activation_qdq(small_model, tmp_path):
    out, _, result = _write(small_model, Precision.FP8, tmp_path)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    types = _initializer_types(out)
    assert {types["W1_e4m3"], types["W2_e4m3"], types["Wc_e4m3"]} == {TensorProto.FLOAT8E4M3FN}
    assert "W1" not in types  # the FP32 weight is gone
    scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert scales["W1_scale"].shape == (32,) and scales["W2_scale"].shape == (16,) and scales["Wc_scale"].shape == (4,)
    zero_points = [i for i in model.graph.initializer if i.name.endswith("_fp8_zero")]
    assert len(zero_points) == 3 and {z.data_type for z in zero_points} == {TensorProto.FLOAT8E4M3FN}
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 3 and ops.count("DequantizeLinear") == 6
    assert result.to_manifest()["quantized_activations"] == 3 and next(o.version for o in model.opset_import if o.domain == "") == 19


@pytest.mark.parametrize("precision, element, scale, block, opset", [
    (Precision.MXFP8, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E8M0, 32, 24),
    (Precision.MXFP4, TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E8M0, 32, 24),
    (Precision.NVFP4, TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E4M3FN, 16, 23),
])
def test_block_formats_write_their_element_and_scale_types(small_model, tmp_path, precision, element, scale, block, opset):
    out, _, result = _write(small_model, precision, tmp_path)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert next(o.version for o in model.opset_import if o.domain == "") == opset
    by_name = {i.name: i for i in model.graph.initializer}
    elements = [i for i in by_name.values() if i.data_type == element]
    assert sorted(i.name.split("_")[0] for i in elements) == ["W1", "W2"]
    weight_dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in {i.name for i in elements}]
    for node in weight_dq:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["block_size"] == block
        scale_name = node.input[1]
        if precision is Precision.NVFP4:  # the block scale is itself dequantized from E4M3 by the tensor scale
            producer = next(n for n in model.graph.node if scale_name in n.output)
            assert by_name[producer.input[0]].data_type == scale
        else:
            assert by_name[scale_name].data_type == scale
    w1_scale_shape = {"mxfp8": [2, 32], "mxfp4": [2, 32], "nvfp4": [4, 32]}[precision.value]
    assert [list(i.dims) for i in by_name.values() if i.name.startswith("W1_e") and i.data_type == scale] == [w1_scale_shape]
    assert [n.op_type for n in model.graph.node if n.name == "conv"] == ["Conv"] and "Wc" in by_name  # Conv stays float
    assert "last two axes" in result.skipped["conv"]
    assert "QuantizeLinear" not in {n.op_type for n in model.graph.node}  # weight-only in the graph


@pytest.mark.parametrize("precision", FORMATS)
def test_twin_weights_are_the_codec_values(small_model, tmp_path, precision):
    _, weights, _, _ = small_model
    _, twin, _ = _write(small_model, precision, tmp_path)
    decoded = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(twin)).graph.initializer}
    if precision is Precision.FP8:  # per output channel: amax / 448
        scale = np.abs(weights["W1"]).max(axis=0) / np.float32(448)
        expected = quantize_dequantize(weights["W1"] / scale, "fp8_e4m3") * scale
    else:
        expected = quantize_dequantize(weights["W1"], {"mxfp8": "mxfp8_e4m3"}.get(precision.value, precision.value), axis=0)
    np.testing.assert_allclose(decoded["W1_dq"], expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("precision", FORMATS)
def test_twin_runs_what_onnx_reference_computes_from_the_written_graph(small_model, tmp_path, precision):
    path, _, feeds, _ = small_model
    out, twin, _ = _write(small_model, precision, tmp_path)
    reference = ReferenceEvaluator(str(out), new_ops=TRT_REFERENCE_OPS).run(None, feeds)
    got = _session(twin).run(None, feeds)
    for r, g in zip(reference, got):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()))
    fp32 = _session(path).run(None, feeds)
    minimum = {Precision.FP8: 0.995, Precision.MXFP8: 0.995, Precision.MXFP4: 0.95, Precision.NVFP4: 0.97}[precision]
    assert _cosine(got[0], fp32[0]) >= minimum


def test_fp8_activation_scales_come_from_the_calibrated_ranges(small_model, tmp_path):
    _, _, _, amax = small_model
    _, _, result = _write(small_model, Precision.FP8, tmp_path)
    assert result.activations == pytest.approx({name: value / 448 for name, value in amax.items()})


@pytest.mark.parametrize("precision", [Precision.FP8, Precision.NVFP4])
def test_calibrated_formats_without_ranges_are_refused(small_model, tmp_path, precision):
    path, *_ = small_model
    with pytest.raises(QuantizationError, match=f"{precision.value} needs calibrated activation ranges"):
        write_float_format(path, tmp_path / "x.onnx", _plan(precision), None)


@pytest.mark.parametrize("precision, quantize, dequantize", [
    (Precision.MXFP8, "TRT_MXFP8DynamicQuantize", "TRT_MXFP8DequantizeLinear"),
    (Precision.NVFP4, "TRT_FP4DynamicQuantize", "DequantizeLinear"),
])
def test_block_formats_quantize_activations_with_tensorrt_dynamic_quantize(small_model, tmp_path, precision, quantize, dequantize):
    """W8A8 / W4A4: every activation entering a block-quantized MatMul/Gemm goes through TensorRT's run-time
    quantizer, blocks along the last (reduction) axis; nvfp4's double-quantization scale is the calibrated
    amax / (6 * 448). The Conv (weight float) reads its input unquantized."""
    _, _, _, amax = small_model
    out, twin, result = _write(small_model, precision, tmp_path)
    model = onnx.load(str(out))
    assert any(o.domain == "trt" and o.version == 1 for o in model.opset_import)
    quantizers = [n for n in model.graph.node if n.op_type == quantize]
    assert sorted(n.input[0] for n in quantizers) == ["r", "x"] and all(n.domain == "trt" for n in quantizers)
    block = block_activations.ACTIVATION_FORMATS[precision].block
    for node in quantizers:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["axis"] == -1 and attrs["block_size"] == block
    readers = {n.name: n for n in model.graph.node if n.op_type in ("MatMul", "Gemm")}
    producers = {o: n for n in model.graph.node for o in n.output}
    assert all(producers[r.input[0]].op_type == dequantize for r in readers.values())
    assert next(n for n in model.graph.node if n.op_type == "Conv").input[0] == "img"
    if precision is Precision.NVFP4:
        scales = {i.name: float(numpy_helper.to_array(i)) for i in model.graph.initializer if i.name in ("x_nvfp4_tensor_scale", "r_nvfp4_tensor_scale")}
        assert result.activations == pytest.approx({name: value / 2688 for name, value in amax.items() if name in ("x", "r")})
        assert scales == {f"{name}_nvfp4_tensor_scale": value for name, value in result.activations.items()}
    else:
        assert result.activations == {"x": None, "r": None}
    assert result.to_manifest()["quantized_activations"] == 2 and "TensorRT DynamicQuantize" in result.to_manifest()["activations"]
    twin_ops = {n.op_type for n in onnx.load(str(twin)).graph.node}
    assert not twin_ops & {quantize, dequantize, "QuantizeLinear", "DequantizeLinear"}
    assert {"ReduceMax", "Cast"} <= twin_ops and ("Round" in twin_ops) == (precision is Precision.NVFP4)


def test_an_activation_tensorrt_cannot_block_quantize_stays_float_and_says_why(tmp_path):
    """TensorRT's DynamicQuantize takes 2-D or 3-D tensors: a 4-D MatMul input keeps float, with the reason."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm4d")], "four_d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 32])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 8])],
        [numpy_helper.from_array(np.ones((32, 8), np.float32), "W")],
    )
    path = tmp_path / "four_d.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    result = write_float_format(path, tmp_path / "out.onnx", _plan(Precision.MXFP8))
    assert result.weights == {"W": "mxfp8"} and result.activations == {}
    assert result.to_manifest()["float_activations"] == {"mm4d": "TensorRT's DynamicQuantize takes 2-D or 3-D tensors; activation x is 4-D"}


def test_mxfp4_is_weight_only_and_says_why(small_model, tmp_path):
    out, _, result = _write(small_model, Precision.MXFP4, tmp_path)
    assert not any(n.domain == "trt" for n in onnx.load(str(out)).graph.node)
    assert result.activations == {} and "W4A16" in result.to_manifest()["activations"]


@pytest.mark.parametrize("precision", [Precision.MXFP8, Precision.NVFP4])
def test_twin_emulation_of_the_activation_quantizer_is_bit_exact_with_the_codec(tmp_path, precision):
    """The standard-ONNX emulation against the codec on awkward values: a zero block, exact powers of two,
    block maxima from 1e-3 to 3e3 (so every binade of the element format is hit), ties included."""
    rng = np.random.default_rng(3)
    x = (rng.standard_t(3, (48, 5, 96)) * rng.choice([1e-3, 1.0, 50.0, 3000.0], (48, 1, 1))).astype(np.float32)
    x[0, 0, :32] = 0
    x[1, 0, :32] = 2.0 ** rng.integers(-20, 20, 32)
    x[2, 0, :16] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 6], np.float32)
    extra, scale_name = [], None
    if precision is Precision.NVFP4:
        scale_name = "tensor_scale"
        amax = float(np.abs(x).max()) * 0.5  # a calibrated range below the max: saturation happens
        extra = [numpy_helper.from_array(np.array(block_activations.nvfp4_tensor_scale(amax), np.float32), scale_name)]
        scale = numpy_helper.to_array(extra[0])
        elements, block_scales = nvfp4_reference(x, scale, 16, -1)
        expected = elements.astype(np.float32) * np.repeat(block_scales.astype(np.float32) * scale, 16, axis=-1)
    else:
        elements, scales = mxfp8_reference(x, 32, -1)
        expected = elements.astype(np.float32) * np.repeat(scales, 32, axis=-1)
    inits, nodes = block_activations.emulation_nodes("x", "y", precision, scale_name)
    graph = helper.make_graph(nodes, "emulation", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, 96])], inits + extra)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "emulation.onnx"
    onnx.save(model, str(path))
    got = _session(path).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float32))


def test_block_format_with_nothing_to_quantize_says_why(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="odd")], "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.ones((20, 8), np.float32), "W")],
    )
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(QuantizationError, match=r"nvfp4 found no weight it can quantize in odd.onnx \(odd: reduction axis of length 20 is not a multiple of the 16-element block\)"):
        write_float_format(path, tmp_path / "x.onnx", _plan(Precision.NVFP4), {"x": 1.0})


def test_excluded_nodes_stay_float(small_model, tmp_path):
    path, _, _, amax = small_model
    out = tmp_path / "excluded.onnx"
    result = write_float_format(path, out, _plan(Precision.NVFP4, excluded={"gemm": "test"}), amax)
    assert list(result.weights) == ["W1"]
    assert "W2" in _initializer_types(out)


def test_a_precision_that_is_not_a_float_format_is_refused(small_model, tmp_path):
    path, *_ = small_model
    with pytest.raises(QuantizationError, match=r"int8 is not a floating-point format this writer knows") as caught:
        write_float_format(path, tmp_path / "x.onnx", _plan(Precision.INT8))
    assert "fp8, mxfp8, mxfp4, nvfp4" in caught.value.hint


def test_a_failed_opset_conversion_names_the_file_and_the_fix(small_model, tmp_path, monkeypatch):
    path, *_ = small_model

    def refuse(model, opset):
        raise RuntimeError("no adapter for op Foo")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    with pytest.raises(QuantizationError, match=r"fp32.onnx: converting the graph from opset 18 to 23 .* failed: no adapter for op Foo") as caught:
        write_float_format(path, tmp_path / "x.onnx", _plan(Precision.NVFP4), {"x": 1.0})
    assert caught.value.hint == (
        "for a PyTorch model, export at opset 23 (recipe export.opset) so no conversion is needed; "
        "an ONNX file must already be opset 23: upgrade it with the tool that produced it"
    )


@pytest.mark.parametrize("precision", FORMATS)
def test_a_weight_that_is_also_a_graph_input_stops_being_an_input(precision: Precision, tmp_path: Path) -> None:
    """ONNX lets an initializer also be a graph input (an overridable default; older exporters wrote every
    weight so). The writers replace the weight, and used to leave the input behind: the model then asked for
    the weight as a required input. Now it goes, as it does in the int8 writers."""
    rng = np.random.default_rng(4)
    weight = rng.normal(size=(64, 32)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64]),
                               helper.make_tensor_value_info("W", TensorProto.FLOAT, [64, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 32])], [numpy_helper.from_array(weight, "W")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    x = rng.normal(size=(3, 64)).astype(np.float32)
    out = tmp_path / "q.onnx"
    write_float_format(tmp_path / "fp32.onnx", out, _plan(precision), {"x": float(np.abs(x).max())})
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]
    twin = fold_weight_dequantize(out, tmp_path / "twin.onnx")
    got = _session(twin).run(None, {"x": x})[0]  # before: "Required inputs (['W']) are missing"
    assert _cosine(got, x @ weight) > 0.95
