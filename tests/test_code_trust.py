"""The recipe trust model: callables outside the recipe's folder and edgekit's demos need --trust-code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from edgekit.cli.main import main
from edgekit.code_trust import BUILT_IN, EDGEKIT_DEMOS_DIR, TRUSTED_DIRS_ENV, CodeTrust, installation_roots, module_files
from edgekit.errors import RecipeError
from edgekit.pipeline import build
from edgekit.recipe import Recipe, load_recipe
from tests.conftest import TINY_RECIPE

TINY = TINY_RECIPE.format(factory="tiny_net")
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
FACTORY = "factory: tests.fixtures.tiny_models:tiny_net"


def test_a_stdlib_callable_is_refused_naming_field_callable_and_flag(tiny_recipe):
    path = tiny_recipe(text=TINY.replace(FACTORY, "factory: os:system").replace("kind: factory", "kind: factory\n  kwargs: {command: 'touch pwned'}"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert f"{path}: model.factory 'os:system' is code outside the recipe's folder ({path.parent})" in message
    assert "--trust-code" in message and "trust_code=True" in message and TRUSTED_DIRS_ENV in message
    recipe = load_recipe(path, trust_code=True)
    assert recipe.model.factory == "os:system"
    assert not (path.parent / "pwned").exists()  # loading never calls anything


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ('samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}', 'samples: {callable: "shutil:rmtree", kwargs: {path: "/"}}',
         "data.samples.callable 'shutil:rmtree'"),
        ("metric: top1", "metric: callable\n  callable: subprocess:run", "evaluation.callable 'subprocess:run'"),
        (FACTORY, "factory: edgekit.bundle.pack:pack_bundle", "model.factory 'edgekit.bundle.pack:pack_bundle'"),  # edgekit, not its demos
    ],
)
def test_every_callable_field_is_checked(tiny_recipe, old, new, named):
    with pytest.raises(RecipeError) as info:
        load_recipe(tiny_recipe(text=TINY.replace(old, new)))
    assert f"{named} is code outside the recipe's folder" in str(info.value)


def test_code_in_the_recipes_folder_is_trusted(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUSTED_DIRS_ENV, raising=False)
    (tmp_path / "my_models").mkdir()
    (tmp_path / "my_models" / "__init__.py").write_text("")
    (tmp_path / "my_models" / "net.py").write_text("from tests.fixtures.tiny_models import tiny_net, tiny_batches\n")
    text = TINY.replace("tests.fixtures.tiny_models", "my_models.net")
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    recipe = load_recipe(path)
    assert recipe.model.factory == "my_models.net:tiny_net"
    assert "my_models.net" not in sys.modules  # located by the finders, not imported


def test_code_elsewhere_is_located_without_running_it(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "evil_pkg").mkdir(parents=True)
    marker = tmp_path / "ran"
    (elsewhere / "evil_pkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (elsewhere / "evil_pkg" / "models.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef net(): pass\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    recipe_dir = tmp_path / "recipe"
    recipe_dir.mkdir()
    path = recipe_dir / "recipe.yaml"
    path.write_text(TINY.replace(FACTORY, "factory: evil_pkg.models:net"))
    with pytest.raises(RecipeError, match=r"model\.factory 'evil_pkg\.models:net' is code outside .*evil_pkg/models\.py"):
        load_recipe(path)
    assert module_files("evil_pkg.models", recipe_dir) == [elsewhere / "evil_pkg" / "__init__.py", elsewhere / "evil_pkg" / "models.py"]
    assert not marker.exists() and "evil_pkg" not in sys.modules
    monkeypatch.setenv(TRUSTED_DIRS_ENV, f"{os.environ[TRUSTED_DIRS_ENV]}{os.pathsep}{elsewhere}")
    assert load_recipe(path).model.factory == "evil_pkg.models:net"  # its folder is listed as trusted


def test_the_tests_recipes_load_through_the_trusted_dirs_variable(tiny_recipe, monkeypatch):
    load_recipe(tiny_recipe())  # tests/conftest.py lists tests/ in EDGEKIT_TRUSTED_CODE_DIRS
    monkeypatch.delenv(TRUSTED_DIRS_ENV)
    with pytest.raises(RecipeError, match=r"model\.factory 'tests\.fixtures\.tiny_models:tiny_net' is code outside .*tiny_models\.py"):
        load_recipe(tiny_recipe())
    assert load_recipe(tiny_recipe(), trust_code=True).name == "tiny"


def test_the_demo_recipes_need_no_flag(monkeypatch):
    monkeypatch.delenv(TRUSTED_DIRS_ENV, raising=False)
    for path in sorted(RECIPES.glob("*.yaml")):
        recipe = load_recipe(path)
        for target in recipe.overrides:
            recipe.for_target(target)


def test_an_override_naming_code_elsewhere_is_checked_for_that_target(tiny_recipe):
    text = TINY + "overrides:\n  x86-64-cpu:\n    build: {prune: {method: magnitude, sparsity: 0.5, fine_tune: {callable: 'os:system'}}}\n"
    recipe = load_recipe(tiny_recipe(text=text))
    assert recipe.for_target("arm64-cpu").build.prune is None
    with pytest.raises(RecipeError, match=r"\(overrides\.x86-64-cpu\): build\.prune\.fine_tune\.callable 'os:system' is code outside"):
        recipe.for_target("x86-64-cpu")
    trusted = load_recipe(tiny_recipe(text=text), trust_code=True)
    assert trusted.for_target("x86-64-cpu").build.prune.fine_tune.callable == "os:system"


def test_build_cli_refuses_without_trust_code_and_goes_on_with_it(tiny_recipe, tmp_path, capsys):
    path = tiny_recipe(text=TINY.replace(FACTORY, "factory: json:dumps"))
    args = ["build", str(path), "--target", "x86-64-cpu", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "model.factory 'json:dumps' is code outside the recipe's folder" in err and "--trust-code" in err
    assert main([*args, "--trust-code"]) == 2  # now loaded and called: json.dumps() is no model factory
    err = capsys.readouterr().err
    assert "json:dumps" in err and "is code outside" not in err
    assert not (tmp_path / "out").exists()


def test_sweep_cli_takes_the_same_flag(tiny_recipe, tmp_path, capsys):
    path = tiny_recipe(text=TINY.replace(FACTORY, "factory: json:dumps"))
    args = ["sweep", str(path), "--target", "x86-64-cpu", "--out", str(tmp_path / "sweep"), "--iterations", "1"]
    assert main(args) == 2
    assert "model.factory 'json:dumps' is code outside the recipe's folder" in capsys.readouterr().err
    # loaded, and every variant's build called json.dumps, which builds no model: a sweep that built nothing exits 2
    assert main([*args, "--trust-code"]) == 2
    err = capsys.readouterr().err
    assert "is code outside" not in err and "no variant of the sweep built" in err
    variants = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["variants"]
    assert variants[0]["status"] == "failed" and "model.factory 'json:dumps' rejected its kwargs" in variants[0]["reason"]


def test_installed_packages_inside_the_recipes_folder_are_not_its_code(tmp_path, monkeypatch):
    """A recipe at a project's root, next to its .venv: site-packages is in the folder but is not the recipe's code."""
    monkeypatch.delenv(TRUSTED_DIRS_ENV, raising=False)
    site_packages = tmp_path / ".venv" / "lib" / "site-packages"
    (site_packages / "somepkg").mkdir(parents=True)
    (site_packages / "somepkg" / "__init__.py").write_text("def run(**kwargs): pass\n")
    (tmp_path / "local_models.py").write_text("def net(): pass\n")
    trust = CodeTrust.for_recipe(tmp_path, installed=(tmp_path / ".venv",))
    assert trust.trusts(tmp_path / "local_models.py")
    assert not trust.trusts(site_packages / "somepkg" / "__init__.py")
    assert trust.trusts(EDGEKIT_DEMOS_DIR / "digits_cnn.py") and not trust.trusts(BUILT_IN)
    monkeypatch.syspath_prepend(str(site_packages))
    recipe = Recipe.model_validate(yaml.safe_load(TINY.replace(FACTORY, "factory: somepkg:run")))
    with pytest.raises(RecipeError, match=r"model\.factory 'somepkg:run' is code outside .*somepkg/__init__\.py \(installed Python code\)"):
        trust.check(recipe, tmp_path, "recipe.yaml")
    assert "somepkg" not in sys.modules


def test_this_environments_installation_roots_include_site_packages():
    import sysconfig

    roots = installation_roots()
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in roots and Path(sys.prefix).resolve() in roots


def test_bench_vs_pytorch_checks_the_recipe_it_loads(tiny_recipe, tmp_path, capsys):
    bundle = build(tiny_recipe(), "x86-64-cpu", out=tmp_path / "bundle").bundle_dir
    other = tiny_recipe(text=TINY.replace(FACTORY, "factory: json:dumps"), name="other.yaml")
    args = ["bench", str(bundle), "--vs-pytorch", "--recipe", str(other), "-n", "1", "--warmup", "0"]
    assert main(args) == 2
    assert "model.factory 'json:dumps' is code outside the recipe's folder" in capsys.readouterr().err
    assert main([*args, "--trust-code"]) == 2  # loaded this time; json.dumps() is no model factory
    err = capsys.readouterr().err
    assert "model.factory 'json:dumps' rejected its kwargs" in err and "is code outside" not in err
