"""Every ONNX Runtime precision on the demo recipes: structure (which ops and dtypes) and numbers
(tolerances against FP32). digits-cnn goes through the whole build; MiniLM through the quantize stage
on one shared FP32 export (a full MiniLM build per precision would take minutes)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgekit.data import load_batches, model_inputs
from edgekit.errors import QuantizationError
from edgekit.export import export_onnx
from edgekit.pipeline import build
from edgekit.precision import Backend, Precision
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import load_recipe
from edgekit.target import get_target
from tests.conftest import REPO

DIGITS = REPO / "recipes" / "digits-cnn.yaml"


def op_counts(path: Path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.fixture(scope="module")
def digits_bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    cache = root / "cache"
    import os

    os.environ["EDGEKIT_CACHE_DIR"] = str(cache)
    bundles = {p: build(DIGITS, "x86-64-cpu", precision=p, out=root / p) for p in ("fp32", "fp16", "int8", "int8-dynamic", "int4")}
    yield bundles
    os.environ.pop("EDGEKIT_CACHE_DIR", None)


def test_digits_int8_is_static_qdq_with_uint8_activations(digits_bundles):
    result = digits_bundles["int8"]
    ops = op_counts(result.bundle_dir / "model.onnx")
    assert ops["QuantizeLinear"] >= 5 and ops["DequantizeLinear"] >= 10
    model = onnx.load(str(result.bundle_dir / "model.onnx"))
    zero_points = {i.name: i.data_type for i in model.graph.initializer if "zero_point" in i.name}
    assert onnx.TensorProto.UINT8 in zero_points.values() and onnx.TensorProto.INT8 in zero_points.values()
    quant = result.manifest["quantization"]
    assert quant["plan"]["activation_type"] == "uint8" and quant["plan"]["weight_type"] == "int8" and quant["plan"]["per_channel"]
    assert quant["calibration"]["calibrator"] == "percentile" and quant["calibration"]["tensors"] >= 5
    assert quant["calibration"]["file"] in result.manifest["files"]
    assert abs(result.manifest["accuracy"]["drop"]) <= 0.005
    assert result.manifest["model"]["size_bytes"] < 0.35 * digits_bundles["fp32"].manifest["model"]["size_bytes"]


def test_digits_int8_runs_as_one_integer_chain(digits_bundles, tmp_path):
    """Relu folded into the convolutions' output ranges, MaxPool and Reshape on uint8: ONNX Runtime runs the
    two integer convolutions as QLinearConv back to back in NHWC with no float round trip between them. The
    1-channel stem convolution stays float (the plan says why) and is computed channels-last (its patches'
    reorder to NHWC fused into ReorderOutput); the flatten before the classifier reads NHWC order, so ONNX
    Runtime runs the whole network without a Transpose."""
    result = digits_bundles["int8"]
    bundle = result.bundle_dir
    assert "stem convolution" in result.manifest["quantization"]["plan"]["excluded"]["node_conv2d"]
    assert result.manifest["quantization"]["plan"]["channels_last_flatten"]
    assert result.manifest["quantization"]["plan"]["channels_last_stem"]
    assert op_counts(bundle / "model.onnx")["Relu"] == 1  # the stem's, float
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(bundle / "model.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = op_counts(tmp_path / "optimized.onnx")
    assert optimized["QLinearConv"] == 2 and optimized["NhwcMaxPool"] == 2 and optimized["QGemm"] == 2
    assert optimized["MaxPool"] == 0 and optimized["Conv"] == 1 and optimized["Transpose"] == 0
    assert optimized["ReorderOutput"] == 1 and optimized["Gemm"] == 1  # the stem: patches to NHWC, times its kernel
    assert optimized["DequantizeLinear"] == 1  # the logits, nothing in between


def test_calibration_is_reused_by_the_next_build(digits_bundles, tmp_path):
    again = build(DIGITS, "x86-64-cpu", precision="int8", out=tmp_path / "again")
    first = digits_bundles["int8"].manifest["quantization"]["calibration"]
    second = again.manifest["quantization"]["calibration"]
    assert first["from_cache"] is False and second["from_cache"] is True and first["key"] == second["key"]
    cached = json.loads((again.bundle_dir / second["file"]).read_text())
    assert cached  # the ranges travel with the bundle


def test_digits_int8_dynamic_uses_integer_matmul(digits_bundles):
    ops = op_counts(digits_bundles["int8-dynamic"].bundle_dir / "model.onnx")
    assert ops["DynamicQuantizeLinear"] >= 1 and ops["MatMulInteger"] >= 1
    assert digits_bundles["int8-dynamic"].manifest["accuracy"]["drop"] <= 0.005


def test_digits_int4_quantizes_linear_layers(digits_bundles):
    ops = op_counts(digits_bundles["int4"].bundle_dir / "model.onnx")
    assert ops["MatMulNBits"] == 2 and ops["Gemm"] == 0
    assert digits_bundles["int4"].manifest["accuracy"]["drop"] <= 0.005


def test_digits_fp16_weights(digits_bundles):
    model = onnx.load(str(digits_bundles["fp16"].bundle_dir / "model.onnx"))
    assert {i.data_type for i in model.graph.initializer if i.dims and len(i.dims) > 1} == {onnx.TensorProto.FLOAT16}
    assert digits_bundles["fp16"].manifest["accuracy"]["drop"] <= 0.005


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    from edgekit.sources import load_source

    root = tmp_path_factory.mktemp("minilm")
    recipe = load_recipe(REPO / "recipes" / "minilm.yaml")
    module = load_source(recipe, root).module
    samples = load_batches(recipe, recipe.data.samples, "samples")
    path = export_onnx(module, recipe, model_inputs(recipe, samples[0]), 18, root / "fp32.onnx").path
    evaluation = load_batches(recipe, recipe.data.evaluation, "evaluation")[:6]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = [session.run(None, model_inputs(recipe, b))[0] for b in evaluation]
    return recipe, path, evaluation, reference, root


def _cosines(path: Path, recipe, batches, reference) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = [session.run(None, model_inputs(recipe, b))[0] for b in batches]
    return np.concatenate([np.sum(g * r, 1) / np.linalg.norm(g, axis=1) / np.linalg.norm(r, axis=1) for g, r in zip(got, reference)])


def test_minilm_int8_dynamic(minilm):
    recipe, path, batches, reference, root = minilm
    out = quantize_model(path, root / "dyn.onnx", recipe.build.quantization, get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                         Precision.INT8_DYNAMIC, None, root)
    ops = op_counts(out.path)
    assert ops["DynamicQuantizeLinear"] >= 6 and ops["MatMulInteger"] >= 36
    assert out.path.stat().st_size <= 0.3 * path.stat().st_size  # the embedding tables are int8 too
    assert _cosines(out.path, recipe, batches, reference).mean() >= 0.99


def test_minilm_int4_with_embeddings_is_small_and_close(minilm):
    recipe, path, batches, reference, root = minilm
    (root / "work-int4").mkdir()
    out = quantize_model(path, root / "int4.onnx", recipe.build.quantization, get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                         Precision.INT4, None, root / "work-int4")
    ops = op_counts(out.path)
    assert ops["MatMulNBits"] == 36 and ops["GatherBlockQuantized"] >= 1
    assert out.path.stat().st_size <= 0.17 * path.stat().st_size
    assert _cosines(out.path, recipe, batches, reference).mean() >= 0.97


def test_minilm_int8_keeps_the_budget(minilm):
    """Plain static int8 on MiniLM: Q/DQ only where a quantized MatMul reads it and float residual paths, so
    the FFN down-projection's input range does not wreck accuracy (naive QDQ: mean cosine 0.930)."""
    recipe, path, batches, reference, root = minilm
    work = root / "work-int8"
    work.mkdir()
    calibration = [model_inputs(recipe, b) for b in load_batches(recipe, recipe.data.calibration, "calibration")[:4]]
    out = quantize_model(path, work / "int8.onnx", recipe.build.quantization, get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                         Precision.INT8, calibration, work, cache_dir=work / "cache")
    assert out.plan is not None and out.plan.float_consumers_skip_qdq and "MatMul" in out.plan.float_outputs
    ops = op_counts(out.path)
    assert ops["QuantizeLinear"] >= 36 and ops["DequantizeLinear"] >= 72
    tables = {i.name: i.data_type for i in onnx.load(str(out.path)).graph.initializer if i.name.endswith("embeddings.weight_quantized")}
    assert len(tables) == 3 and set(tables.values()) <= {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}  # word, position, type
    assert out.path.stat().st_size <= 0.3 * path.stat().st_size
    cosines = _cosines(out.path, recipe, batches, reference)
    assert cosines.mean() >= 0.99 and cosines.min() >= 0.97


