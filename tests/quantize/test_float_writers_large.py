"""The float-format writers and the host twin on models past protobuf's 2 GiB limit, at a lowered stand-in limit.

``EXTERNAL_DATA_BYTES`` is lowered to a few KB and ONNX's in-memory entry points (the checker, shape inference,
``onnx.save`` without external data) are made to refuse any message over it, as the real ones refuse one over 2 GiB.
The writer must save first (external data) and check the file by its path; the twin must write its decoded FP32
weights as external data, never building the whole proto in memory. Outputs must match a normal (small) build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize import float_writers
from edgekit.quantize.plan import make_plan
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target

LIMIT = 12_000  # the stand-in for protobuf's 2 GiB


def _inline_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


@pytest.fixture
def protobuf_limit(monkeypatch):
    """ONNX's in-memory calls refuse a message over LIMIT, as protobuf refuses one over 2 GiB."""
    real_check, real_infer, real_save = onnx.checker.check_model, onnx.shape_inference.infer_shapes, onnx.save

    def refuse(model, what):
        if isinstance(model, onnx.ModelProto) and _inline_bytes(model) > LIMIT:
            raise ValueError(f"{what}: Message onnx.ModelProto exceeds maximum protobuf size of 2GB (stand-in: {LIMIT} bytes)")

    def check_model(model, *args, **kwargs):
        refuse(model, "check_model")
        return real_check(model, *args, **kwargs)

    def infer_shapes(model, *args, **kwargs):
        refuse(model, "infer_shapes")
        return real_infer(model, *args, **kwargs)

    def save(model, f, *args, **kwargs):
        if not kwargs.get("save_as_external_data"):
            refuse(model, "onnx.save")
        return real_save(model, f, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", check_model)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", infer_shapes)
    monkeypatch.setattr(onnx, "save", save)
    monkeypatch.setattr(float_writers, "EXTERNAL_DATA_BYTES", LIMIT, raising=False)


def _model(directory: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, float]]:
    """A float embedding table (kept float: the written model is over the limit on its own) added to ``x``, then
    MatMul (64x64) -> Relu -> MatMul (64x32). Saved with external data, as any model over 2 GiB is."""
    rng = np.random.default_rng(0)
    weights = {"emb": rng.normal(size=(64, 64)).astype(np.float32), "W1": rng.normal(size=(64, 64)).astype(np.float32),
               "W2": rng.normal(size=(64, 32)).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather"), helper.make_node("Add", ["x", "e"], ["a"], name="add"),
         helper.make_node("MatMul", ["a", "W1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")],
        "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]), helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fp32.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="fp32.onnx.data", size_threshold=1024)
    feeds = {"x": rng.normal(size=(4, 64)).astype(np.float32), "ids": np.array([0, 5, 9, 63], np.int64)}
    a = feeds["x"] + weights["emb"][feeds["ids"]]
    amax = {"a": float(np.abs(a).max()), "r": float(np.maximum(a @ weights["W1"], 0).max())}
    return path, feeds, amax


def _build(directory: Path, precision: Precision) -> tuple[Path, Path, dict[str, np.ndarray]]:
    path, feeds, amax = _model(directory)
    plan = make_plan(QuantizationSpec(), get_target("jetson-agx-thor"), Backend.TENSORRT, precision)
    out = directory / "model.onnx"
    result = float_writers.write_float_format(path, out, plan, amax)
    assert set(result.weights) == {"W1", "W2"}
    twin = float_writers.fold_weight_dequantize(out, directory / "model.host-twin.onnx")
    return out, twin, feeds


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("precision", [Precision.FP8, Precision.MXFP8, Precision.MXFP4, Precision.NVFP4], ids=lambda p: p.value)
def test_writer_and_twin_past_the_protobuf_limit_use_external_data(tmp_path, precision, request):
    small_out, small_twin, feeds = _build(tmp_path / "small", precision)  # the normal build, under the real limit
    assert not Path(str(small_twin) + ".data").exists()
    expected = _run(small_twin, feeds)

    request.getfixturevalue("protobuf_limit")
    out, twin, _ = _build(tmp_path / "large", precision)

    assert Path(str(out) + ".data").is_file(), "the written model over the limit keeps its tensors in model.onnx.data"
    assert Path(str(twin) + ".data").is_file(), "the twin over the limit keeps its FP32 weights in its own .data file"
    assert twin.stat().st_size < LIMIT
    twin_graph = onnx.load(str(twin), load_external_data=False)
    external = {t.name for t in twin_graph.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert {"W1_dq", "W2_dq"} <= external and "emb" in external
    assert not any(n.op_type == "DequantizeLinear" and n.input[0].startswith("W") for n in twin_graph.graph.node)
    np.testing.assert_array_equal(_run(twin, feeds), expected)  # bit-identical to the in-memory twin
    written = onnx.load(str(out), load_external_data=True)
    reference = onnx.load(str(small_out), load_external_data=True)
    assert {t.name: t.raw_data for t in written.graph.initializer} == {t.name: t.raw_data for t in reference.graph.initializer}
