"""ONNX Runtime's QDQ quantizer raising a raw NumPy error at one node (issue 29: a file-type classifier on byte
features, integer inputs and an embedding table): the error names the node, and int8 is written around it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgekit.pipeline import build
from edgekit.quantize.ort.static_qdq import QuantizerNodeError, write_static_qdq
from edgekit.quantize.plan import QuantizationPlan
from edgekit.precision import Backend, Precision

NUMPY_ERROR = "The truth value of an array with more than one element is ambiguous"


def byte_classifier() -> onnx.ModelProto:
    """``ids, mask [batch, seq] int64`` -> Gather(embedding) * mask -> MatMul ``fc1`` -> Relu -> mean -> Gemm ``fc2``
    with a 2-D bias ``[1, 4]`` (as Keras converters write it): ONNX Runtime's int32-bias check indexes the bias per
    channel and compares a whole row, so its quantizer raises NumPy's 'truth value is ambiguous' at ``fc2``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (50, 16)).astype(np.float32), "embedding"),
             numpy_helper.from_array(rng.normal(0, 0.3, (16, 8)).astype(np.float32), "fc1.w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 4)).astype(np.float32), "fc2.w"),
             numpy_helper.from_array(rng.normal(0, 0.1, (1, 4)).astype(np.float32), "fc2.b"),
             numpy_helper.from_array(np.array([2], np.int64), "last_axis")]
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["e"], name="embed"),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Unsqueeze", ["m", "last_axis"], ["m3"], name="unsqueeze"),
             helper.make_node("Mul", ["e", "m3"], ["masked"], name="masked"),
             helper.make_node("MatMul", ["masked", "fc1.w"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r"], ["pooled"], axes=[1], keepdims=0, name="pool"),
             helper.make_node("Gemm", ["pooled", "fc2.w", "fc2.b"], ["logits"], name="fc2")]
    graph = helper.make_graph(nodes, "byte_classifier",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                               helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def byte_batches(count: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"ids": rng.integers(0, 50, (2, 6)).astype(np.int64), "mask": (rng.uniform(size=(2, 6)) > 0.2).astype(np.int64)}
            for _ in range(count)]


RECIPE = """\
name: bytes
model: {kind: onnx, path: bytes.onnx}
inputs:
  - {name: ids, dtype: int64, shape: [batch, seq]}
  - {name: mask, dtype: int64, shape: [batch, seq]}
outputs: [logits]
dims:
  batch: {min: 1, opt: 2, max: 4}
  seq: {min: 1, opt: 6, max: 12}
data:
  samples: {callable: "tests.quantize.ort.test_quantizer_node_failures:byte_batches"}
  calibration: {callable: "tests.quantize.ort.test_quantizer_node_failures:byte_batches"}
  evaluation: {callable: "tests.quantize.ort.test_quantizer_node_failures:byte_batches"}
evaluation:
  metric: cosine
  budget: {min_value: 0.9}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


def _recipe(directory: Path) -> Path:
    onnx.save(byte_classifier(), str(directory / "bytes.onnx"))
    (directory / "bytes.yaml").write_text(textwrap.dedent(RECIPE))
    return directory / "bytes.yaml"


class _Range:
    def __init__(self, low: float, high: float) -> None:
        self.min, self.max = low, high


def test_the_quantizer_error_names_the_node(tmp_path: Path) -> None:
    path = tmp_path / "bytes.onnx"
    onnx.save(byte_classifier(), str(path))
    plan = QuantizationPlan(Precision.INT8, Backend.ONNXRUNTIME, "uint8", False, "int8", True, "minmax")
    ranges = {name: _Range(-2.0, 2.0) for name in ("masked", "h", "r", "pooled", "logits")}
    with pytest.raises(QuantizerNodeError) as caught:
        write_static_qdq(path, tmp_path / "out.onnx", plan, ranges)
    assert caught.value.node == "fc2"
    assert f"failed at Gemm node 'fc2' inside ONNX Runtime's quantizer: ValueError: {NUMPY_ERROR}" in caught.value.message
    assert caught.value.hint == "keep the node float: quantization.exclude_nodes: [fc2]"


def test_int8_is_written_around_the_node_and_the_manifest_says_why(tmp_path: Path) -> None:
    manifest = build(_recipe(tmp_path), "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    excluded = manifest["quantization"]["plan"]["excluded"]
    assert list(excluded) == ["fc2"] and NUMPY_ERROR in excluded["fc2"]
    ops = [node.op_type for node in onnx.load(str(tmp_path / "bundle" / "model.onnx")).graph.node]
    assert "DequantizeLinear" in ops and "Gemm" in ops  # fc1 is int8, fc2 float
    assert manifest["accuracy"]["value"] > 0.99


def _ort_only_x86(directory: Path) -> Path:
    """x86-64-cpu without its openvino backend: ONNX Runtime's candidates only. On the full profile OpenVINO's compiles
    spend this toy model's 0.1 s budget (every candidate spends it) and ONNX Runtime's default plan is skipped for time."""
    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "targets" / "x86-64-cpu.yaml").read_text())
    data["name"] = "x86-ort-only"
    data["backends"] = [backend for backend in data["backends"] if backend["name"] != "openvino"]
    path = directory / "x86-ort-only.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_auto_does_not_call_a_candidate_failed_that_the_plain_build_writes(tmp_path: Path) -> None:
    manifest = build(_recipe(tmp_path), str(_ort_only_x86(tmp_path)), precision="auto", out=tmp_path / "bundle").manifest
    rows = {row["name"]: row for row in manifest["quantization"]["auto"]["candidates"]}
    assert rows["int8-static"]["status"] != "error", json.dumps(rows["int8-static"])
    assert "at node 'fc2'" in rows["int8-ort-default"]["detail"]  # ONNX Runtime's own quantize_static: it fails, and says where
