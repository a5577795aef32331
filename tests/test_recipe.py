"""Recipe loading: every kind of bad input gets an error naming the file, line, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe, recipe_json_schema
from tests.conftest import TINY_RECIPE


def test_tiny_recipe_loads(tiny_recipe):
    recipe = load_recipe(tiny_recipe())
    assert recipe.name == "tiny"
    assert recipe.dims["batch"].max == 8
    assert recipe.shape_at(recipe.inputs[0], "max") == (8, 1, 4, 4)
    assert len(recipe.sha256) == 64


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match=r"recipe not found: .*nope\.yaml"):
        load_recipe(tmp_path / "nope.yaml")


def test_yaml_syntax_error_names_line_and_column(tiny_recipe):
    path = tiny_recipe(text="name: tiny\nmodel:\n  kind: factory\n  factory: [unclosed\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "YAML syntax error" in str(info.value)
    assert f"{path}:5:" in str(info.value) or f"{path}:4:" in str(info.value)


def test_mistyped_key_suggests_the_closest(tiny_recipe):
    path = tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net").replace("outputs:", "ouputs:"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "unknown key 'ouputs'" in message and "did you mean 'outputs'?" in message
    assert f"{path}:9:1" in message  # line and column of the bad key
    assert "missing required field" not in message  # the typo explains the missing 'outputs': one message, not two


def test_a_typo_inside_a_union_section_is_one_message_about_that_key(tiny_recipe, tmp_path):
    """data.samples is a callable or an npz folder: a typo in 'callable' names that key once, with the fix,
    not each member's complaints (missing 'callable', missing 'npz_dir', unknown 'kwargs' in NpzData)."""
    text = Path("recipes/digits-cnn.yaml").read_text().replace("    callable: edgekit.demos.digits_cnn:sample_batches",
                                                                "    calable: edgekit.demos.digits_cnn:sample_batches")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    lines = str(info.value).splitlines()
    assert lines[1:] == [f"{path}:32:5: unknown key 'calable' in data.samples (did you mean 'callable'?)",
                         "  hint: rename 'calable' to 'callable'"]


@pytest.mark.parametrize(("old", "new", "expected"), [
    # the kind written as a key (``model: {onnx: net.onnx}``): which key is missing, every kind, and the fix
    ("  kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net\n", "  onnx: net.onnx\n",
     ["field 'model': missing the 'kind' key that says what this section is",
      "hint: write 'kind: onnx' (and its other fields, e.g. 'path') instead of 'onnx:'",
      "'kind' is one of: factory, torchscript, exported_program, huggingface, onnx"]),
    ("kind: factory", "kind: fatcory",
     ["field 'model.kind': unknown kind 'fatcory'", "hint: did you mean 'factory'? 'kind' is one of: factory,"]),
])
def test_a_model_section_s_kind_missing_or_unknown_names_the_key_and_the_kinds(tiny_recipe, old: str, new: str,
                                                                              expected: list[str]) -> None:  # fmt: skip
    """Not pydantic's 'Unable to extract tag using discriminator'."""
    with pytest.raises(RecipeError) as info:
        load_recipe(tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net").replace(old, new)))
    message = str(info.value)
    assert all(part in message for part in expected), message
    assert "discriminator" not in message


def test_nested_unknown_key_names_the_section(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("benchmark:", "benchmrk:")
    with pytest.raises(RecipeError, match=r"unknown key 'benchmrk' in build \(did you mean 'benchmark'\?\)"):
        load_recipe(tiny_recipe(text=text))


def test_wrong_type_names_field_and_value(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("max: 8", "max: eight")
    with pytest.raises(RecipeError, match=r"field 'dims\.batch\.max'.*'eight'"):
        load_recipe(tiny_recipe(text=text))


def test_undeclared_dynamic_dim(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("[batch, 1, 4, 4]", "[batch, 1, height, 4]")
    with pytest.raises(RecipeError, match=r"dynamic dims \['height'\].*no entry under 'dims'"):
        load_recipe(tiny_recipe(text=text))


def test_min_opt_max_order(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("{min: 1, opt: 4, max: 8}", "{min: 4, opt: 2, max: 8}")
    with pytest.raises(RecipeError, match=r"min <= opt <= max"):
        load_recipe(tiny_recipe(text=text))


def test_unknown_source_kind(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net").replace("kind: factory", "kind: keras")
    with pytest.raises(RecipeError, match=r"model"):
        load_recipe(tiny_recipe(text=text))


def test_duplicate_key(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net") + "name: again\n"
    with pytest.raises(RecipeError, match=r"key 'name' appears twice \(first on line 1\)"):
        load_recipe(tiny_recipe(text=text))


def test_override_for_target_merges_and_validates(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net") + "overrides:\n  x86-64-cpu:\n    build: {benchmark: {iterations: 9}}\n"
    recipe = load_recipe(tiny_recipe(text=text))
    assert recipe.for_target("x86-64-cpu").build.benchmark.iterations == 9
    assert recipe.for_target("x86-64-cpu").build.benchmark.warmup == 1
    assert recipe.for_target("arm64-cpu").build.benchmark.iterations == 5
    bad = text + "  raspberry-pi-5:\n    build: {precison: fp16}\n"  # another target's typo fails the load (tests/test_recipe_overrides.py)
    with pytest.raises(RecipeError, match=r"(?s)overrides\.raspberry-pi-5 makes the recipe invalid.*unknown key .precison. in build \(did you mean .precision.\?\)"):
        load_recipe(tiny_recipe(text=bad))


def test_json_schema_is_published_shape():
    schema = recipe_json_schema()
    assert schema["title"] == "edgekit recipe"
    assert {"model", "inputs", "outputs", "data"} <= set(schema["required"])
    assert "path" not in schema["properties"]


def test_a_capitalised_key_is_a_typo_not_a_union_member(tiny_recipe):
    """pydantic names union members by class in error locations; a made-up 'Aname' key (found by the fuzz test)
    must still be reported as an unknown key of the file, never escape as a raw ValidationError."""
    path = tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net").replace("name: tiny", "Aname: tiny", 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "unknown key 'Aname' in (top level) (did you mean 'name'?)" in str(info.value)
