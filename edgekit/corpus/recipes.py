"""A :class:`CorpusModel` as an edgekit recipe (``model.kind: onnx``, data in ``.npz`` directories), so the
corpus builds every precision through the same pipeline a user's build goes through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgekit.corpus.base import Batch, CorpusModel


def _save_batches(batches: list[Batch], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.npz"):
        old.unlink()
    for index, batch in enumerate(batches):
        np.savez(directory / f"{index:04d}.npz", **batch)
    return directory


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
    data = {
        "samples": {"npz_dir": str(_save_batches(model.evaluation[:2], directory / "samples"))},
        "calibration": {"npz_dir": str(_save_batches(model.calibration, directory / "calibration"))},
        "evaluation": {"npz_dir": str(_save_batches(model.evaluation, directory / "evaluation"))},
    }
    first = next(iter(model.bench))
    axis = model.batch_axes.get(first, 0) or 0
    sizes = [b[first].shape[axis] for b in [*model.calibration, *model.evaluation, model.bench]]
    bench_batch = model.bench[first].shape[axis]
    recipe = {
        "schema_version": 1,
        "name": model.name,
        "description": f"corpus: {model.source}",
        "model": {"kind": "onnx", "path": str(model.onnx_path)},
        "inputs": _tensor_specs(model),
        "outputs": [model.output],
        "dims": {"batch": {"min": 1, "opt": bench_batch, "max": max(sizes)}},
        "data": data,
        "evaluation": evaluation_section(model, min_value),
        "build": {"benchmark": {"warmup": 2, "iterations": 5, "dims": {"batch": bench_batch}}},
    }
    path = directory / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
