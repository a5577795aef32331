"""A tiny text classifier with string tensors at both ends, for BYTES serving and string golden files.

The graph (``ai.onnx.ml`` operators, which ONNX Runtime runs on numpy object arrays of ``str``):
``text`` (string ``[batch]``, one word each) -> CategoryMapper (word -> id, unknown words -> the last id)
-> Gather from an embedding ``[words + 1, 4]`` -> MatMul + Add -> ``logits`` (float32 ``[batch, 3]``)
-> ArgMax -> LabelEncoder (id -> name) -> ``label`` (string ``[batch]``). Its weights are fixed so each
known word lands on its own class: ``apple``, ``pear``, ... are ``fruit``; ``oak``, ``pine``, ...
``tree``; ``cat``, ``dog``, ... ``animal``. :func:`write_model` writes it (``recipes/text-labels.yaml``
builds it from :data:`MODEL_PATH`); the data callables return batches of words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODEL_PATH = Path(__file__).resolve().parent / "weights" / "text_labels.onnx"
LABELS = ("fruit", "tree", "animal")
WORDS = {"apple": 0, "pear": 0, "plum": 0, "cherry": 0, "oak": 1, "pine": 1, "birch": 1, "maple": 1,
         "cat": 2, "dog": 2, "horse": 2, "otter": 2}  # fmt: skip
OPSETS = {"": 17, "ai.onnx.ml": 2}


def build_model() -> bytes:
    """The serialized ONNX model (deterministic: the same bytes on every call)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    words = list(WORDS)
    dim = 4
    embedding = np.zeros((len(words) + 1, dim), np.float32)
    for index, word in enumerate(words):
        embedding[index, WORDS[word]] = 1.0 + 0.1 * (index % 4)
        embedding[index, 3] = 0.05 * index
    weight = np.zeros((dim, len(LABELS)), np.float32)
    weight[0, 0] = weight[1, 1] = weight[2, 2] = 2.0
    weight[3] = [0.1, -0.1, 0.05]
    bias = np.array([0.1, 0.0, -0.1], np.float32)  # an unknown word (all-zero embedding) is a fruit
    nodes = [
        helper.make_node("CategoryMapper", ["text"], ["word_id"], name="word_ids", domain="ai.onnx.ml", cats_strings=words,
                         cats_int64s=list(range(len(words))), default_int64=len(words)),  # fmt: skip
        helper.make_node("Gather", ["embedding", "word_id"], ["embedded"], name="lookup", axis=0),
        helper.make_node("MatMul", ["embedded", "weight"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "bias"], ["logits"], name="logits"),
        helper.make_node("ArgMax", ["logits"], ["class_id"], name="class_id", axis=1, keepdims=0),
        helper.make_node("LabelEncoder", ["class_id"], ["label"], name="label", domain="ai.onnx.ml",
                         keys_int64s=list(range(len(LABELS))), values_strings=list(LABELS), default_string="unknown"),  # fmt: skip
    ]
    graph = helper.make_graph(
        nodes, "text_labels",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)]),
         helper.make_tensor_value_info("label", TensorProto.STRING, ["batch"])],
        [numpy_helper.from_array(embedding, "embedding"), numpy_helper.from_array(weight, "weight"),
         numpy_helper.from_array(bias, "bias")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version) for domain, version in OPSETS.items()],
                              producer_name="edgekit.demos.text_labels")  # fmt: skip
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def write_model(path: Path = MODEL_PATH) -> Path:
    path.write_bytes(build_model())
    return path


def _batches(words: list[str], batch: int) -> list[dict[str, np.ndarray]]:
    return [{"text": np.array(words[start : start + batch], dtype=object)} for start in range(0, len(words), batch)]


def sample_batches(batch: int = 4) -> list[dict[str, np.ndarray]]:
    """Every known word and two unknown ones, ``batch`` at a time."""
    return _batches([*WORDS, "stone", "cloud"], batch)


def evaluation_batches(batch: int = 7) -> list[dict[str, np.ndarray]]:
    """The known words with their class ids under ``labels`` (int64), for the top-1 metric."""
    words = list(WORDS)
    batches = _batches(words, batch)
    for start, item in zip(range(0, len(words), batch), batches):
        item["labels"] = np.array([WORDS[word] for word in words[start : start + batch]], np.int64)
    return batches
