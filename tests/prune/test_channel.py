"""Structured channel pruning: a really smaller model, exact index bookkeeping, safe refusals."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgekit.demos.digits_cnn import evaluation_batches
from edgekit.demos.digits_finetune import fine_tune_digits
from edgekit.errors import InternalError, PruneError, RecipeError
from edgekit.prune import fine_tune
from edgekit.prune.channel import channel_prune, channels_to_keep, strongest_channels

from .conftest import ResidualNet, TiedLM, seeded


def _export(model: nn.Module, batch: torch.Tensor) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter is fine (and fast) here
        torch.onnx.export(
            model, (batch,), buffer, dynamo=False, opset_version=17,
            input_names=["image"], output_names=["logits"], dynamic_axes={"image": {0: "batch"}},
        )  # fmt: skip
    return onnx.load_from_string(buffer.getvalue())


def _initializer_sizes(model: onnx.ModelProto) -> dict[str, int]:
    return {init.name: int(np.prod(init.dims)) for init in model.graph.initializer}


def _top1(model: nn.Module) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in evaluation_batches():
            predicted = model(torch.from_numpy(batch["image"])).argmax(dim=1).numpy()
            correct += int((predicted == batch["labels"]).sum())
            total += len(predicted)
    return correct / total


def test_half_the_channels_of_the_digits_cnn(digits_model, digits_batch):
    original_state = {k: v.clone() for k, v in digits_model.state_dict().items()}
    top1_before = _top1(digits_model)

    pruned, report = channel_prune(digits_model, 0.5, digits_batch)

    # the input model is untouched; the copy is really smaller and keeps its output shape
    assert all(torch.equal(original_state[k], v) for k, v in digits_model.state_dict().items())
    assert [m.out_channels for m in pruned.features if isinstance(m, nn.Conv2d)] == [16, 32, 64]
    assert [m.in_channels for m in pruned.features if isinstance(m, nn.Conv2d)] == [1, 16, 32]
    assert (pruned.classifier[1].in_features, pruned.classifier[1].out_features) == (64 * 2 * 2, 64)
    assert (pruned.classifier[3].in_features, pruned.classifier[3].out_features) == (64, 10)
    assert pruned(torch.zeros(7, 1, 8, 8)).shape == (7, 10)
    assert report.params_before == sum(p.numel() for p in digits_model.parameters())
    assert report.params_after == sum(p.numel() for p in pruned.parameters()) < report.params_before / 3
    assert report.layer("features.5").weight_shape_before == (128, 64, 3, 3)
    assert report.layer("features.5").weight_shape_after == (64, 32, 3, 3)
    assert report.layer("features.5").action == "outputs+inputs"
    assert report.layer("classifier.3").action == "inputs"
    assert report.layer("features.2").params_after == 32 * 16 * 9 + 32
    assert [s.name for s in report.skipped] == ["classifier.3"]
    assert "returned by the model" in report.skipped[0].reason
    assert report.achieved_sparsity == pytest.approx(1 - (144 + 4608 + 18432 + 16384 + 640) / 159264)

    # the ONNX graph is smaller and runs the same numbers
    before, after = _initializer_sizes(_export(digits_model, digits_batch)), _initializer_sizes(_export(pruned, digits_batch))
    assert sum(after.values()) == report.params_after and sum(before.values()) == report.params_before
    assert max(after.values()) < max(before.values())
    session = ort.InferenceSession(_export(pruned, digits_batch).SerializeToString(), providers=["CPUExecutionProvider"])
    images = next(iter(evaluation_batches(batch=64)))["image"]
    (onnx_logits,) = session.run(None, {"image": images})
    with torch.no_grad():
        np.testing.assert_allclose(onnx_logits, pruned(torch.from_numpy(images)).numpy(), rtol=1e-4, atol=1e-4)

    # a few epochs of the demo's fine-tune bring held-out top-1 back within 1 point
    tuned, tuned_report = fine_tune(pruned, "edgekit.demos.digits_finetune:fine_tune_digits", {"epochs": 3}, report=report)
    top1_after = _top1(tuned)
    assert top1_after >= top1_before - 0.01, (top1_before, top1_after)
    assert tuned_report.fine_tune == "edgekit.demos.digits_finetune:fine_tune_digits"
    assert tuned_report.params_after == report.params_after
    assert "fine-tuned by edgekit.demos.digits_finetune:fine_tune_digits" in tuned_report.notes[-1]


class _DeadChannelNet(nn.Module):
    """conv -> BN -> relu -> conv -> BN -> relu -> view(batch, -1) -> linear -> BN1d -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc1, self.bn3 = nn.Linear(16 * 4 * 4, 32), nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = x.view(x.size(0), -1)
        return self.fc2(F.relu(self.bn3(self.fc1(x))))


