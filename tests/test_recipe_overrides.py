"""A recipe's per-target overrides are checked when it loads: each key names a shipped target (with a 'did you mean'
for a typo) or a profile file of your own, and each override merged into the recipe is valid, whichever target the
build is for, with the file and line of the mistake."""

from __future__ import annotations

import shutil

import pytest

from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe
from edgekit.target import TARGETS_DIR, default_registry
from tests.conftest import TINY_RECIPE

TINY = TINY_RECIPE.format(factory="tiny_net")


def test_an_unknown_target_key_is_refused_with_the_closest_names(tiny_recipe):
    path = tiny_recipe(text=TINY + "overrides:\n  x86_64-cpu: {build: {precision: fp16}}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == [
        f"{path}:21:3: overrides key 'x86_64-cpu' is not a known target (did you mean 'x86-64-cpu'?)",
        "  hint: rename it to 'x86-64-cpu'; for a profile of your own, key the override by its name or by its file's "
        "path relative to the recipe (e.g. boards/myboard.yaml)",
    ]


def test_a_key_naming_a_profile_of_ones_own_is_kept_with_a_warning(tiny_recipe, caplog):
    """A name like no shipped target's is a profile of the user's own (``-t boards/myboard.yaml``), as before
    overrides were checked at load: kept, with a warning naming the shipped targets; two keys for one target refused."""
    path = tiny_recipe(text=TINY + "overrides:\n  myboard: {build: {precision: fp16}}\n")
    with caplog.at_level("WARNING", logger="edgekit.recipe_overrides"):
        recipe = load_recipe(path)
    assert recipe.for_target("myboard").build.precision == "fp16"
    assert "overrides key 'myboard' is no shipped target: it applies only to a profile of your own named 'myboard'" in caplog.text
    (path.parent / "myboard.yaml").write_text("name: myboard\n")
    twice = tiny_recipe(text=TINY + "overrides:\n  myboard: {build: {precision: fp16}}\n  myboard.yaml: {build: {precision: fp32}}\n")
    with pytest.raises(RecipeError, match="overrides keys 'myboard' and 'myboard.yaml' both apply to target 'myboard'"):
        load_recipe(twice)


def test_a_typo_in_another_target_s_override_fails_the_load_with_its_lines(tiny_recipe):
    text = TINY + "overrides:\n  x86-64-cpu: {build: {precision: fp16}}\n  raspberry-pi-5: {build: {precison: int8, benchmark: {iterashuns: 3}}}\n"
    path = tiny_recipe(text=text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines() == [
        "overrides.raspberry-pi-5 makes the recipe invalid:",
        f"{path}:22:56: unknown key 'iterashuns' in build.benchmark (did you mean 'iterations'?)",
        f"{path}:22:28: unknown key 'precison' in build (did you mean 'precision'?)",
        "  hint: rename 'iterashuns' to 'iterations'; rename 'precison' to 'precision'",
    ]


def test_a_bad_value_in_an_override_names_its_line(tiny_recipe):
    path = tiny_recipe(text=TINY + "overrides:\n  arm64-cpu:\n    build: {benchmark: {iterations: 0}}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines()[:2] == [
        "overrides.arm64-cpu makes the recipe invalid:",
        f"{path}:22:25: field 'build.benchmark.iterations': Input should be greater than or equal to 1 (got 0)",
    ]


def test_a_profile_path_key_applies_to_the_target_of_that_profile(tiny_recipe, tmp_path):
    (tmp_path / "boards").mkdir()
    profile = (TARGETS_DIR / "x86-64-cpu.yaml").read_text().replace("name: x86-64-cpu", "name: my-board")
    (tmp_path / "boards" / "my-board.yaml").write_text(profile)
    recipe = load_recipe(tiny_recipe(text=TINY + "overrides:\n  boards/my-board.yaml: {build: {benchmark: {iterations: 7}}}\n"))
    assert recipe.for_target("my-board").build.benchmark.iterations == 7
    assert recipe.for_target("x86-64-cpu").build.benchmark.iterations == 5
    missing = tiny_recipe(text=TINY + "overrides:\n  boards/other.yaml: {build: {benchmark: {iterations: 7}}}\n", name="missing.yaml")
    with pytest.raises(RecipeError) as info:
        load_recipe(missing)
    assert str(info.value).splitlines()[0] == (f"{missing}:21:3: overrides key 'boards/other.yaml' is not a target profile file "
                                               f"(looked for {tmp_path / 'boards' / 'other.yaml'})")


def test_the_demo_recipes_overrides_name_shipped_targets(tmp_path):
    demo = tmp_path / "digits.yaml"
    shutil.copy(TARGETS_DIR.parent / "recipes" / "digits-cnn.yaml", demo)
    with demo.open("a") as handle:
        handle.write("overrides:\n  raspberry-pi-5: {build: {benchmark: {iterations: 20}}}\n")
    assert load_recipe(demo).for_target("raspberry-pi-5").build.benchmark.iterations == 20
