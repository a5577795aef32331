"""Sizes in a recipe's data and state stay within its dims: a data batch larger than dims.<dim>.max fails when the data
load, naming the source, batch, input and axis (not later at the golden stage); state zeros are sizes >= 1 within the
dim they stand for."""

from __future__ import annotations

import pytest

from edgekit.data import load_batches
from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe
from tests.conftest import TINY_RECIPE

SAMPLES = '"tests.fixtures.tiny_models:tiny_batches"}'

STATEFUL = """\
name: stateful
model: {kind: factory, factory: "tests.fixtures.tiny_models:tiny_net"}
inputs:
  - {name: x, dtype: float32, shape: [batch, 4]}
  - {name: h, dtype: float32, shape: [n, batch, 3]}
outputs: [y, hn]
state:
  - {input: h, output: hn, zeros: ZEROS}
dims:
  batch: {min: 1, opt: 2, max: 8}
  n: {min: 1, opt: 2, max: 4}
data:
  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}
"""


@pytest.mark.parametrize(("batch", "expected"), [
    (20, ["input 'image' axis 0 (batch) is 20, outside dims.batch (1 .. 8)",
          "  hint: give batches with batch from 1 to 8, or raise dims.batch.max to 20 in the recipe"]),
])
def test_a_batch_above_the_dim_s_max_fails_when_the_data_load(tiny_recipe, batch, expected):
    path = tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net").replace(SAMPLES, SAMPLES[:-1] + f", kwargs: {{batch: {batch}}}}}", 1))
    recipe = load_recipe(path)
    with pytest.raises(RecipeError) as info:
        load_batches(recipe, recipe.data.samples, "samples")
    lines = str(info.value).splitlines()
    assert lines[0] == f"{recipe.path}: data.samples batch 0: {expected[0]}"
    assert lines[1:] == expected[1:]


def test_a_batch_below_the_dim_s_min_fails_naming_the_fix(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("{min: 1, opt: 4, max: 8}", "{min: 6, opt: 6, max: 8}")
    recipe = load_recipe(tiny_recipe(text=text))
    with pytest.raises(RecipeError) as info:
        load_batches(recipe, recipe.data.samples, "samples")
    assert str(info.value).splitlines() == [
        f"{recipe.path}: data.samples batch 0: input 'image' axis 0 (batch) is 4, outside dims.batch (6 .. 8)",
        "  hint: give batches with batch from 6 to 8, or lower dims.batch.min to 4 in the recipe",
    ]


def test_batches_within_the_dims_load(tiny_recipe):
    recipe = load_recipe(tiny_recipe())
    assert [b["image"].shape[0] for b in load_batches(recipe, recipe.data.samples, "samples")] == [4, 4]


@pytest.mark.parametrize(("zeros", "expected"), [
    ("[-1, batch, 3]", ":8:36: field 'state[0].zeros[0]': axis 0 is -1: sizes of the initial zeros are whole numbers >= 1 "
                       "or dim names (input 'h' ['n', 'batch', 3])"),
    ("[9, batch, 3]", ":8:36: field 'state[0].zeros[0]': axis 0 is 9, outside dims.n (1 .. 4) of input 'h' ['n', 'batch', 3]: "
                      "use a size in that range, or the dim's name 'n'"),
    ("[2, batch, 4]", ":8:46: field 'state[0].zeros[2]': axis 2 is 4; input 'h' ['n', 'batch', 3] fixes it at 3"),
    ("[2, seq, 3]", ":8:39: field 'state[0].zeros[1]': axis 1 names dim 'seq', which is not under dims ['batch', 'n']"),
])
def test_state_zeros_are_sizes_within_their_dims(tiny_recipe, zeros, expected):
    path = tiny_recipe(text=STATEFUL.replace("ZEROS", zeros))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == ["invalid recipe:", f"{path}{expected}"]


def test_state_zeros_within_the_dims_load(tiny_recipe):
    assert load_recipe(tiny_recipe(text=STATEFUL.replace("ZEROS", "[4, batch, 3]"))).state[0].zeros == (4, "batch", 3)
