"""Model sources, looked up by the recipe's ``model.kind``: one loader per kind behind one interface."""

from __future__ import annotations

from pathlib import Path

from edgekit.recipe import Recipe
from edgekit.sources.base import LoadedModel, LoaderFn
from edgekit.sources.factory import load_factory
from edgekit.sources.huggingface import load_huggingface
from edgekit.sources.onnx_file import load_onnx_file
from edgekit.sources.torch_files import load_exported_program, load_torchscript

#: model.kind -> loader. Every entry is exercised by tests/sources.
SOURCES: dict[str, LoaderFn] = {
    "factory": load_factory,
    "torchscript": load_torchscript,
    "exported_program": load_exported_program,
    "huggingface": load_huggingface,
    "onnx": load_onnx_file,
}


def load_source(recipe: Recipe, workdir: Path, opset: int | None = None) -> LoadedModel:
    """Load the recipe's model source (``workdir`` receives any intermediate files). ``opset``: the one the build
    exports at (the recipe's ``export.opset``, else the target's), for the sources that export themselves
    (Hugging Face, through Optimum)."""
    if opset is not None and recipe.export.opset is None:
        recipe = recipe.model_copy(update={"export": recipe.export.model_copy(update={"opset": opset})})
    return SOURCES[recipe.model.kind](recipe.model, recipe, workdir)


__all__ = ["SOURCES", "LoadedModel", "load_source"]