#: Mean / min cosine to FP32 the floating-point formats keep on MiniLM (measured: see the closing note of issue 3).
#: (mean, min) cosine to FP32. mxfp8 and nvfp4 quantize activations too (W8A8, W4A4; measured 0.9955 / 0.9929 and
#: 0.9642 / 0.9239); mxfp4 is weight-only (W4A16: 0.9639 / 0.9441).
FLOAT_FORMAT_COSINE = {Precision.FP8: (0.995, 0.99), Precision.MXFP8: (0.993, 0.985), Precision.MXFP4: (0.96, 0.93), Precision.NVFP4: (0.955, 0.91)}


@pytest.mark.parametrize("precision", list(FLOAT_FORMAT_COSINE))
def test_minilm_float_formats_for_thor(minilm, precision):
    recipe, path, batches, reference, root = minilm
    work = root / f"work-{precision.value}"
    work.mkdir()
    calibration = [model_inputs(recipe, b) for b in load_batches(recipe, recipe.data.calibration, "calibration")[:4]]
    out = quantize_model(path, work / "model.onnx", recipe.build.quantization, get_target("jetson-agx-thor"), Backend.TENSORRT,
                         precision, calibration, work, cache_dir=work / "cache")
    ops = op_counts(out.path)
    written = out.details["format"]
    assert written["quantized_weights"] == 36  # every Linear of the six layers: Q, K, V, output, FFN up and down
    assert ops["DequantizeLinear"] >= 36 and ops["MatMul"] + ops["Gemm"] >= 36
    assert ops["QuantizeLinear"] == (written["quantized_activations"] if precision is Precision.FP8 else 0)
    # TensorRT's run-time activation quantizers, one per distinct MatMul input: the first LayerNorm's output (Q, K,
    # V), the attention context, the second LayerNorm's output and the GELU output, in each of the six layers.
    run_time = {Precision.MXFP8: "TRT_MXFP8DynamicQuantize", Precision.NVFP4: "TRT_FP4DynamicQuantize"}.get(precision)
    assert ops[run_time] == written["quantized_activations"] == 24 if run_time else written["quantized_activations"] in (0, 24)
    assert out.host_twin is not None
    twin_ops = op_counts(out.host_twin)  # weights decoded; only FP8's activation Q/DQ pairs remain
    assert twin_ops["DequantizeLinear"] == twin_ops["QuantizeLinear"] == ops["QuantizeLinear"]
    cosines = _cosines_at_basic(out.host_twin, recipe, batches, reference)
    mean, minimum = FLOAT_FORMAT_COSINE[precision]
    assert cosines.mean() >= mean and cosines.min() >= minimum


