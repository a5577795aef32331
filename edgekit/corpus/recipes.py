"""A :class:`CorpusModel` as an edgekit recipe (``model.kind: onnx``, data in ``.npz`` directories), so the
corpus builds every precision through the same pipeline a user's build goes through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgekit.corpus.base import Batch, CorpusModel


def _save_batches(batches: list[Batch], directory: Path) -> Path:
    import shutil

    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for index, batch in enumerate(batches):
        np.savez(directory / f"{index:04d}.npz", **batch)
    return directory


def _save_sequences(model: CorpusModel, batches: list[Batch], directory: Path) -> Path:
    """A stateful recipe's data: one folder per sequence of ``model.sequence_length`` consecutive batches,
    without the state inputs (the pipeline starts each sequence at zeros and carries its own state)."""
    import shutil

    if directory.exists():
        shutil.rmtree(directory)
    states = {input_name for input_name, _ in model.state}
    length = model.sequence_length
    for start in range(0, len(batches) - length + 1, length):
        _save_batches([{k: v for k, v in b.items() if k not in states} for b in batches[start:start + length]],
                      directory / f"sequence_{start // length:04d}")
    return directory


def _data(model: CorpusModel, directory: Path) -> dict[str, Any]:
    if model.state:
        samples = model.evaluation[:model.sequence_length]
        return {
            "samples": {"npz_dir": str(_save_sequences(model, samples, directory / "samples"))},
            "calibration": {"npz_dir": str(_save_sequences(model, model.calibration, directory / "calibration"))},
            "evaluation": {"npz_dir": str(_save_sequences(model, model.evaluation, directory / "evaluation"))},
        }
    return {
        "samples": {"npz_dir": str(_save_batches(model.evaluation[:2], directory / "samples"))},
        "calibration": {"npz_dir": str(_save_batches(model.calibration, directory / "calibration"))},
        "evaluation": {"npz_dir": str(_save_batches(model.evaluation, directory / "evaluation"))},
    }


def _tensor_specs(model: CorpusModel) -> list[dict[str, Any]]:
    """Inputs with their batch axis as the dynamic ``batch`` dim and every other axis fixed at the bench batch's size."""
    specs = []
    for name, array in model.bench.items():
        shape: list[Any] = list(array.shape)
        axis = model.batch_axes.get(name, 0)
        if shape and axis is not None:
            shape[axis] = "batch"
        specs.append({"name": name, "dtype": str(array.dtype), "shape": shape})
    return specs


def evaluation_section(model: CorpusModel, min_value: float | None = None) -> dict[str, Any]:
    """The recipe's ``evaluation``: the model's task metric (:attr:`CorpusModel.metric`) with the output it
    reads and a budget of ``min_value`` (None: -1, no floor, so a fixed precision always builds and the
    corpus records its metric; the corpus's metrics all read higher-is-better)."""
    section = {"output": model.output, **model.metric}
    section["budget"] = {"min_value": -1.0 if min_value is None else float(min_value)}
    return section


def write_recipe(model: CorpusModel, directory: Path, min_value: float | None = None) -> Path:
    """Write ``directory/recipe.yaml`` and its data; ``min_value`` is the budget on the model's task metric
    (None: no floor; ``model.min_value`` is the budget the corpus gives ``auto``)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = _data(model, directory)
    first = next(iter(model.bench))
    axis = model.batch_axes.get(first, 0) or 0
    sizes = [b[first].shape[axis] for b in [*model.calibration, *model.evaluation, model.bench]]
    bench_batch = model.bench[first].shape[axis]
    recipe = {
        "schema_version": 1,
        "name": model.name,
        "description": f"corpus: {model.source}",
        "model": model.model_source or {"kind": "onnx", "path": str(model.onnx_path)},
        "inputs": _tensor_specs(model),
        "outputs": list(dict.fromkeys([model.output, *(output for _, output in model.state)])),
        "dims": {"batch": {"min": 1, "opt": bench_batch, "max": max(sizes)}},
        "data": data,
        "evaluation": evaluation_section(model, min_value),
        "build": {"benchmark": {"warmup": 2, "iterations": 5, "dims": {"batch": bench_batch}}},
    }
    if model.state:
        recipe["state"] = [{"input": input_name, "output": output} for input_name, output in model.state]
    if model.model_source and model.model_source.get("kind") != "onnx":
        recipe["export"] = {"exporter": "legacy"}  # the corpus's PyTorch sources are TorchScript, which torch.export cannot take
    path = directory / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