def test_removing_dead_channels_keeps_outputs_exactly():
    """Half the channels of every producer output exactly zero; pruning half must remove exactly
    those, so the outputs cannot change: this checks the BatchNorm, flatten-block and view bookkeeping."""
    model = seeded(_DeadChannelNet)
    generator = torch.Generator().manual_seed(1)
    dead = {}
    with torch.no_grad():
        for conv, bn in ((model.conv1, model.bn1), (model.conv2, model.bn2), (model.fc1, model.bn3)):
            bn.running_mean.uniform_(-1, 1, generator=generator)
            bn.running_var.uniform_(0.5, 2, generator=generator)
            bn.weight.uniform_(0.5, 2, generator=generator)
            bn.bias.uniform_(-0.5, 0.5, generator=generator)
            index = torch.randperm(conv.weight.shape[0], generator=generator)[: conv.weight.shape[0] // 2]
            conv.weight[index] = 0
            conv.bias[index] = 0
            bn.running_mean[index] = 0
            bn.bias[index] = 0
            dead[conv] = index
    inputs = torch.randn(6, 3, 8, 8, generator=generator)
    with torch.no_grad():
        expected = model(inputs)

    pruned, report = channel_prune(model, 0.5, inputs)

    assert (pruned.conv1.out_channels, pruned.bn1.num_features, pruned.conv2.in_channels) == (8, 8, 8)
    assert (pruned.fc1.in_features, pruned.bn3.num_features, pruned.fc2.in_features) == (8 * 4 * 4, 16, 16)
    assert report.layer("bn1").action == "features" and report.layer("bn3").weight_shape_after == (16,)
    with torch.no_grad():
        torch.testing.assert_close(pruned(inputs), expected, rtol=1e-5, atol=1e-5)
    assert not pruned.training and not model.training


def test_residual_add_layers_are_left_unpruned_and_listed():
    model = seeded(ResidualNet)
    model.train()
    running_mean = model.bn_a.running_mean.clone()
    pruned, report = channel_prune(model, 0.5, torch.randn(2, 1, 8, 8))

    reasons = {s.name: s.reason for s in report.skipped}
    assert set(reasons) == {"stem", "conv_b", "head"}
    assert "residual add" in reasons["stem"] and "residual add" in reasons["conv_b"]
    assert "returned by the model" in reasons["head"]
    assert (pruned.stem.out_channels, pruned.conv_b.out_channels, pruned.bn_b.num_features) == (8, 8, 8)
    assert (pruned.conv_a.out_channels, pruned.bn_a.num_features, pruned.conv_b.in_channels) == (8, 8, 8)
    assert pruned(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    # training mode is kept, and tracing did not update BatchNorm statistics
    assert pruned.training and pruned.bn_a.training
    assert torch.equal(model.bn_a.running_mean, running_mean)


class _Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Conv2d(1, 4, 1), nn.Conv2d(1, 4, 1), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.a(x), self.b(x)], dim=1))


class _Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.depthwise, self.head = nn.Conv2d(1, 8, 1), nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.depthwise(self.conv(x)))


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.twice, self.head = nn.Conv2d(1, 8, 1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.twice(self.twice(self.conv(x))))


class _HardCodedView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).view(-1, 128))


