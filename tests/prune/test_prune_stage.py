"""Pruning inside the build: the manifest records it, accuracy is measured against the unpruned model."""

from __future__ import annotations

import onnx
import pytest

from edgekit.errors import RecipeError
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
