"""Three small bundles of different shapes for the model-repository and Open Inference Protocol tests.

* ``digits``: the tiny digits classifier of :mod:`tests.runtime.agent_service.bundles` (the digits-cnn
  demo's interface: ``image`` float32[batch, 1, 8, 8] -> ``logits`` float32[batch, 10]);
* ``embedder``: a MiniLM-demo-shaped sentence embedder, ``input_ids`` and ``attention_mask``
  int64[batch, seq] -> ``sentence_embedding`` float32[batch, 8] (the masked mean of embedding rows);
* ``flat``: the digits weights on ``image`` float32[batch, 64];
* ``even``: the digits interface, failing at run time on odd batch sizes (its golden batches are even);
* ``slow``: ``x`` float32[batch, 256] through a chain of 256x256 MatMuls (``repeats`` of them): a model
  whose every request takes a while, to show it does not hold up the others.

Golden outputs come from numpy, so each self-check compares two independent computations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.runtime.agent_service.bundles import make_bundle
from tests.runtime.tiny_bundle import ATOL, MIN_COSINE, OPSET, RTOL, write_manifest

VOCAB, WIDTH, SEQ = 50, 8, 6


def embedding_table() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((VOCAB, WIDTH)).astype(np.float32)


def reference_embedding(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    rows = embedding_table().astype(np.float64)[input_ids]
    mask = attention_mask.astype(np.float64)[..., None]
    return ((rows * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)).astype(np.float32)


def slow_weight() -> np.ndarray:
    """An orthogonal matrix: values keep their size through any number of MatMuls."""
    q, _ = np.linalg.qr(np.random.default_rng(13).standard_normal((256, 256)))
    return q.astype(np.float32)


def reference_slow(x: np.ndarray, repeats: int) -> np.ndarray:
    value, weight = x.astype(np.float64), slow_weight().astype(np.float64)
    for _ in range(repeats):
        value = value @ weight
    return value.astype(np.float32)


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _write_embedder(path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
            helper.make_node("Mul", ["rows", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "seq_axis"], ["total"], keepdims=0),
            helper.make_node("ReduceSum", ["mask", "seq_axis"], ["count"], keepdims=1),
            helper.make_node("Max", ["count", "one"], ["safe_count"]),
            helper.make_node("Div", ["total", "safe_count"], ["sentence_embedding"]),
        ],
        "tiny_embedder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(embedding_table(), "table"),
                     numpy_helper.from_array(np.array([2], np.int64), "last"),
                     numpy_helper.from_array(np.array([1], np.int64), "seq_axis"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )  # fmt: skip
    _save(graph, path)


def _write_slow(path: Path, repeats: int) -> None:
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "weight"], ["y" if i == repeats - 1 else f"h{i + 1}"])
             for i in range(repeats)]  # fmt: skip
    graph = helper.make_graph(
        nodes, "slow_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
        initializer=[numpy_helper.from_array(slow_weight(), "weight")],
    )  # fmt: skip
    _save(graph, path)


def embedder_inputs(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (batch, SEQ), dtype=np.int64)
    mask = np.ones((batch, SEQ), np.int64)
    mask[:, SEQ - 1 - (np.arange(batch) % 3)] = 0  # some padding
    return {"input_ids": ids, "attention_mask": mask}


def _manifest(name: str, io: dict[str, Any], batches: list[dict[str, str]], bundle_version: int | None) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "created": "2025-01-01T00:00:00+00:00",
        "recipe": {"path": f"recipes/{name}.yaml", "sha256": "0" * 64, "name": name},
        "target": {"name": "x86-64-cpu"},
        "backend": {"name": "onnxruntime", "execution_providers": [{"name": "CPUExecutionProvider", "options": {}}],
                    "graph_optimization": "basic", "intra_op_threads": 1},  # fmt: skip
        "precision": "fp32",
        "model": {"path": "model.onnx", "external_data": None, "opset": OPSET, "size_bytes": 0},
        "io": io,
        "golden": {"batches": batches, "atol": ATOL, "rtol": RTOL, "min_cosine": MIN_COSINE},
    }
    if bundle_version is not None:
        manifest["bundle_version"] = bundle_version
    return manifest


def make_model_bundle(root: Path, kind: str, *, name: str | None = None, corrupt_golden: bool = False,
                      bundle_version: int | None = None, repeats: int = 48) -> Path:  # fmt: skip
    """A bundle of ``kind`` (digits, embedder, flat, slow) at ``root``, named ``name`` (default: the kind)."""
    name = name or kind
    if kind in ("digits", "flat", "even"):  # even: the digits interface, failing on odd batches at run time
        model = {"digits": "linear", "flat": "flat_input", "even": "even_batches"}[kind]
        return make_bundle(root, name=name, model=model, corrupt_golden=corrupt_golden, bundle_version=bundle_version)
    root.mkdir(parents=True)
    (root / "golden").mkdir()
    shift = np.float32(1.0 if corrupt_golden else 0.0)
    batches = []
    for index, size in enumerate((2, 3)):
        if kind == "embedder":
            _write_embedder(root / "model.onnx")
            inputs = embedder_inputs(size, seed=index)
            outputs = {"sentence_embedding": reference_embedding(**inputs) + shift}
            io = {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]},
                             {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "seq"]}],
                  "outputs": [{"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", WIDTH]}],
                  "dims": {"batch": {"min": 1, "opt": 4, "max": 64}, "seq": {"min": 1, "opt": SEQ, "max": 128}}}  # fmt: skip
        elif kind == "slow":
            _write_slow(root / "model.onnx", repeats)
            inputs = {"x": np.random.default_rng(index).standard_normal((size, 256)).astype(np.float32)}
            outputs = {"y": reference_slow(inputs["x"], repeats) + shift}
            io = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 256]}],
                  "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 256]}],
                  "dims": {"batch": {"min": 1, "opt": 1, "max": 64}}}  # fmt: skip
        else:
            raise ValueError(f"unknown bundle kind {kind!r}")
        np.savez(root / f"golden/inputs_{index:03d}.npz", **inputs)
        np.savez(root / f"golden/outputs_{index:03d}.npz", **outputs)
        batches.append({"inputs": f"golden/inputs_{index:03d}.npz", "outputs": f"golden/outputs_{index:03d}.npz"})
    manifest = _manifest(name, io, batches, bundle_version)
    if kind == "slow":  # a long chain of float32 MatMuls drifts from the float64 reference
        manifest["golden"]["atol"] = 0.05
    write_manifest(root, manifest)
    return root


@contextmanager
def serving_models(agent_config: Callable[..., Path], folder: Path, signing_key: Path, models: list[str],
                   **config: Any) -> Iterator[Any]:  # fmt: skip
    """A real agent serving a model repository of ``models`` (kinds of :func:`make_model_bundle`, the first the
    default), each bundle signed and installed with ``edgekit-agent install``; ``config`` goes to ``agent_config``."""
    from edgekit.bundle.signing import sign_bundle
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.service import AgentService

    path = agent_config(models={"names": models, "default": models[0]}, **config)
    for kind in models:
        bundle = make_model_bundle(folder / "src" / kind, kind)
        sign_bundle(bundle, signing_key)
        assert agent_main(["install", str(bundle), "--config", str(path), "--model", kind]) == 0
    with AgentService(load_config(path)) as service:
        yield service


@contextmanager
def oip_clients(service: Any) -> Iterator[tuple[Any, Any]]:
    """Triton's HTTP and gRPC clients (tritonclient) for a running agent with ``api.grpc.listen`` set; closed after."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(url=service.api_address)
    rpc = grpcclient.InferenceServerClient(url=service.grpc.bound_address)
    try:
        yield http, rpc
    finally:
        http.close()
        rpc.close()
