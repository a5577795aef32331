"""Sizes in a recipe are taken as written: YAML's `true`, a quoted "8" or 4.0 is an error naming the field and line, not
the size 1, 8 or 4."""

from __future__ import annotations

import pytest

from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe
from tests.conftest import TINY_RECIPE

TINY = TINY_RECIPE.format(factory="tiny_net")
NOT_A_DIM = "Value error, a dimension is a whole number (a fixed size) or the name of a dim under dims"


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("[batch, 1, 4, 4]", "[batch, true, 4, 4]", f":8:20: field 'inputs[0].shape[1]': {NOT_A_DIM} (got True)"),
    ("[batch, 1, 4, 4]", "[batch, 1, 4.0, 4]", f":8:23: field 'inputs[0].shape[2]': {NOT_A_DIM} (got 4.0)"),
    ("max: 8}", 'max: "8"}', ":11:27: field 'dims.batch.max': Input should be a valid integer (got '8')"),
    ("max: 8}", "max: 8.0}", ":11:27: field 'dims.batch.max': Input should be a valid integer (got 8.0)"),
    ("{warmup: 1, iterations: 5}", "{warmup: 1, iterations: 5, dims: {batch: '2'}}",
     ":19:48: field 'build.benchmark.dims.batch': Input should be a valid integer (got '2')"),
])
def test_a_size_that_is_not_a_whole_number_is_refused(tiny_recipe, old, new, expected):
    path = tiny_recipe(text=TINY.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == ["invalid recipe:", f"{path}{expected}"]


def test_whole_numbers_and_dim_names_load(tiny_recipe):
    recipe = load_recipe(tiny_recipe())
    assert recipe.inputs[0].shape == ("batch", 1, 4, 4) and recipe.dims["batch"].max == 8
