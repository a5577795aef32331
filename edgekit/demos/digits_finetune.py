"""Fine-tuning for the digits demo after pruning: a recipe's ``prune.fine_tune.callable``.

``edgekit.demos.digits_finetune:fine_tune_digits`` trains a pruned :class:`~edgekit.demos.digits_cnn.DigitsCNN`
(or any module with the same input and output) for a few epochs on the demo's training split. Like
:func:`~edgekit.demos.digits_cnn.train_digits_cnn` it is deterministic (seeded, one thread,
deterministic algorithms) and leaves the caller's torch RNG, thread count and determinism setting
as they were. It takes a few seconds on a CPU.
"""

from __future__ import annotations

import logging

from torch import nn

from edgekit.demos._batching import require_int_at_least
from edgekit.demos.digits_cnn import fit_on_training_split, heldout_top1
from edgekit.errors import RecipeError

log = logging.getLogger(__name__)

DEFAULT_FINE_TUNE_EPOCHS = 3
WHERE = "edgekit.demos.digits_finetune:fine_tune_digits"

__all__ = ["DEFAULT_FINE_TUNE_EPOCHS", "fine_tune_digits"]


def fine_tune_digits(
    module: nn.Module,
    epochs: int = DEFAULT_FINE_TUNE_EPOCHS,
    seed: int = 0,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
) -> nn.Module:
    """Train ``module`` in place on the digits training split with Adam and a cosine schedule.

    Returns the same module, in eval mode. The held-out split is never used for training; its top-1
    is logged at DEBUG level before and after.
    """
    epochs = require_int_at_least(epochs, 1, name="epochs", where=WHERE)
    batch_size = require_int_at_least(batch_size, 1, name="batch_size", where=WHERE)
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not learning_rate > 0:
        raise RecipeError(
            f"{WHERE}: 'learning_rate' must be a number > 0, got {learning_rate!r}",
            hint="fix 'learning_rate' under prune.fine_tune.kwargs in the recipe (1e-3 is a good start)",
        )
    if log.isEnabledFor(logging.DEBUG):
        log.debug("digits fine-tune: held-out top-1 before %.4f", heldout_top1(module))
    module = fit_on_training_split(lambda: module, epochs=epochs, seed=seed, batch_size=batch_size, learning_rate=learning_rate,
                                   what="digits fine-tune")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("digits fine-tune: held-out top-1 after %.4f", heldout_top1(module))
    return module
