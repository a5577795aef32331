"""The digits demo: deterministic training, shipped weights, data callables and their errors."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from edgekit.demos import digits_cnn
from edgekit.errors import RecipeError, SourceError

REPO = Path(__file__).resolve().parents[2]


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def one_epoch_model() -> digits_cnn.DigitsCNN:
    return digits_cnn.train_digits_cnn(epochs=1)


def test_split_is_stratified_and_fixed():
    split = digits_cnn.digits_split()
    assert split.train_images.shape == (1297, 1, 8, 8) and split.train_images.dtype == np.float32
    assert split.heldout_images.shape == (500, 1, 8, 8) and split.heldout_labels.dtype == np.int64
    assert split.train_images.min() == 0.0 and split.train_images.max() == 1.0
    per_class = np.bincount(split.heldout_labels, minlength=10)
    assert per_class.min() >= 48 and per_class.max() <= 52  # stratified: about 50 of each digit
    digits_cnn.digits_split.cache_clear()
    again = digits_cnn.digits_split()
    np.testing.assert_array_equal(again.heldout_labels, split.heldout_labels)
    np.testing.assert_array_equal(again.train_images, split.train_images)


def test_training_is_deterministic_and_leaves_torch_settings_alone(one_epoch_model):
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng_state = torch.get_rng_state()
    second = digits_cnn.train_digits_cnn(epochs=1)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.equal(torch.get_rng_state(), rng_state)
    first_state, second_state = one_epoch_model.state_dict(), second.state_dict()
    assert first_state.keys() == second_state.keys()
    for name in first_state:
        assert torch.equal(first_state[name], second_state[name]), name
    other_seed = digits_cnn.train_digits_cnn(epochs=1, seed=1)
    assert not torch.equal(other_seed.state_dict()["classifier.3.weight"], first_state["classifier.3.weight"])


def test_shipped_weights_reach_97_percent_top1():
    assert digits_cnn.SHIPPED_WEIGHTS.is_file()
    assert digits_cnn.SHIPPED_WEIGHTS.stat().st_size < 2 * 1024 * 1024
    model = digits_cnn.load_digits_cnn()
    assert not model.training
    assert digits_cnn.heldout_top1(model) >= 0.97
    logits = model(torch.from_numpy(digits_cnn.sample_batches()[0]["image"]))
    assert logits.shape == (8, 10) and logits.dtype == torch.float32


def test_data_callables_shapes_dtypes_and_labels():
    samples = digits_cnn.sample_batches()
    assert len(samples) == 2
    for batch in samples:
        assert set(batch) == {"image"}
        assert batch["image"].shape == (8, 1, 8, 8) and batch["image"].dtype == np.float32
    calibration = digits_cnn.calibration_batches()
    assert len(calibration) == 8
    assert all(b["image"].shape == (32, 1, 8, 8) and set(b) == {"image"} for b in calibration)
    assert not np.array_equal(calibration[0]["image"], samples[0]["image"][:8].repeat(4, axis=0))

    evaluation = digits_cnn.evaluation_batches()
    assert len(evaluation) == 5
    for batch in evaluation:
        assert set(batch) == {"image", "labels"}
        assert batch["image"].shape == (100, 1, 8, 8) and batch["image"].dtype == np.float32
        assert batch["labels"].shape == (100,) and batch["labels"].dtype == np.int64
    labels = np.concatenate([b["labels"] for b in evaluation])
    np.testing.assert_array_equal(labels, digits_cnn.digits_split().heldout_labels)

    uneven = digits_cnn.evaluation_batches(batch=64)
    assert [len(b["labels"]) for b in uneven] == [64] * 7 + [52]
    # Batches are copies: editing one does not change the cached split.
    uneven[0]["image"][:] = -1.0
    assert digits_cnn.digits_split().heldout_images.min() == 0.0


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: digits_cnn.sample_batches(batch=0), "sample_batches: 'batch' must be an integer >= 1, got 0"),
        (lambda: digits_cnn.calibration_batches(count=-2), "calibration_batches: 'count' must be an integer >= 1, got -2"),
        (lambda: digits_cnn.evaluation_batches(batch="100"), "evaluation_batches: 'batch' must be an integer >= 1, got '100'"),
        (lambda: digits_cnn.sample_batches(batch=True), "'batch' must be an integer >= 1, got True"),
        (
            lambda: digits_cnn.calibration_batches(batch=64, count=30),
            "batch=64 x count=30 needs 1920 items but the digits training split has only 1297",
        ),
    ],
)
def test_bad_data_kwargs_raise_recipe_errors(call, expected):
    with pytest.raises(RecipeError) as info:
        call()
    assert expected in str(info.value)
    assert "hint:" in str(info.value)


def test_missing_explicit_weights_is_an_error(tmp_path):
    with pytest.raises(SourceError, match=r"weights file not found: .*nope\.pt") as info:
        digits_cnn.load_digits_cnn(weights=str(tmp_path / "nope.pt"))
    assert "model.kwargs.weights" in str(info.value)


def test_corrupt_weights_are_an_error(tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"features.0.weight": torch.zeros(3)}, bad)
    with pytest.raises(SourceError, match=r"cannot load weights from .*bad\.pt") as info:
        digits_cnn.load_digits_cnn(weights=str(bad))
    assert "scripts/train_digits_cnn.py" in str(info.value)


def test_missing_shipped_weights_trains_in_memory_with_a_warning(tmp_path, monkeypatch, caplog, one_epoch_model):
    real_train = digits_cnn.train_digits_cnn
    monkeypatch.setattr(digits_cnn, "SHIPPED_WEIGHTS", tmp_path / "missing.pt")
    monkeypatch.setattr(digits_cnn, "train_digits_cnn", lambda: real_train(epochs=1))
    with caplog.at_level(logging.WARNING, logger="edgekit.demos.digits_cnn"):
        model = digits_cnn.load_digits_cnn()
    assert "training in memory" in caplog.text and "missing.pt" in caplog.text
    assert not model.training
    assert torch.equal(model.state_dict()["classifier.3.weight"], one_epoch_model.state_dict()["classifier.3.weight"])


def test_training_script_writes_loadable_weights_and_refuses_weak_models(tmp_path, monkeypatch, one_epoch_model):
    script = _load_script("train_digits_cnn")
    weak = tmp_path / "weak.pt"
    assert script.main(["--out", str(weak), "--epochs", "1"]) == 1  # one epoch is below the 0.97 floor
    assert not weak.exists()

    monkeypatch.setattr(script, "MIN_HELDOUT_TOP1", 0.0)
    out = tmp_path / "sub" / "digits.pt"
    assert script.main(["--out", str(out), "--epochs", "1"]) == 0
    loaded = digits_cnn.load_digits_cnn(weights=str(out))
    for name, value in one_epoch_model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
