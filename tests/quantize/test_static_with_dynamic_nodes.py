"""A static int8 plan with some convolutions run dynamic int8 (auto's int8-static+dynamic ladder) on a
mobilenet-like CNN: 1x1 expand/reduce convolutions, a depthwise 3x3 and a residual Add. The dynamic writer
runs over the static QDQ model, so a dynamic node reads a DequantizeLinear output that other nodes read too,
and a narrow 1x1 convolution left float for the dynamic pass looks like a stem to the channels-last rewrite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.builder import unquantized_nodes
from edgekit.quantize.ort.static_plan import static_int8_plan
from edgekit.quantize.plan import make_plan
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target
from tests.quantize.test_cnn_int8 import _conv


def mobilenet_like(path: Path) -> Path:
    """stem 3x3 -> Relu -> reduce0 1x1 (x) -> expand1 1x1 (8 -> 24, a reduction of 8) -> Relu -> depthwise 3x3
    -> Relu -> reduce1 1x1 -> Add(x) -> head 1x1 -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(7)
    inits: list = []
    nodes = [
        _conv(rng, "stem", 3, 16, 3, inits, "image", "s"),
        helper.make_node("Relu", ["s"], ["s_relu"], name="stem_relu"),
        _conv(rng, "reduce0", 16, 8, 1, inits, "s_relu", "x"),
        _conv(rng, "expand1", 8, 24, 1, inits, "x", "e"),
        helper.make_node("Relu", ["e"], ["e_relu"], name="expand1_relu"),
        _conv(rng, "depthwise1", 24, 24, 3, inits, "e_relu", "d", group=24),
        helper.make_node("Relu", ["d"], ["d_relu"], name="depthwise1_relu"),
        _conv(rng, "reduce1", 24, 8, 1, inits, "d_relu", "r"),
        helper.make_node("Add", ["x", "r"], ["res"], name="residual1"),
        _conv(rng, "head", 8, 32, 1, inits, "res", "h"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="head_relu"),
        helper.make_node("GlobalAveragePool", ["h_relu"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
    ]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (10, 32)).astype(np.float32), "classifier_w"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "classifier_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "classifier_w", "classifier_b"], ["logits"], name="classifier", transB=1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _batches(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(8)
    return [{"image": rng.normal(0, 1, (8, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]


@pytest.mark.parametrize("dynamic", [("expand1",), ("reduce0", "expand1"), ("expand1", "reduce1", "head")])
def test_dynamic_convolutions_inside_a_static_plan_write_a_valid_model(tmp_path, dynamic):
    fp32 = mobilenet_like(tmp_path / "fp32.onnx")
    spec, target = QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu")
    plan = static_int8_plan(make_plan(spec, target, Backend.ONNXRUNTIME, Precision.INT8), fp32)
    plan = replace(plan, dynamic_nodes=dynamic)
    out = tmp_path / "mixed.onnx"
    quantize_model(fp32, out, spec, target, Backend.ONNXRUNTIME, Precision.INT8, _batches(), tmp_path, plan=plan, cache_dir=tmp_path / "cache")
    onnx.checker.check_model(str(out), full_check=True)
    assert unquantized_nodes(out, plan) == []
    nodes = onnx.load(str(out)).graph.node
    ops = {node.name: node.op_type for node in nodes}
    assert all(ops.get(f"{name}_quant") == "ConvInteger" for name in dynamic), ops
    assert sum(node.op_type == "DynamicQuantizeLinear" for node in nodes) == len(dynamic)  # one per input, no more
    feeds = {"image": _batches(1)[0]["image"][:4]}
    got, want = _run(out, feeds), _run(fp32, feeds)
    cosine = float(np.sum(got * want) / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.98
