"""The pruner registry, prune_model, fine_tune (masks kept) and their errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from edgekit.errors import PruneError
from edgekit.prune import PRUNERS, PruneReport, fine_tune, get_pruner, prune_model
from edgekit.prune.semi_structured import verify_2_4

from .conftest import seeded


def _small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 4)
    )


def _train(module: nn.Module, steps: int = 5, lr: float = 0.05, optimizer: str = "adam") -> nn.Module:
    """A fine-tune callable: a few real optimizer steps on random data."""
    generator = torch.Generator().manual_seed(0)
    opt_cls = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    opt = opt_cls(module.parameters(), lr=lr)
    module.train()
    for _ in range(steps):
        opt.zero_grad()
        loss = module(torch.randn(8, 4, 4, 4, generator=generator)).pow(2).mean()
        loss.backward()
        opt.step()
    return module.eval()


def _vandalise(module: nn.Module) -> nn.Module:
    """A fine-tune callable that writes every weight, zeros included."""
    with torch.no_grad():
        for param in module.parameters():
            param.add_(1.0)
    return module


def test_registry_names_and_every_entry_runs():
    assert list(PRUNERS) == ["magnitude", "channel", "2:4"]
    inputs = torch.randn(2, 4, 4, 4)
    for name, pruner in PRUNERS.items():
        model = seeded(_small_cnn)
        sparsity = None if name == "2:4" else 0.5
        pruned, report = prune_model(model, name, sparsity, inputs)
        assert isinstance(report, PruneReport) and report.method == name == pruner.name
        assert pruned(inputs).shape == (2, 4)
        assert (pruned is model) == (not pruner.needs_example_inputs)
        json.dumps(report.to_dict())  # the manifest can carry it
    assert get_pruner("2:4").keeps_masks and get_pruner("magnitude").keeps_masks and not get_pruner("channel").keeps_masks


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(PruneError) as info:
        prune_model(nn.Linear(4, 4), "lottery", 0.5)
    text = str(info.value)
    assert text.startswith("unknown prune method 'lottery'; known methods: 'magnitude' (")
    assert "'channel' (" in text and "'2:4' (" in text
    assert "set prune.method in the recipe to one of ['magnitude', 'channel', '2:4']" in text


def test_unknown_option_is_an_error():
    with pytest.raises(PruneError, match=r"prune method 'magnitude' does not take option\(s\) \['round_to'\]; it accepts none"):
        prune_model(nn.Linear(4, 4), "magnitude", 0.5, round_to=8)
    with pytest.raises(PruneError, match=r"prune method 'channel' does not take option\(s\) \['bias'\]; it accepts \['norm', 'round_to'\]"):
        prune_model(nn.Linear(4, 4), "channel", 0.5, torch.zeros(1, 4), bias=True)


@pytest.mark.parametrize("method", ["magnitude", "2:4"])
@pytest.mark.parametrize("callable_ref", [_train, _vandalise])
def test_fine_tune_keeps_the_masks(method, callable_ref):
    model = seeded(_small_cnn)
    model, report = prune_model(model, method, None if method == "2:4" else 0.6)
    zero_before = {name: layer.weight.detach() == 0 for name, layer in model.named_modules() if name in report.per_layer_sparsity}
    weights_before = {name: model.get_submodule(name).weight.detach().clone() for name in zero_before}

    tuned, tuned_report = fine_tune(model, callable_ref, report=report)

    for name, was_zero in zero_before.items():
        weight = tuned.get_submodule(name).weight.detach()
        assert bool((weight[was_zero] == 0).all()), name
        assert not torch.equal(weight, weights_before[name]), f"{name} was not trained"
    assert tuned_report.achieved_sparsity >= report.achieved_sparsity - 1e-9
    assert tuned_report.fine_tune.endswith(callable_ref.__name__)
    assert f"sparsity masks of {len(zero_before)} layers re-applied" in tuned_report.notes[-1]
    if method == "2:4":
        assert verify_2_4(tuned) == []
    # the gradient masks are gone once fine-tuning is over
    assert all(not getattr(p, "_backward_hooks", None) for p in tuned.parameters())


def test_gradient_masks_hold_zeros_during_training():
    """Without the final re-apply the zeros would still hold: their gradients are masked while fn runs."""
    model = seeded(_small_cnn)
    model, report = prune_model(model, "magnitude", 0.5)
    seen = {}

    def check_inside(module: nn.Module) -> nn.Module:
        _train(module, steps=3, optimizer="sgd")
        seen["sparsity"] = float((module[0].weight == 0).float().mean())
        return module

    fine_tune(model, check_inside, report=report)
    assert seen["sparsity"] == pytest.approx(report.per_layer_sparsity["0"])


def test_fine_tune_after_channel_pruning_needs_no_masks():
    inputs = torch.randn(2, 4, 4, 4)
    model, report = prune_model(seeded(_small_cnn), "channel", 0.5, inputs)
    tuned, tuned_report = fine_tune(model, _train, {"steps": 2}, report=report)
    assert tuned is model and tuned_report.notes[-1].endswith("_train")
    assert tuned_report.params_after == report.params_after


def test_fine_tune_errors_say_what_went_wrong():
    model, report = prune_model(seeded(_small_cnn), "magnitude", 0.5)
    with pytest.raises(PruneError, match=r"fine-tune callable '.*<lambda>' returned int, not a torch.nn.Module"):
        fine_tune(model, lambda m: 3, report=report)
    with pytest.raises(PruneError, match=r"fine-tune callable '.*_train' raised TypeError: .*unexpected keyword argument 'epochs'") as info:
        fine_tune(model, _train, {"epochs": 2}, report=report)
    assert "prune.fine_tune.kwargs" in str(info.value)
    with pytest.raises(PruneError, match=r"prune.fine_tune.callable: expected 'package.module:function' or a callable, got 'train'"):
        fine_tune(model, "train", report=report)
    with pytest.raises(PruneError, match=r"prune.fine_tune.callable: cannot import module 'no_such_pkg.mod' for 'no_such_pkg.mod:fn'"):
        fine_tune(model, "no_such_pkg.mod:fn", report=report)
    with pytest.raises(PruneError, match=r"module 'edgekit.demos.digits_finetune' has no attribute 'tune'"):
        fine_tune(model, "edgekit.demos.digits_finetune:tune", report=report)
    with pytest.raises(PruneError, match="prune.fine_tune.kwargs must be a mapping of keyword arguments, got list"):
        fine_tune(model, _train, [1], report=report)  # type: ignore[arg-type]
    with pytest.raises(PruneError, match=r"changed the weight of '0' from \(8, 4, 3, 3\) to \(2, 4, 3, 3\)"):
        fine_tune(model, lambda m: nn.Sequential(nn.Conv2d(4, 2, 3)), report=report)
    with pytest.raises(PruneError, match="the prune report names layer '0' but the module has no such submodule"):
        fine_tune(nn.Sequential(), _train, report=report)


def test_fine_tune_callable_next_to_the_recipe(tmp_path):
    (tmp_path / "my_tuning.py").write_text("def tune(module, scale=1.0):\n    return module\n")
    model, report = prune_model(seeded(_small_cnn), "magnitude", 0.5)
    tuned, tuned_report = fine_tune(model, "my_tuning:tune", {"scale": 2.0}, report=report, search_dir=tmp_path)
    assert tuned is model and tuned_report.fine_tune == "my_tuning:tune"
    del sys.modules["my_tuning"]  # imported from tmp_path above; without search_dir it is not found
    with pytest.raises(PruneError, match="cannot import module 'my_tuning'"):
        fine_tune(model, "my_tuning:tune", report=report)


def test_importing_the_package_does_not_import_torch():
    code = "import sys, edgekit.prune; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
