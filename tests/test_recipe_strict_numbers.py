"""Numbers and booleans in a recipe are taken as written, as its JSON Schema says: YAML's `true`, a quoted "8" or 4.0 is an
error naming the field, line and fix, not the size 1, 8 or 4; a quoted '0.005' is not the number 0.005. Fields that take a
bool or a string among their choices (an input's `value: float | bool`, a shape's size or dim name) still do."""

from __future__ import annotations

import pytest

from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe
from tests.conftest import TINY_RECIPE

TINY = TINY_RECIPE.format(factory="tiny_net")
NOT_A_DIM = "Value error, a dimension is a whole number (a fixed size) or the name of a dim under dims"
UNQUOTE = "  hint: write {} as a number, without quotes"
A_BOOLEAN = "  hint: YAML reads true/false (and yes/no, on/off) as booleans: write the number itself"


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("[batch, 1, 4, 4]", "[batch, true, 4, 4]", [f":8:20: field 'inputs[0].shape[1]': {NOT_A_DIM} (got True)"]),
    ("[batch, 1, 4, 4]", "[batch, 1, 4.0, 4]", [f":8:23: field 'inputs[0].shape[2]': {NOT_A_DIM} (got 4.0)"]),
    ("max: 8}", 'max: "8"}', [":11:27: field 'dims.batch.max': Input should be a valid integer (got '8')", UNQUOTE.format(8)]),
    ("max: 8}", "max: 8.0}", [":11:27: field 'dims.batch.max': Input should be a valid integer (got 8.0)"]),
    ("{warmup: 1, iterations: 5}", "{warmup: 1, iterations: 5, dims: {batch: '2'}}",
     [":19:48: field 'build.benchmark.dims.batch': Input should be a valid integer (got '2')", UNQUOTE.format(2)]),
])  # fmt: skip
def test_a_size_that_is_not_a_whole_number_is_refused(tiny_recipe, old, new, expected):
    path = tiny_recipe(text=TINY.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == ["invalid recipe:", f"{path}{expected[0]}", *expected[1:]]


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("{warmup: 1, iterations: 5}", "{warmup: '10', iterations: 5}",
     [":19:15: field 'build.benchmark.warmup': Input should be a valid integer (got '10')", UNQUOTE.format(10)]),
    ("  benchmark:", "  golden_batches: true\n  benchmark:",
     [":19:3: field 'build.golden_batches': Input should be a valid integer (got True)", A_BOOLEAN]),
    ("  benchmark:", "  quantization: {calibration_batches: true}\n  benchmark:",
     [":19:18: field 'build.quantization.calibration_batches': Input should be a valid integer (got True)", A_BOOLEAN]),
    ("{max_drop: 0.0}", "{max_drop: '0.005'}",
     [":17:12: field 'evaluation.budget.max_drop': Input should be a valid number (got '0.005')", UNQUOTE.format(0.005)]),
    ("build:", "export:\n  parity: {atol: '1e-4'}\nbuild:",
     [":19:12: field 'export.parity.atol': Input should be a valid number (got '1e-4')", UNQUOTE.format("1e-4")]),
    ("    dtype: float32\n", "    dtype: float32\n    value: '0.5'\n",
     [":8:5: field 'inputs[0].value': Input should be a valid number; or: Input should be a valid boolean (got '0.5')",
      UNQUOTE.format(0.5)]),
    ("  benchmark:", "  quantization: {per_channel: 1}\n  benchmark:",
     [":19:18: field 'build.quantization.per_channel': Input should be a valid boolean (got 1)", "  hint: write true or false"]),
])  # fmt: skip
def test_a_number_or_boolean_of_the_wrong_kind_is_refused_naming_the_field_and_fix(tiny_recipe, old, new, expected):
    assert old in TINY
    path = tiny_recipe(text=TINY.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == ["invalid recipe:", f"{path}{expected[0]}", *expected[1:]]


def test_an_override_is_as_strict_as_the_recipe(tiny_recipe):
    path = tiny_recipe(text=TINY + "overrides:\n  raspberry-pi-5:\n    build: {golden_batches: true}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == [
        "overrides.raspberry-pi-5 makes the recipe invalid:",
        f"{path}:22:13: field 'build.golden_batches': Input should be a valid integer (got True)", A_BOOLEAN]


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("  benchmark:", "  precision: INT8\n  benchmark:",
     [":19:3: field 'build.precision': Input should be 'fp32', 'fp16', 'bf16', 'int8', 'int8-dynamic', 'fp8', 'int4', "
      "'mxfp8', 'mxfp4' or 'nvfp4'; or: Input should be 'auto' (got 'INT8')", "  hint: did you mean 'int8'?"]),
    ("  benchmark:", "  prune: {method: 2:4}\n  benchmark:",
     [":19:11: field 'build.prune.method': Input should be 'magnitude', 'channel' or '2:4' (got 124)",
      "  hint: YAML reads an unquoted 2:4 as the base-60 number 124: quote it, '2:4'"]),
])  # fmt: skip
def test_a_value_no_choice_takes_is_one_line_without_pydantic_names_with_a_fix(tiny_recipe, old, new, expected):
    path = tiny_recipe(text=TINY.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == ["invalid recipe:", f"{path}{expected[0]}", *expected[1:]]


def test_whole_numbers_and_dim_names_load(tiny_recipe):
    recipe = load_recipe(tiny_recipe())
    assert recipe.inputs[0].shape == ("batch", 1, 4, 4) and recipe.dims["batch"].max == 8


def test_ints_for_floats_and_bools_where_a_bool_belongs_still_load(tiny_recipe):
    text = TINY.replace("{max_drop: 0.0}", "{max_drop: 0}").replace("    dtype: float32\n", "    dtype: float32\n    value: 16000\n")
    recipe = load_recipe(tiny_recipe(text=text + "export:\n  parity: {atol: 1e-4}\n"))  # YAML 1.2's exponent form too
    assert recipe.inputs[0].value == 16000.0 and isinstance(recipe.inputs[0].value, float)
    assert recipe.evaluation is not None and recipe.evaluation.budget.max_drop == 0.0 and recipe.export.parity.atol == 1e-4
    flag = load_recipe(tiny_recipe(text=TINY.replace("    dtype: float32\n", "    dtype: float32\n    value: true\n")))
    assert flag.inputs[0].value is True  # value: float | bool takes YAML's true as the boolean it is