def _cosines_at_basic(path: Path, recipe, batches, reference) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = [session.run(None, model_inputs(recipe, b))[0] for b in batches]
    return np.concatenate([np.sum(g * r, 1) / np.linalg.norm(g, axis=1) / np.linalg.norm(r, axis=1) for g, r in zip(got, reference)])


def test_unquantized_precision_has_no_quantize_writer(minilm):
    recipe, path, _, _, root = minilm
    with pytest.raises(QuantizationError, match=r"precision bf16 has no quantization graph writer: it is not a quantized format"):
        quantize_model(path, root / "x.onnx", recipe.build.quantization, get_target("jetson-agx-thor"), Backend.TENSORRT, Precision.BF16, None, root)


@pytest.mark.parametrize("precision", [Precision.FP8, Precision.NVFP4])
def test_calibrated_float_formats_without_calibration_data_are_refused(minilm, precision):
    recipe, path, _, _, root = minilm
    with pytest.raises(QuantizationError, match=rf"{precision.value} needs calibration data for its activation scales") as caught:
        quantize_model(path, root / f"{precision.value}.onnx", recipe.build.quantization, get_target("jetson-agx-thor"), Backend.TENSORRT,
                       precision, None, root)
    assert caught.value.hint == "add data.calibration to the recipe (a callable or an npz_dir)"


def test_a_failed_embedding_pass_names_the_gathers_to_exclude(tmp_path, monkeypatch):
    import onnxruntime.quantization as ort_quantization
    from onnx import TensorProto, helper, numpy_helper

    from edgekit.quantize.ort.static_qdq import quantize_embedding_tables
    from edgekit.quantize.plan import make_plan
    from edgekit.recipe import QuantizationSpec

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="word_lookup")], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])], [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.ones((16, 8), np.float32), "table")],
    )
    path = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    plan = make_plan(QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8)

    def fail(*args, **kwargs):
        raise ValueError("unsupported table layout")

    monkeypatch.setattr(ort_quantization, "quantize_dynamic", fail)
    with pytest.raises(QuantizationError, match=r"int8 embedding tables of .*embed.onnx failed: ONNX Runtime's quantizer raised ValueError: unsupported table layout") as caught:
        quantize_embedding_tables(path, plan)
    assert caught.value.hint == "exclude the Gather nodes (word_lookup) with quantization.exclude_nodes"


def test_digits_auto_builds_every_int8_candidate(digits_bundles, tmp_path):
    """Every int8 candidate of the search is written and checked (none fails on the rewritten float stem),
    and the one chosen meets the recipe's budget."""
    result = build(DIGITS, "x86-64-cpu", precision="auto", out=tmp_path / "auto")
    search = result.manifest["quantization"]["auto"]
    errors = {c["name"]: c["detail"] for c in search["candidates"] if c["status"] == "error"}
    assert not errors, errors
    chosen = next(c for c in search["candidates"] if c["status"] == "chosen")
    assert chosen["passed"] and abs(result.manifest["accuracy"]["drop"]) <= 0.005
