"""An assumed precision rescales an FP32 graph only (review: ``--precision fp16`` on an FP16 graph halved its bytes
again and said "graph stored as FP32")."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.estimate.estimate import estimate
from edgekit.estimate.graph_cost import EstimateError
from edgekit.target import get_target
from tests.estimate.graphs import mlp


def _relu(dtype: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", dtype, [1 << 20])], [helper.make_tensor_value_info("y", dtype, [1 << 20])])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_graph_already_at_the_precision_is_timed_as_stored() -> None:
    target = get_target("raspberry-pi-5")
    stored = estimate(_relu(TensorProto.FLOAT16), target)
    again = estimate(_relu(TensorProto.FLOAT16), target, assume_precision="fp16")
    assert again.p50_ms == stored.p50_ms
    assert again.by_class["elementwise"]["bytes"] == 2 * 2 * (1 << 20)  # 1 Mi fp16 values read and written
    assert "graph already stored as fp16: timed as stored (fp16 asked; no bytes scaled)" in again.factors
    assert not any("stored as FP32" in f for f in again.factors)


def test_a_graph_at_another_precision_cannot_be_rescaled() -> None:
    with pytest.raises(EstimateError, match=r"^cannot time a graph stored as fp16 as int8: an assumed precision rescales an FP32 graph's bytes") as caught:
        estimate(_relu(TensorProto.FLOAT16), get_target("raspberry-pi-5"), assume_precision="int8")
    assert "drop --precision" in caught.value.hint


def test_an_fp32_graph_is_still_rescaled() -> None:
    target = get_target("raspberry-pi-5")
    stored = estimate(mlp(64), target, dims={"batch": 4})
    half = estimate(mlp(64), target, dims={"batch": 4}, assume_precision="fp16")
    assert half.by_class["matmul"]["bytes"] == stored.by_class["matmul"]["bytes"] / 2
    assert "graph stored as FP32, timed as fp16: compute classes at the fp16 peak, bytes x0.5" in half.factors


def test_a_dim_or_batch_below_one_is_refused() -> None:
    with pytest.raises(EstimateError, match=r"^dims must be >= 1: batch=0"):
        estimate(mlp(64), get_target("raspberry-pi-5"), dims={"batch": 0})
    with pytest.raises(EstimateError, match=r"^dims must be >= 1: batch=0"):
        estimate(mlp(64), get_target("raspberry-pi-5"), dims={"batch": 2}, batch=0)