class _Unknown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(1, 8, 1), nn.GroupNorm(2, 8), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)))


@pytest.mark.parametrize(
    ("factory", "layer", "reason"),
    [
        (_Concat, "a", "meets another tensor at node 'cat' (concatenation)"),
        (_Grouped, "conv", "consumer 'depthwise' is a grouped convolution (groups=8)"),
        (_Shared, "conv", "consumer 'twice' is called 2 times in forward"),
        (_HardCodedView, "conv", "reshaped at node 'view' into a layout other than [batch, -1]"),
        (_Unknown, "conv", "passes through module 'norm' (GroupNorm), which the channel pruner does not understand"),
    ],
)
def test_structures_it_does_not_understand_are_left_alone(factory, layer, reason):
    model = seeded(factory)
    inputs = torch.randn(2, 1, 4, 4)
    with torch.no_grad():
        shape = model(inputs).shape
    with pytest.raises(PruneError, match="no layer of .* can lose channels safely") as info:
        channel_prune(model, 0.5, inputs)
    assert f"{layer}: " in str(info.value) and reason in str(info.value)
    assert "method 'magnitude' or '2:4'" in str(info.value)
    with torch.no_grad():
        assert model(inputs).shape == shape


def test_round_to_and_keep_counts(digits_model, digits_batch):
    assert [channels_to_keep(32, r) for r in (0.0, 0.5, 0.6, 0.99)] == [32, 16, 13, 1]
    assert [channels_to_keep(32, 0.6, round_to=8), channels_to_keep(4, 0.5, round_to=8)] == [16, 4]
    pruned, report = channel_prune(digits_model, 0.6, digits_batch, round_to=8)
    assert [m.out_channels for m in pruned.features if isinstance(m, nn.Conv2d)] == [16, 32, 56]
    assert pruned.classifier[1].out_features == 56
    assert report.options == {"norm": "l1", "round_to": 8}
    _, unchanged = channel_prune(digits_model, 0.0, digits_batch)
    assert unchanged.params_after == unchanged.params_before
    assert "keeps all 32 channels after rounding" in {s.name: s.reason for s in unchanged.skipped}["features.0"]


def test_l1_and_l2_rank_filters_differently():
    weight = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]])
    assert strongest_channels(weight, 1, "l1").tolist() == [0]
    assert strongest_channels(weight, 1, "l2").tolist() == [1]
    assert strongest_channels(weight, 2, "l1").tolist() == [0, 1]


def test_untraceable_model_is_an_error():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) if x.sum() > 0 else x

    with pytest.raises(PruneError, match="torch.fx cannot trace Branchy") as info:
        channel_prune(Branchy(), 0.5, torch.ones(1, 1, 2, 2))
    assert "data-dependent Python control flow" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"norm": "l3"}, "norm must be one of ['l1', 'l2'], got 'l3'"),
        ({"round_to": 0}, "round_to must be an integer >= 1, got 0"),
        ({"example_inputs": None}, "prune method 'channel' needs example inputs"),
        ({"example_inputs": {"image": torch.zeros(1, 1, 8, 8)}}, "example_inputs is a mapping (['image'])"),
        ({"example_inputs": torch.zeros(1, 3, 8, 8)}, "running DigitsCNN on the example inputs failed"),
        ({"ratio": 1.0}, "ratio (sparsity) must be a number in [0, 1), got 1.0"),
    ],
)
def test_bad_arguments_are_errors(digits_model, digits_batch, kwargs, message):
    arguments = {"ratio": 0.5, "example_inputs": digits_batch, **kwargs}
    ratio, inputs = arguments.pop("ratio"), arguments.pop("example_inputs")
    with pytest.raises(PruneError) as info:
        channel_prune(digits_model, ratio, inputs, **arguments)
    assert message in str(info.value)


def test_numpy_example_inputs_are_accepted(digits_model):
    pruned, _ = channel_prune(digits_model, 0.25, np.zeros((2, 1, 8, 8), dtype=np.float32))
    assert pruned.features[0].out_channels == 24


