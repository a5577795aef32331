"""Global magnitude pruning: exact sparsity, zeros at the smallest weights, plain tensors, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from edgekit.errors import PruneError
from edgekit.prune.magnitude import DENSE_KERNEL_NOTE, magnitude_prune

from .conftest import seeded


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


@pytest.mark.parametrize("sparsity", [0.3, 0.6, 0.9])
def test_hits_target_and_zeros_the_smallest_magnitudes(digits_model, sparsity):
    before = _weights(digits_model)
    biases = {name: m.bias.detach().clone() for name, m in digits_model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    keys = set(digits_model.state_dict())

    report = magnitude_prune(digits_model, sparsity)

    after = _weights(digits_model)
    total = sum(w.numel() for w in after.values())
    zeros = sum(int((w == 0).sum()) for w in after.values())
    assert abs(zeros / total - sparsity) <= 0.01
    assert abs(report.achieved_sparsity - sparsity) <= 0.01
    # one global threshold: every zeroed weight was no larger than every kept one
    zeroed = torch.cat([before[n][after[n] == 0].abs() for n in before])
    kept = torch.cat([before[n][after[n] != 0].abs() for n in before])
    assert float(zeroed.max()) <= float(kept.min())
    assert torch.equal(torch.cat([after[n][after[n] != 0] for n in after]), torch.cat([before[n][after[n] != 0] for n in before]))
    # biases untouched, no reparametrization left behind: export sees the same plain tensors
    for name, bias in biases.items():
        assert torch.equal(digits_model.get_submodule(name).bias, bias)
    assert set(digits_model.state_dict()) == keys
    assert not any(hasattr(m, "weight_orig") or m._forward_pre_hooks for m in digits_model.modules())

    assert report.method == "magnitude" and report.target_sparsity == sparsity
    assert set(report.per_layer_sparsity) == set(before)
    assert report.params_after == report.params_before == sum(p.numel() for p in digits_model.parameters())
    assert report.nonzero_params_before - report.nonzero_params_after == zeros
    for record in report.layers:
        assert record.action == "zeroed" and record.weight_shape_after == record.weight_shape_before
        assert record.sparsity == pytest.approx(float((after[record.name] == 0).float().mean()))
    assert DENSE_KERNEL_NOTE in report.notes and "does not speed up dense kernels" in DENSE_KERNEL_NOTE
    assert [s.name for s in report.skipped] == []  # the digits CNN has only Conv/Linear parameters


def test_threshold_is_global_not_per_layer():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(0.01)  # all small: should all go first
        model[1].weight.copy_(torch.arange(1.0, 17.0).view(4, 4))
    report = magnitude_prune(model, 0.5)
    assert int((model[0].weight == 0).sum()) == 16 and int((model[1].weight == 0).sum()) == 0
    assert report.per_layer_sparsity == {"0": 1.0, "1": 0.0}


def test_sparsity_zero_changes_nothing_and_non_weight_layers_are_listed():
    model = seeded(lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = magnitude_prune(model, 0.0)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert report.achieved_sparsity == 0.0
    assert [(s.name, s.kind) for s in report.skipped] == [("1", "BatchNorm2d")]
    assert "not a Conv/Linear layer" in report.skipped[0].reason


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), "0.5", True, None])
def test_bad_sparsity_is_an_error(bad):
    model = nn.Linear(4, 4)
    with pytest.raises(PruneError, match=r"prune method 'magnitude': sparsity must be a number in \[0, 1\)") as info:
        magnitude_prune(model, bad)
    assert "prune.sparsity" in str(info.value)


def test_model_without_conv_or_linear_is_an_error():
    with pytest.raises(PruneError, match="Sequential has no Conv or Linear layer to prune"):
        magnitude_prune(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)), 0.5)


def test_torch_prune_reparametrization_is_refused_with_the_fix():
    model = nn.Sequential(nn.Linear(4, 4))
    torch_prune.l1_unstructured(model[0], "weight", amount=0.5)
    with pytest.raises(PruneError, match=r"layer '0' carries a torch.nn.utils.prune reparametrization") as info:
        magnitude_prune(model, 0.5)
    assert "torch.nn.utils.prune.remove" in str(info.value)


def test_nan_weights_are_an_error_naming_the_layer():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    with pytest.raises(PruneError, match=r"layers \['1'\] have NaN or infinite weights"):
        magnitude_prune(model, 0.5)
