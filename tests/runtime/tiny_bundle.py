"""A tiny real bundle for the runtime tests: a linear digits classifier written with onnx.helper.

``image`` float32[batch, 1, 8, 8] -> Flatten -> MatMul(64x10) -> Add -> ``logits`` float32[batch, 10];
golden outputs come from numpy, so the self-check compares two independent computations.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
ATOL = 1e-4
RTOL = 1e-3
MIN_COSINE = 0.999


def linear_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((64, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32)


def reference_logits(image: np.ndarray) -> np.ndarray:
    weight, bias = linear_weights()
    flat = image.reshape(image.shape[0], -1).astype(np.float64)
    return (flat @ weight.astype(np.float64) + bias).astype(np.float32)


def write_linear_model(path: Path) -> Path:
    weight, bias = linear_weights()
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "weight"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["logits"]),
        ],
        "linear_digits",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def io_section() -> dict[str, Any]:
    return {
        "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
        "dims": {"batch": {"min": 1, "opt": 4, "max": 128}},
    }


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Hash every file under ``root`` into ``files`` and write manifest.json (as the host does)."""
    manifest["files"] = {
        path.relative_to(root).as_posix(): sha256_of(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != "manifest.json"
    }
    manifest["model"]["sha256"] = manifest["files"][manifest["model"]["path"]]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


def build_bundle(root: Path, *, batches: int = 2, backend: str = "onnxruntime", execution_providers: list[Any] | None = None) -> Path:
    """Write a complete, consistent bundle directory following docs/bundle-format.md."""
    root.mkdir(parents=True, exist_ok=True)
    write_linear_model(root / "model.onnx")
    (root / "report.html").write_text("<html><body>tiny</body></html>", encoding="utf-8")
    (root / "golden").mkdir()
    rng = np.random.default_rng(11)
    golden_batches = []
    for index in range(batches):
        image = rng.standard_normal((index + 2, 1, 8, 8)).astype(np.float32)
        np.savez(root / f"golden/inputs_{index:03d}.npz", image=image)
        np.savez(root / f"golden/outputs_{index:03d}.npz", logits=reference_logits(image))
        golden_batches.append(
            {"inputs": f"golden/inputs_{index:03d}.npz", "outputs": f"golden/outputs_{index:03d}.npz"}
        )
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "name": "tiny-linear-x86-64-cpu-fp32",
        "created": "2025-01-01T00:00:00+00:00",
        "recipe": {"path": "recipes/tiny.yaml", "sha256": "0" * 64, "name": "tiny-linear"},
        "target": {"name": "x86-64-cpu", "cpu": {"cores": 2}},
        "backend": {
            "name": backend,
            "execution_providers": execution_providers or [{"name": "CPUExecutionProvider", "options": {}}],
            "graph_optimization": "extended",
            "intra_op_threads": 1,
        },
        "precision": "fp32",
        "model": {"path": "model.onnx", "external_data": None, "opset": OPSET, "size_bytes": 0},
        "io": io_section(),
        "toolchain": {"python": "3.11", "onnxruntime": "1.31.1", "torch": None},
        "export": {"exporter": "none", "opset": OPSET, "seconds": 0.0, "parity": None},
        "accuracy": None,
        "benchmark": {},
        "golden": {"batches": golden_batches, "atol": ATOL, "rtol": RTOL, "min_cosine": MIN_COSINE},
        "stages": [],
    }
    if backend == "openvino":  # what edgekit.engines.openvino records
        manifest["backend"]["openvino"] = {"device": "CPU", "inference_precision_hint": "f32", "shapes": "dynamic"}
    manifest["model"]["size_bytes"] = (root / "model.onnx").stat().st_size
    write_manifest(root, manifest)
    return root


def load_manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "manifest.json").read_text(encoding="utf-8"))


def save_manifest(root: Path, manifest: dict[str, Any]) -> None:
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