def test_digits_fine_tune_is_deterministic_and_validates_its_arguments(digits_model, digits_batch):
    first, _ = channel_prune(digits_model, 0.5, digits_batch)
    second, _ = channel_prune(digits_model, 0.5, digits_batch)
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    fine_tune_digits(first, epochs=1)
    fine_tune_digits(second, epochs=1)
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert not first.training
    with pytest.raises(RecipeError, match="'learning_rate' must be a number > 0, got 0") as info:
        fine_tune_digits(first, learning_rate=0)
    assert "prune.fine_tune.kwargs" in str(info.value)
    with pytest.raises(RecipeError, match="'epochs' must be an integer >= 1, got 0"):
        fine_tune_digits(first, epochs=0)


class _TiedPair(nn.Module):
    """p -> q -> a -> b, with b's weight the very Parameter of a: p can lose outputs, q and the tied pair cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.p, self.q, self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(F.relu(self.q(F.relu(self.p(x)))))))


def test_tied_weights_are_not_pruned_and_the_model_only_shrinks():
    """Resizing one holder of a shared Parameter untied it: 288 -> 412 parameters, reported as '-124 removed'."""
    model, inputs = seeded(_TiedPair), torch.rand(2, 16)
    pruned, report = channel_prune(model, 0.25, inputs)
    assert pruned.a.weight is pruned.b.weight and tuple(pruned.a.weight.shape) == (16, 16)
    assert tuple(pruned.p.weight.shape) == (12, 16) and tuple(pruned.q.weight.shape) == (16, 12)
    assert report.params_after < report.params_before
    reasons = {item.name: item.reason for item in report.skipped}
    assert reasons["q"] == "consumer 'a' has its weight tied to 'b' (one shared Parameter); tied weights are not pruned"
    assert reasons["a"] == "producer 'a' has its weight tied to 'b' (one shared Parameter); tied weights are not pruned"


def test_a_producer_tied_to_an_embedding_is_not_pruned():
    model = seeded(TiedLM)
    with pytest.raises(PruneError, match="no layer of TiedLM can lose channels safely") as info:
        channel_prune(model, 0.5, torch.tensor([1, 2, 3]))  # [batch] ids -> [batch, 8] features
    assert "mid: consumer 'head' has its weight tied to 'emb' (one shared Parameter)" in str(info.value)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


def test_a_model_that_grows_is_an_internal_error(monkeypatch):
    """Were a tie missed, the pruned model would hold more parameters than before (288 -> 412): an internal error,
    never a report of negative removal."""
    monkeypatch.setattr("edgekit.prune._channel_graph.parameter_owners", lambda module: {}, raising=False)
    with pytest.raises(InternalError, match=r"channel pruning made _Tied larger \(288 -> 412 parameters\)"):
        channel_prune(seeded(_Tied), 0.25, torch.rand(2, 16))


class _PoolAcrossChannels(nn.Module):
    """MaxPool2d on a rank-3 [N, C, L] tensor takes it as unbatched [C, H, W] and pools over C and L."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.pool, self.conv2, self.head = nn.Conv1d(2, 8, 3, padding=1), nn.MaxPool2d(2), nn.Conv1d(4, 4, 1), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(self.pool(F.relu(self.conv(x)))).flatten(1))


def test_a_pool_of_another_rank_blocks_its_producer_instead_of_breaking_it():
    model, inputs = seeded(_PoolAcrossChannels), torch.rand(2, 2, 8)
    with torch.no_grad():
        expected_shape = model(inputs).shape
    pruned, report = channel_prune(model, 0.5, inputs)
    assert {item.name: item.reason for item in report.skipped}["conv"] == (
        "its output (rank 3) is pooled at node 'pool' by a 2-d pool, in a way that does not keep channels on dim 1"
    )
    assert tuple(pruned.conv.weight.shape) == (8, 2, 3)
    with torch.no_grad():
        assert pruned(inputs).shape == expected_shape
