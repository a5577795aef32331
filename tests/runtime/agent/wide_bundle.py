"""A bundle whose input is big enough that a 60 MB JSON request is within what it can need:
``image`` float32[batch, 3, 640, 640] (batch 1..2: 2,457,600 values, 78.7 MB as JSON at 32 bytes a
value) -> ReduceMean over the last three axes -> ``mean`` float32[batch]. Golden outputs from numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.runtime.tiny_bundle import OPSET, write_manifest

SHAPE = (3, 640, 640)
MAX_BATCH = 2


def write_wide_bundle(root: Path, name: str = "wide-mean") -> Path:
    root.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image", "axes"], ["mean"], keepdims=0)],
        "wide_mean",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *SHAPE])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch"])],
        initializer=[numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(root / "model.onnx"))
    (root / "golden").mkdir()
    image = np.random.default_rng(3).standard_normal((1, *SHAPE)).astype(np.float32)
    np.savez(root / "golden/inputs_000.npz", image=image)
    np.savez(root / "golden/outputs_000.npz", mean=image.astype(np.float64).mean(axis=(1, 2, 3)).astype(np.float32))
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "created": "2025-01-01T00:00:00+00:00",
        "recipe": {"path": "recipes/wide.yaml", "sha256": "0" * 64, "name": name},
        "target": {"name": "x86-64-cpu"},
        "backend": {"name": "onnxruntime", "execution_providers": [{"name": "CPUExecutionProvider", "options": {}}],
                    "graph_optimization": "basic", "intra_op_threads": 1},  # fmt: skip
        "precision": "fp32",
        "model": {"path": "model.onnx", "external_data": None, "opset": OPSET, "size_bytes": (root / "model.onnx").stat().st_size},
        "io": {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", *SHAPE]}],
               "outputs": [{"name": "mean", "dtype": "float32", "shape": ["batch"]}],
               "dims": {"batch": {"min": 1, "opt": 1, "max": MAX_BATCH}}},  # fmt: skip
        "golden": {"batches": [{"inputs": "golden/inputs_000.npz", "outputs": "golden/outputs_000.npz"}],
                   "atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.999},  # fmt: skip
    }
    write_manifest(root, manifest)
    return root
