"""Every recipe shipped in recipes/ loads, names callables that import, and its data callables
return batches that fit the recipe's inputs (names, dtypes, shapes within dims)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

from edgekit.recipe import CallableData, FactorySource, HuggingFaceSource, Recipe, load_recipe
from edgekit_runtime.signature import numpy_dtype

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
RECIPE_PATHS = sorted(RECIPES_DIR.glob("*.yaml"))
SCHEMA_COMMENT = "# yaml-language-server: $schema=../edgekit/schemas/recipe.schema.json"


def _resolve(reference: str):
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _data_sources(recipe: Recipe) -> dict[str, CallableData]:
    sources = {"samples": recipe.data.samples, "calibration": recipe.data.calibration, "evaluation": recipe.data.evaluation}
    return {section: source for section, source in sources.items() if isinstance(source, CallableData)}


def test_the_demo_recipes_are_shipped():
    assert {p.stem for p in RECIPE_PATHS} >= {"digits-cnn", "minilm", "minilm-hf"}


@pytest.mark.parametrize("path", RECIPE_PATHS, ids=[p.stem for p in RECIPE_PATHS])
def test_recipe_loads_and_its_callables_import(path: Path):
    assert path.read_text(encoding="utf-8").splitlines()[0] == SCHEMA_COMMENT
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    if isinstance(recipe.model, FactorySource):
        factory = _resolve(recipe.model.factory)
        inspect.signature(factory).bind(**recipe.model.kwargs)
    if isinstance(recipe.model, HuggingFaceSource) and recipe.model.path_from:
        assert Path(_resolve(recipe.model.path_from)()).is_dir()
    for section, source in _data_sources(recipe).items():
        function = _resolve(source.callable)
        assert callable(function), f"{section}: {source.callable}"
        inspect.signature(function).bind(**source.kwargs)  # the recipe's kwargs fit the signature


@pytest.mark.parametrize("path", RECIPE_PATHS, ids=[p.stem for p in RECIPE_PATHS])
def test_data_batches_fit_the_recipe_inputs(path: Path):
    recipe = load_recipe(path)
    input_specs = {spec.name: spec for spec in recipe.inputs}
    for section, source in _data_sources(recipe).items():
        batches = _resolve(source.callable)(**source.kwargs)
        assert isinstance(batches, list) and batches, f"{section} returned no batches"
        for batch in batches:
            extra = set(batch) - set(input_specs)
            if section == "evaluation" and recipe.evaluation and recipe.evaluation.metric == "top1":
                assert extra == {recipe.evaluation.labels}
                labels = batch[recipe.evaluation.labels]
                assert labels.dtype == np.int64 and labels.shape == (len(batch[recipe.inputs[0].name]),)
            else:
                assert not extra, f"{section}: unexpected keys {sorted(extra)}"
            for name, spec in input_specs.items():
                array = batch[name]
                assert array.dtype == numpy_dtype(spec.dtype), f"{section}: {name} is {array.dtype}, recipe says {spec.dtype}"
                assert array.ndim == len(spec.shape), f"{section}: {name} has shape {array.shape}"
                for size, dim in zip(array.shape, spec.shape):
                    if isinstance(dim, int):
                        assert size == dim, f"{section}: {name} has shape {array.shape}, recipe says {spec.shape}"
                    else:
                        assert recipe.dims[dim].min <= size <= recipe.dims[dim].max, f"{section}: {name} dim {dim}={size}"
