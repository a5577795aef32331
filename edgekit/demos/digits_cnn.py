"""A small CNN for scikit-learn's bundled 8x8 handwritten digits.

The model takes ``image`` float32 ``[batch, 1, 8, 8]`` (pixel values scaled to [0, 1]) and returns
``logits`` float32 ``[batch, 10]``. It is deliberately wider than the task needs (about 2.4 M
multiply-accumulates per image) so that INT8 quantization and structured channel pruning show real
speedups at batch 64 on a CPU.

The data split is fixed: a stratified split of ``sklearn.datasets.load_digits`` with seed 0 gives
1297 training images and 500 held-out images. Training is deterministic (seeded, single thread,
deterministic algorithms) and takes seconds on a CPU. Trained weights ship in
``weights/digits_cnn.pt``; ``scripts/train_digits_cnn.py`` regenerates them.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn

from edgekit.demos._batching import require_enough, require_int_at_least
from edgekit.errors import SourceError

if TYPE_CHECKING:
    from numpy.typing import NDArray

logger = logging.getLogger(__name__)

SHIPPED_WEIGHTS = Path(__file__).resolve().parent / "weights" / "digits_cnn.pt"
HELDOUT_SIZE = 500
SPLIT_SEED = 0
DEFAULT_EPOCHS = 12
NUM_CLASSES = 10

__all__ = [
    "DEFAULT_EPOCHS",
    "SHIPPED_WEIGHTS",
    "DigitsCNN",
    "DigitsSplit",
    "calibration_batches",
    "digits_split",
    "evaluation_batches",
    "heldout_top1",
    "load_digits_cnn",
    "sample_batches",
    "train_digits_cnn",
]


class DigitsCNN(nn.Module):
    """conv 1->32 -> conv 32->64 -> pool -> conv 64->128 -> pool -> linear 512->128 -> linear 128->10."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(64, 128, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * 2 * 2, 128),
            nn.ReLU(),
            nn.Linear(128, NUM_CLASSES),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image))


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed train / held-out split. Images are float32 [n, 1, 8, 8] in [0, 1]; labels int64 [n]."""

    train_images: NDArray[np.float32]
    train_labels: NDArray[np.int64]
    heldout_images: NDArray[np.float32]
    heldout_labels: NDArray[np.int64]


@functools.lru_cache(maxsize=1)
def digits_split() -> DigitsSplit:
    """The stratified split of scikit-learn's digits (seed 0): 1297 training, 500 held-out images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=HELDOUT_SIZE, stratify=labels, random_state=SPLIT_SEED
    )
    for array in (train_x, test_x, train_y, test_y):
        array.setflags(write=False)  # cached: callers get copies
    return DigitsSplit(train_x, train_y, test_x, test_y)


def _batches(images: NDArray[np.float32], labels: NDArray[np.int64] | None, batch: int, count: int | None) -> list[dict[str, np.ndarray]]:
    total = len(images) if count is None else batch * count
    out: list[dict[str, np.ndarray]] = []
    for start in range(0, total, batch):
        stop = min(start + batch, total)
        item = {"image": np.ascontiguousarray(images[start:stop], dtype=np.float32).copy()}
        if labels is not None:
            item["labels"] = np.ascontiguousarray(labels[start:stop], dtype=np.int64).copy()
        out.append(item)
    return out


def sample_batches(batch: int = 8, count: int = 2) -> list[dict[str, np.ndarray]]:
    """``count`` batches of ``batch`` training images: ``{"image": float32 [batch, 1, 8, 8]}``."""
    where = "edgekit.demos.digits_cnn:sample_batches"
    batch = require_int_at_least(batch, 1, name="batch", where=where)
    count = require_int_at_least(count, 1, name="count", where=where)
    split = digits_split()
    require_enough(len(split.train_images), batch, count, where=where, pool="digits training split")
    return _batches(split.train_images, None, batch, count)


def calibration_batches(batch: int = 32, count: int = 8) -> list[dict[str, np.ndarray]]:
    """``count`` batches of ``batch`` training images for quantization calibration (no labels).

    Taken from the end of the training split so that they differ from :func:`sample_batches`
    whenever the training split is large enough.
    """
    where = "edgekit.demos.digits_cnn:calibration_batches"
    batch = require_int_at_least(batch, 1, name="batch", where=where)
    count = require_int_at_least(count, 1, name="count", where=where)
    split = digits_split()
    available = len(split.train_images)
    require_enough(available, batch, count, where=where, pool="digits training split")
    start = available - batch * count
    return _batches(split.train_images[start:], None, batch, count)


