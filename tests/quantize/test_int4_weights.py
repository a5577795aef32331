"""int4 weight-only on graphs from other exporters: tied layers (two Gemm nodes sharing one weight, one of them
transposed) and the recipe's ``quantization.exclude_op_types`` (before, int4 ignored it and quantized every
MatMul and Gemm; tied Gemm weights stopped the build with onnx's bare ValidationError)."""

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

K = 64


def _model(path: Path) -> Path:
    """Gemm(W, transB) -> Relu -> Gemm(W, not transposed) -> MatMul(V): W is tied; V is a plain MatMul weight."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "W"], ["a"], name="g1", transB=1),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "W"], ["b"], name="g2"),
             helper.make_node("MatMul", ["b", "V"], ["y"], name="mm")]  # fmt: skip
    inits = [numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32) * 0.1, "W"),
             numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32) * 0.1, "V")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", K])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _int4(src: Path, tmp_path: Path, spec: QuantizationSpec) -> tuple[Path, collections.Counter[str]]:
    out = tmp_path / "int4.onnx"
    result = quantize_model(src, out, spec, get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT4, None, tmp_path)
    return result.path, collections.Counter(n.op_type for n in onnx.load(str(result.path)).graph.node)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_tied_gemm_weights_are_quantized_once_per_layout(tmp_path: Path) -> None:
    src = _model(tmp_path / "fp32.onnx")
    path, ops = _int4(src, tmp_path, QuantizationSpec())
    assert ops["MatMulNBits"] == 3 and ops["Gemm"] == 0 and ops["MatMul"] == 0, ops
    x = np.random.default_rng(1).standard_normal((4, K)).astype(np.float32)
    want, got = _run(src, x), _run(path, x)
    assert float(np.sum(want * got) / np.linalg.norm(want) / np.linalg.norm(got)) > 0.98


@pytest.mark.parametrize(("excluded", "float_ops"), [(("Gemm",), {"Gemm": 2}), (("MatMul",), {"MatMul": 1})])
def test_exclude_op_types_keeps_those_ops_float(tmp_path: Path, excluded: tuple[str, ...], float_ops: dict[str, int]) -> None:
    src = _model(tmp_path / "fp32.onnx")
    _, ops = _int4(src, tmp_path, QuantizationSpec(exclude_op_types=excluded))
    assert {op: ops[op] for op in float_ops} == float_ops, ops
    assert ops["MatMulNBits"] == 3 - sum(float_ops.values()), ops


def test_excluding_both_op_types_quantizes_nothing_and_says_so(tmp_path: Path) -> None:
    src = _model(tmp_path / "fp32.onnx")
    with pytest.raises(QuantizationError, match="int4 weight-only found no MatMul/Gemm/Gather weights to quantize"):
        _int4(src, tmp_path, QuantizationSpec(exclude_op_types=("MatMul", "Gemm")))
