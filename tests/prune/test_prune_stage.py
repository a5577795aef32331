"""Pruning inside the build: the manifest records it, accuracy is measured against the unpruned model."""

from __future__ import annotations

import onnx
import pytest

from edgekit.errors import BuildError, QuantizationError, RecipeError
from edgekit.pipeline import build
from edgekit.recipe import load_recipe
from tests.conftest import REPO, TINY_RECIPE


def _weights(path) -> int:
    return sum(int(__import__("numpy").prod(i.dims)) for i in onnx.load(str(path)).graph.initializer)


def test_digits_channel_pruning_with_fine_tune(tmp_path):
    pruned = build(REPO / "recipes" / "digits-cnn-pruned.yaml", "x86-64-cpu", out=tmp_path / "pruned")
    manifest = pruned.manifest
    assert manifest["prune"]["method"] == "channel" and manifest["prune"]["fine_tune"]
    assert manifest["prune"]["params_after"] < 0.3 * manifest["prune"]["params_before"]
    assert manifest["accuracy"]["reference_source"] == "pytorch-fp32"  # the unpruned model
    assert manifest["accuracy"]["drop"] <= 0.01
    assert manifest["export"]["parity"]["passed"] is True  # the pruned model against its own export
    assert _weights(pruned.bundle_dir / "model.onnx") < 0.3 * manifest["prune"]["params_before"] + 100


@pytest.mark.parametrize("method", ["magnitude", "2:4"])
def test_unstructured_and_2_4_are_recorded_honestly(method, tiny_recipe, tmp_path):
    sparsity = "\n    sparsity: 0.5" if method == "magnitude" else ""
    text = TINY_RECIPE.format(factory="tiny_net").replace("budget: {max_drop: 0.0}", "budget: {max_drop: 1.0}") + f"  prune:\n    method: \"{method}\"{sparsity}\n"
    result = build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / method)
    report = result.manifest["prune"]
    assert report["method"] == method and report["achieved_sparsity"] >= 0.3
    assert any("dense" in note for note in report["notes"])
    if method == "2:4":
        assert report["sparse_2_4"] is True


def test_prune_options_are_validated(tiny_recipe):
    text = TINY_RECIPE.format(factory="tiny_net") + "  prune:\n    method: magnitude\n"
    with pytest.raises(RecipeError, match=r"prune method 'magnitude' needs sparsity"):
        load_recipe(tiny_recipe(text=text))
    text = TINY_RECIPE.format(factory="tiny_net") + "  prune:\n    method: \"2:4\"\n    norm: l1\n"
    with pytest.raises(RecipeError, match=r"norm and round_to apply only to method 'channel'"):
        load_recipe(tiny_recipe(text=text))


def _pruned_tiny(sparsity: float = 0.8) -> str:
    return (TINY_RECIPE.format(factory="tiny_net").replace("budget: {max_drop: 0.0}", "budget: {max_drop: 1.0}")
            + f"  prune:\n    method: magnitude\n    sparsity: {sparsity}\n")


def test_golden_outputs_are_the_pruned_models(tiny_recipe, tmp_path):
    """The bundle runs the pruned model: golden outputs from the unpruned one widened the self-check's tolerance to the
    whole pruning error (atol 0.257, min_cosine 0), so it could no longer catch a broken engine."""
    import numpy as np

    from tests.fixtures.tiny_models import tiny_net

    result = build(tiny_recipe(text=_pruned_tiny()), "x86-64-cpu", out=tmp_path / "b")
    golden = result.manifest["golden"]
    assert golden["atol"] == result.manifest["golden"]["outputs"]["logits"]["atol"] <= 1e-4
    assert golden["min_cosine"] >= 0.9999 and not golden.get("warnings")
    expected = np.load(result.bundle_dir / golden["batches"][0]["outputs"])["logits"]
    feeds = np.load(result.bundle_dir / golden["batches"][0]["inputs"])
    unpruned = tiny_net().eval()(__import__("torch").from_numpy(feeds["image"])).detach().numpy()
    assert np.abs(expected - unpruned).max() > 1e-2  # not the unpruned model's outputs
    assert result.manifest["accuracy"]["reference_source"] == "pytorch-fp32"  # the budget stays the unpruned model's


