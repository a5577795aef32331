"""Bundles for the agent tests, built from tests/runtime/tiny_bundle.py's pieces.

``make_bundle`` writes a complete bundle (per docs/bundle-format.md) with its own name, so that two
of them are two versions; ``model="even_batches"`` builds a model that fails at run time on odd
batch sizes (its golden batches are even, so it passes the self-check and fails only on live
traffic); ``model="flat_input"`` takes ``image`` as float32[batch, 64] (another served signature);
``corrupt_golden=True`` stores wrong golden outputs, so the self-check fails; ``bundle_version``
is written into the manifest when given.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.runtime.tiny_bundle import ATOL, MIN_COSINE, OPSET, RTOL, io_section, linear_weights, reference_logits, write_linear_model, write_manifest


def write_even_batch_model(path: Path) -> Path:
    """``image`` -> Reshape [2, -1, 64] (fails unless batch is even) -> Reshape [-1, 64] -> linear."""
    weight, bias = linear_weights()
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["image", "pairs_shape"], ["pairs"]),
            helper.make_node("Reshape", ["pairs", "flat_shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "weight"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["logits"]),
        ],
        "even_batches",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[
            numpy_helper.from_array(weight, "weight"),
            numpy_helper.from_array(bias, "bias"),
            numpy_helper.from_array(np.array([2, -1, 64], dtype=np.int64), "pairs_shape"),
            numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "flat_shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def write_flat_input_model(path: Path) -> Path:
    """``image`` float32[batch, 64] -> linear: the same numbers as the linear model, another signature."""
    weight, bias = linear_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["image", "weight"], ["product"]), helper.make_node("Add", ["product", "bias"], ["logits"])],
        "flat_input",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


MODEL_WRITERS = {"linear": write_linear_model, "even_batches": write_even_batch_model, "flat_input": write_flat_input_model}


def make_bundle(
    root: Path,
    *,
    name: str = "tiny-a",
    model: str = "linear",
    golden_batch_sizes: tuple[int, ...] = (2, 4),
    corrupt_golden: bool = False,
    bundle_version: int | None = None,
) -> Path:
    root.mkdir(parents=True)
    MODEL_WRITERS[model](root / "model.onnx")
    (root / "golden").mkdir()
    rng = np.random.default_rng(5)
    batches = []
    for index, size in enumerate(golden_batch_sizes):
        image = rng.standard_normal((size, 64) if model == "flat_input" else (size, 1, 8, 8)).astype(np.float32)
        logits = reference_logits(image) + (np.float32(1.0) if corrupt_golden else np.float32(0.0))
        np.savez(root / f"golden/inputs_{index:03d}.npz", image=image)
        np.savez(root / f"golden/outputs_{index:03d}.npz", logits=logits)
        batches.append({"inputs": f"golden/inputs_{index:03d}.npz", "outputs": f"golden/outputs_{index:03d}.npz"})
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "created": "2025-01-01T00:00:00+00:00",
        "recipe": {"path": "recipes/tiny.yaml", "sha256": "0" * 64, "name": name},
        "target": {"name": "x86-64-cpu"},
        "backend": {"name": "onnxruntime", "execution_providers": [{"name": "CPUExecutionProvider", "options": {}}],
                    "graph_optimization": "basic", "intra_op_threads": 1},  # fmt: skip
        "precision": "fp32",
        "model": {"path": "model.onnx", "external_data": None, "opset": OPSET, "size_bytes": 0},
        "io": io_section(),
        "golden": {"batches": batches, "atol": ATOL, "rtol": RTOL, "min_cosine": MIN_COSINE},
    }
    if model == "flat_input":
        manifest["io"]["inputs"][0]["shape"] = ["batch", 64]
    if bundle_version is not None:
        manifest["bundle_version"] = bundle_version
    write_manifest(root, manifest)
    return root


def pack_tar(bundle_dir: Path, out: Path, *, top: str | None = "bundle") -> Path:
    """A tar of the bundle (manifest.sig included) under one top folder, as ``edgekit pack`` lays it out."""
    with tarfile.open(out, "w") as tar:
        for path in sorted(bundle_dir.rglob("*")):
            relative = path.relative_to(bundle_dir).as_posix()
            tar.add(path, arcname=f"{top}/{relative}" if top else relative, recursive=False)
    return out


def tar_with_member(out: Path, name: str, data: bytes = b"x", *, symlink_to: str | None = None) -> Path:
    with tarfile.open(out, "w") as tar:
        info = tarfile.TarInfo(name)
        if symlink_to is not None:
            info.type, info.linkname = tarfile.SYMTYPE, symlink_to
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out
