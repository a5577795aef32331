"""Global magnitude pruning: exact sparsity, zeros at the smallest weights, plain tensors, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from edgekit.errors import PruneError
from edgekit.prune.magnitude import DENSE_KERNEL_NOTE, magnitude_prune

from .conftest import TiedLM, seeded


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


def test_a_linear_tied_to_an_embedding_is_left_alone_and_says_why():
    """Zeroing the head would zero the embedding it shares its Parameter with, while the report called it skipped."""
    model = seeded(TiedLM)
    embedding = model.emb.weight.detach().clone()
    report = magnitude_prune(model, 0.5)
    assert torch.equal(model.emb.weight, embedding) and model.head.weight is model.emb.weight
    assert [record.name for record in report.layers] == ["mid"]
    reasons = {item.name: item.reason for item in report.skipped}
    assert reasons["head"] == ("its weight is tied to 'emb' (Embedding); pruning it would change that module too, "
                               "so both keep their weights")


def test_only_tied_layers_is_an_error_that_names_the_tie():
    class HeadOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(ids))

    with pytest.raises(PruneError, match=r"has no Conv or Linear layer to prune \(head: its weight is tied to 'emb' \(Embedding\)"):
        magnitude_prune(seeded(HeadOnly), 0.5)


def test_an_already_sparse_checkpoint_reports_that_nothing_was_zeroed(digits_model):
    """Asked for 0.5 of a checkpoint already 60% zero: 'achieved 0.6' alone would read as if pruning did it."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in digits_model.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                layer.weight.mul_((torch.rand(layer.weight.shape, generator=generator) > 0.6).to(layer.weight.dtype))
    before = _weights(digits_model)
    report = magnitude_prune(digits_model, 0.5)
    assert all(torch.equal(before[name], weight) for name, weight in _weights(digits_model).items())
    assert report.newly_zeroed == 0 and report.to_dict()["newly_zeroed"] == 0
    assert report.achieved_sparsity > 0.55
    [note] = [note for note in report.notes if note.startswith("pruning zeroed no weight")]
    assert f"achieved sparsity {report.achieved_sparsity:.3f} is the checkpoint's own and the model is unchanged" in note
    assert "raise prune.sparsity above" in note


def test_newly_zeroed_counts_only_what_the_pass_zeroed(digits_model):
    with torch.no_grad():
        digits_model.classifier[3].weight[0].zero_()  # a few zeros already there
    already = sum(int((w == 0).sum()) for w in _weights(digits_model).values())
    report = magnitude_prune(digits_model, 0.5)
    total = sum(w.numel() for w in _weights(digits_model).values())
    assert report.newly_zeroed == round(0.5 * total) - already
    assert any(f"{report.newly_zeroed} weights newly zeroed; {already} of the {total} were already zero" in n for n in report.notes)
