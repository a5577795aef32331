"""What a pruning pass did: :class:`PruneReport` and its per-layer records (no torch import here).

A report serializes with :meth:`PruneReport.to_dict` so the bundle manifest can carry it; the
``sparse_2_4`` flag tells an engine builder that the weights hold the 2:4 pattern (TensorRT's
``kSPARSE_WEIGHTS``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from edgekit.errors import PruneError

LayerAction = Literal[
    "zeroed",  # weights set to zero in place (magnitude, 2:4)
    "outputs",  # output channels / features removed
    "inputs",  # input channels / features removed (its producer lost outputs)
    "outputs+inputs",
    "features",  # a BatchNorm resized to follow its producer
    "unchanged",  # considered, left as it was
]


@dataclass(frozen=True)
class LayerPruneRecord:
    """One layer before and after pruning.

    ``params_*`` count the layer's own parameters (weight and bias); ``nonzero_*`` those that are not
    exactly zero. ``sparsity`` is the fraction of the layer's original weight entries that are now
    zero or removed.
    """

    name: str
    kind: str
    action: LayerAction
    weight_shape_before: tuple[int, ...]
    weight_shape_after: tuple[int, ...]
    params_before: int
    params_after: int
    nonzero_before: int
    nonzero_after: int
    sparsity: float


@dataclass(frozen=True)
class SkippedLayer:
    """A layer the method left alone, and why (in words a user can act on)."""

    name: str
    kind: str
    reason: str


@dataclass(frozen=True)
class PruneReport:
    """The outcome of one pruning pass.

    ``achieved_sparsity`` is the fraction of the Conv/Linear weight entries the method considered
    that are zero or removed afterwards. ``params_*`` count every parameter of the model,
    ``nonzero_params_*`` those that are not exactly zero. ``newly_zeroed``: the weight entries this pass set to zero
    (magnitude, 2:4; None for channel, which removes them): weights already zero in the checkpoint count toward
    ``achieved_sparsity`` but not here, so 0 means the pass changed nothing.
    """

    method: str
    target_sparsity: float
    achieved_sparsity: float
    params_before: int
    params_after: int
    nonzero_params_before: int
    nonzero_params_after: int
    layers: tuple[LayerPruneRecord, ...]
    skipped: tuple[SkippedLayer, ...] = ()
    sparse_2_4: bool = False
    fine_tune: str | None = None
    newly_zeroed: int | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    notes: tuple[str, ...] = ()

    @property
    def per_layer_sparsity(self) -> dict[str, float]:
        """Layer name -> fraction of its original weight entries that are zero or removed."""
        return {record.name: record.sparsity for record in self.layers}

    @property
    def skipped_names(self) -> tuple[str, ...]:
        return tuple(item.name for item in self.skipped)

    def layer(self, name: str) -> LayerPruneRecord:
        for record in self.layers:
            if record.name == name:
                return record
        raise KeyError(f"no layer '{name}' in this prune report; layers: {[r.name for r in self.layers]}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists) for the bundle manifest."""
        return asdict(self)


def check_sparsity(value: object, *, method: str, what: str = "sparsity") -> float:
    """``value`` as a float in [0, 1), or a :class:`PruneError` naming the method and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value < 1:
        raise PruneError(
            f"prune method '{method}': {what} must be a number in [0, 1), got {value!r}",
            hint=f"set prune.sparsity in the recipe, e.g. 0.5 removes half of the {_unit(method)}",
        )
    return float(value)


def _unit(method: str) -> str:
    return "output channels of each prunable layer" if method == "channel" else "Conv/Linear weights"


def fraction(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def zeroing_notes(newly_zeroed: int, weights: int, achieved: float, target: float) -> tuple[str, ...]:
    """What an in-place pass (magnitude, 2:4) says about the zeros it found already there."""
    already = round(achieved * weights) - newly_zeroed
    if newly_zeroed == 0:
        return (f"pruning zeroed no weight: {already} of the {weights} weights were already zero, at least what target "
                f"{target} asks for, so achieved sparsity {achieved:.3f} is the checkpoint's own and the model is unchanged; "
                f"raise prune.sparsity above {achieved:.3f} to prune further, or remove build.prune",)
    if already > 0:
        return (f"{newly_zeroed} weights newly zeroed; {already} of the {weights} were already zero before pruning "
                f"(achieved sparsity {achieved:.3f} counts both, target {target})",)
    return ()
