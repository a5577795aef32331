"""A tiny MatMul -> Relu -> MatMul model and calibration batches, built in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

WEIGHT_SEED = 20


def weights(seed: int = WEIGHT_SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, (4, 5)).astype(np.float32), rng.normal(0.0, 1.0, (5, 3)).astype(np.float32)


def mlp_model(seed: int = WEIGHT_SEED) -> onnx.ModelProto:
    """``y = relu(x @ w1) @ w2`` with the hidden tensors named ``hidden`` (pre-Relu) and ``activated``."""
    w1, w2 = weights(seed)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["hidden"], name="fc1"),
            helper.make_node("Relu", ["hidden"], ["activated"], name="relu"),
            helper.make_node("MatMul", ["activated", "w2"], ["y"], name="fc2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(path))
    return path


@pytest.fixture
def mlp_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(21)
    return [{"x": rng.normal(0.0, scale, (6, 4)).astype(np.float32), "labels": np.arange(6)} for scale in (1.0, 2.0, 0.5)]
