"""2:4 sparsity: the pattern on every eligible layer, the TensorRT conv layout, skipped layers, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgekit.errors import PruneError
from edgekit.prune.semi_structured import prune_2_4, run, verify_2_4

from .conftest import TiedLM, seeded


def _groups_along_input_channels(weight: torch.Tensor) -> torch.Tensor:
    """[out, in, kh, kw] -> [out*kh*kw*(in/4), 4]: 4 consecutive input channels at one kernel position."""
    per_position = weight.permute(0, 2, 3, 1) if weight.dim() == 4 else weight
    return per_position.reshape(-1, 4)


def test_pattern_holds_on_every_eligible_digits_layer(digits_model):
    dense = {n: m.weight.detach().clone() for n, m in digits_model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    assert len(verify_2_4(digits_model)) == 4  # dense weights break the pattern everywhere it applies

    report = prune_2_4(digits_model)

    assert verify_2_4(digits_model) == []
    assert report.sparse_2_4 is True and report.method == "2:4" and report.target_sparsity == 0.5
    assert [(s.name, s.kind) for s in report.skipped] == [("features.0", "Conv2d")]
    assert "in_channels per group = 1) is not a multiple of 4" in report.skipped[0].reason
    assert torch.equal(digits_model.features[0].weight, dense["features.0"])  # skipped layer untouched
    assert {r.name for r in report.layers} == {"features.2", "features.5", "classifier.1", "classifier.3"}
    for record in report.layers:
        weight = digits_model.get_submodule(record.name).weight.detach()
        groups = _groups_along_input_channels(weight)
        assert bool(((groups != 0).sum(dim=1) <= 2).all())
        assert record.sparsity == pytest.approx(0.5)
        # the two kept entries of each group are its two largest magnitudes
        original = _groups_along_input_channels(dense[record.name]).abs()
        kept = (groups != 0)
        assert torch.all(original[kept].view(-1, 2).min(dim=1).values >= original[~kept].view(-1, 2).max(dim=1).values)
    assert report.achieved_sparsity == pytest.approx(0.5)
    assert any("kSPARSE_WEIGHTS" in note for note in report.notes)
    assert any("features.0" in note for note in report.notes)
    assert report.to_dict()["sparse_2_4"] is True


def test_linear_keeps_the_two_largest_of_each_group():
    layer = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -4.0, 3.0, 0.5, 0.0, 0.0, -2.0, 0.25]]))
    prune_2_4(nn.Sequential(layer))
    assert layer.weight.tolist() == [[0.0, -4.0, 3.0, 0.0, 0.0, 0.0, -2.0, 0.25]]


def test_conv_groups_run_along_input_channels_at_each_kernel_position():
    model = seeded(lambda: nn.Sequential(nn.Conv2d(8, 3, kernel_size=3)))
    prune_2_4(model)
    weight = model[0].weight.detach()
    per_position = (weight != 0).view(3, 2, 4, 3, 3).sum(dim=2)  # [out, in-group, kh, kw]
    assert bool((per_position == 2).all())
    assert verify_2_4(model) == []


def test_skipped_layers_are_listed_and_dense_violations_described():
    model = seeded(
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 1),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ConvTranspose2d(8, 4, 2),
            nn.Flatten(),
            nn.Linear(4 * 8 * 8, 6),
            nn.Linear(6, 2),
        )
    )
    violations = verify_2_4(model)
    assert [v.layer for v in violations] == ["1", "4"]
    text = str(violations[0])
    assert text.startswith("1: 144 of 144 groups of 4 have more than 2 nonzero weights")
    assert "first: output 0, kernel position (0, 0), inputs 0..3 hold 4 nonzeros" in text

    report = prune_2_4(model)
    assert verify_2_4(model) == []
    reasons = {s.name: s.reason for s in report.skipped}
    assert set(reasons) == {"0", "2", "5"}
    assert "in_channels per group = 3" in reasons["0"]
    assert "transposed convolution" in reasons["2"]
    assert "in_features = 6) is not a multiple of 4" in reasons["5"]


def test_nothing_eligible_is_an_error():
    with pytest.raises(PruneError, match=r"prune method '2:4': no layer of Sequential can hold the 2:4 pattern \(0: reduction dimension"):
        prune_2_4(nn.Sequential(nn.Linear(3, 8)))


@pytest.mark.parametrize("bad", [0.3, 0.75, True])
def test_sparsity_other_than_half_is_an_error(bad):
    with pytest.raises(PruneError, match=r"sparsity is fixed at 0.5 by the 2:4 pattern") as info:
        run(nn.Linear(8, 8), bad)
    assert "method 'magnitude'" in str(info.value)
    module, report = run(nn.Linear(8, 8), 0.5)
    assert report.sparse_2_4 and verify_2_4(module) == []


def test_a_linear_tied_to_an_embedding_keeps_the_embedding_dense():
    model = seeded(TiedLM)
    embedding = model.emb.weight.detach().clone()
    report = prune_2_4(model)
    assert torch.equal(model.emb.weight, embedding)
    assert [record.name for record in report.layers] == ["mid"]
    assert {item.name: item.reason for item in report.skipped}["head"].startswith("its weight is tied to 'emb' (Embedding)")


def test_newly_zeroed_is_recorded():
    model = seeded(TiedLM)
    report = prune_2_4(model)
    assert report.newly_zeroed == 32 and report.to_dict()["newly_zeroed"] == 32  # half of mid's 8x8, none zero before
    assert not any("already zero" in note or "zeroed no weight" in note for note in report.notes)
    again = prune_2_4(model)  # the pattern is there already: nothing left to zero, and the report says so
    assert again.newly_zeroed == 0 and any(note.startswith("pruning zeroed no weight: 32 of the 64 weights") for note in again.notes)