def evaluation_batches(batch: int = 100) -> list[dict[str, np.ndarray]]:
    """All 500 held-out images in batches of ``batch`` (the last may be smaller), with ``labels`` int64."""
    batch = require_int_at_least(batch, 1, name="batch", where="edgekit.demos.digits_cnn:evaluation_batches")
    split = digits_split()
    return _batches(split.heldout_images, split.heldout_labels, batch, None)


# ---------------------------------------------------------------- training and evaluation


def heldout_top1(model: nn.Module) -> float:
    """Top-1 accuracy of ``model`` on the 500 held-out images (0..1)."""
    split = digits_split()
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(split.heldout_images.copy()))
    predicted = logits.argmax(dim=1).numpy()
    return float((predicted == split.heldout_labels).mean())


def train_digits_cnn(
    epochs: int = DEFAULT_EPOCHS, seed: int = 0, batch_size: int = 32, learning_rate: float = 2e-3
) -> DigitsCNN:
    """Train a :class:`DigitsCNN` on the training split; deterministic for a given seed.

    Runs on one thread with deterministic algorithms, inside a forked RNG so the caller's global
    torch RNG state, thread count and determinism setting are left as they were.
    """
    where = "edgekit.demos.digits_cnn:train_digits_cnn"
    epochs = require_int_at_least(epochs, 1, name="epochs", where=where)
    batch_size = require_int_at_least(batch_size, 1, name="batch_size", where=where)
    return fit_on_training_split(DigitsCNN, epochs=epochs, seed=seed, batch_size=batch_size, learning_rate=learning_rate, what="digits_cnn")


def fit_on_training_split(make_model: Callable[[], nn.Module], *, epochs: int, seed: int, batch_size: int, learning_rate: float,
                          what: str) -> nn.Module:
    """Adam with a cosine schedule over the training split, deterministic for a seed: one thread,
    deterministic algorithms, a forked RNG (the caller's RNG state, thread count and determinism setting
    are restored). ``make_model`` runs inside the seeded RNG, so fresh weights are reproducible too.
    Used for the demo's own training and for its fine-tune after pruning. Returns the model in eval mode."""
    split = digits_split()
    images = torch.from_numpy(split.train_images.copy())
    labels = torch.from_numpy(split.train_labels.copy())
    threads_before = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = make_model()
            order_rng = torch.Generator().manual_seed(seed)
            optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=float(learning_rate))
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
            loss_fn = nn.CrossEntropyLoss()
            model.train()
            for epoch in range(epochs):
                order = torch.randperm(len(images), generator=order_rng)
                total_loss = 0.0
                for start in range(0, len(images), batch_size):
                    index = order[start : start + batch_size]
                    optimizer.zero_grad()
                    loss = loss_fn(model(images[index]), labels[index])
                    loss.backward()
                    optimizer.step()
                    total_loss += loss.item() * len(index)
                schedule.step()
                logger.debug("%s epoch %d/%d: mean loss %.4f", what, epoch + 1, epochs, total_loss / len(images))
    finally:
        torch.use_deterministic_algorithms(deterministic_before)
        torch.set_num_threads(threads_before)
    model.eval()
    return model


def load_digits_cnn(weights: str | None = None) -> nn.Module:
    """The trained :class:`DigitsCNN` in eval mode.

    ``weights`` is a state_dict file; by default the shipped ``weights/digits_cnn.pt``. When the
    shipped file is missing (a trimmed install), the model is trained in memory (a few seconds) and a
    warning is logged. A ``weights`` path that was given explicitly but does not exist is an error.
    """
    model = DigitsCNN()
    if weights is None:
        path = SHIPPED_WEIGHTS
        if not path.is_file():
            logger.warning(
                "shipped digits CNN weights not found at %s; training in memory instead "
                "(run scripts/train_digits_cnn.py to regenerate them)",
                path,
            )
            return train_digits_cnn()
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise SourceError(
                f"edgekit.demos.digits_cnn:load_digits_cnn: weights file not found: {path}",
                hint="fix model.kwargs.weights in the recipe, or leave it out to use the shipped weights",
            )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # unpickling errors, missing/unexpected keys, shape mismatches
        raise SourceError(
            f"edgekit.demos.digits_cnn:load_digits_cnn: cannot load weights from {path}: {exc}",
            hint="the file must be a DigitsCNN state_dict saved with torch.save; "
            "regenerate it with scripts/train_digits_cnn.py --out PATH",
        ) from None
    model.eval()
    return model