def test_auto_search_judges_candidates_against_the_unpruned_model(tiny_recipe, tmp_path):
    """The evaluate stage measures the budget from the unpruned model; the search must too, or it gives the whole budget
    to quantization on top of the pruning's loss."""
    manifest = build(tiny_recipe(text=_auto_pruned_tiny(0.99)), "x86-64-cpu", precision="auto", out=tmp_path / "b").manifest
    auto = manifest["quantization"]["auto"]
    assert auto["reference"] == "pytorch-fp32 (unpruned model)"
    [chosen] = [row for row in auto["candidates"] if row["status"] == "chosen"]
    assert chosen["value"] == pytest.approx(manifest["accuracy"]["value"], abs=1e-4) and chosen["value"] < 0.999


def test_auto_search_fails_when_pruning_alone_spends_the_budget(tiny_recipe, tmp_path):
    """Pruning at 0.3 costs tiny_net about 0.005 cosine: against the pruned graph every FP32-like candidate scored 1.0 and
    passed 0.999, and the build then failed at evaluate; the search now says the budget is out of reach itself."""
    with pytest.raises(QuantizationError) as info:
        build(tiny_recipe(text=_auto_pruned_tiny(0.999)), "x86-64-cpu", precision="auto", out=tmp_path / "b")
    assert ("meets the recipe's evaluation.budget (measured against pytorch-fp32 (unpruned model), as the evaluate stage does)"
            in str(info.value))


def _auto_pruned_tiny(min_cosine: float) -> str:
    return (TINY_RECIPE.format(factory="tiny_net")
            .replace('  evaluation: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}',
                     '  evaluation: {callable: "tests.fixtures.tiny_models:tiny_batches"}\n'
                     '  calibration: {callable: "tests.fixtures.tiny_models:tiny_batches"}')
            .replace("metric: top1\n  budget: {max_drop: 0.0}", f"metric: cosine\n  budget: {{min_value: {min_cosine}}}")
            + "  prune:\n    method: magnitude\n    sparsity: 0.3\n")


@pytest.mark.parametrize("kind", ["torchscript", "exported_program"])
def test_compiled_sources_cannot_be_pruned(kind, tiny_recipe, tmp_path):
    import torch

    from tests.fixtures.tiny_models import TinyNet

    if kind == "torchscript":
        torch.jit.save(torch.jit.script(TinyNet().eval()), str(tmp_path / "tiny.pt"))
        lines = "kind: torchscript\n  path: tiny.pt"
    else:
        torch.export.save(torch.export.export(TinyNet().eval(), (torch.rand(4, 1, 4, 4),)), str(tmp_path / "tiny.pt2"))
        lines = "kind: exported_program\n  path: tiny.pt2"
    text = _pruned_tiny(0.5).replace("kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net", lines)
    recipe = tiny_recipe(text=text)
    with pytest.raises(BuildError) as info:
        build(recipe, "x86-64-cpu", out=tmp_path / "b")
    assert str(info.value).startswith(f"{recipe}: build.prune (magnitude) cannot prune model.kind {kind}: it loads ")
    assert info.value.hint == ("use model.kind: factory (a callable returning the eager nn.Module, with its weights loaded), "
                               "or remove build.prune")


def test_a_factory_returning_an_exported_graph_module_cannot_be_pruned(tiny_recipe):
    import torch

    from edgekit.prune.stage import prune_for_build
    from edgekit.sources.base import LoadedModel
    from tests.fixtures.tiny_models import TinyNet

    recipe = load_recipe(tiny_recipe(text=_pruned_tiny(0.5)))
    graph = torch.export.export(TinyNet().eval(), (torch.rand(4, 1, 4, 4),)).module()
    with pytest.raises(BuildError, match=r"cannot prune model.kind factory: it loads a traced GraphModule with no nn.Conv\*/nn.Linear"):
        prune_for_build(recipe, LoadedModel("factory", "test", module=graph), [])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'0.5'", "sparsity must be a number such as 0.5 (above 0, below 1), not a str; write it unquoted, or remove build.prune"),
        ("false", "sparsity must be a number such as 0.5 (above 0, below 1), not a bool"),
        ("0", "sparsity 0 prunes nothing; set a fraction above 0 (e.g. 0.5), or remove build.prune to build without pruning"),
        ("0.0", "sparsity 0 prunes nothing"),
    ],
)
def test_sparsity_is_a_number_above_zero(value, message, tiny_recipe):
    path = tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net") + f"  prune:\n    method: channel\n    sparsity: {value}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert f"{path}:22:5: field 'build.prune.sparsity': " in str(info.value) and message in str(info.value)
