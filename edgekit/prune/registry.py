"""The registry of pruning methods: one :class:`Pruner` per ``prune.method``, looked up by name. Its own module
so that the pruners and :mod:`edgekit.prune.fine_tuning` can read it without importing the package's API."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.errors import PruneError
from edgekit.prune.report import PruneReport

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Pruner:
    """One pruning method: where its entry point lives and what it needs."""

    name: str
    entry_point: str  # "package.module:function(module, sparsity, example_inputs, **options)"
    summary: str
    options: tuple[str, ...] = ()
    needs_example_inputs: bool = False
    keeps_masks: bool = False  # zeros in place, so fine-tuning must keep them at zero
    structured: bool = False

    def load(self) -> Callable[..., tuple[nn.Module, PruneReport]]:
        module_name, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module_name), attr)


PRUNERS: dict[str, Pruner] = {
    "magnitude": Pruner(
        name="magnitude",
        entry_point="edgekit.prune.magnitude:run",
        summary="global unstructured magnitude pruning of Conv/Linear weights, in place",
        keeps_masks=True,
    ),
    "channel": Pruner(
        name="channel",
        entry_point="edgekit.prune.channel:run",
        summary="structured output-channel pruning; returns a smaller copy of the model",
        options=("norm", "round_to"),
        needs_example_inputs=True,
        structured=True,
    ),
    "2:4": Pruner(
        name="2:4",
        entry_point="edgekit.prune.semi_structured:run",
        summary="2:4 semi-structured sparsity for TensorRT sparse tensor cores, in place",
        keeps_masks=True,
        structured=True,
    ),
}


def get_pruner(method: str) -> Pruner:
    try:
        return PRUNERS[method]
    except (KeyError, TypeError):
        known = ", ".join(f"'{name}' ({p.summary})" for name, p in PRUNERS.items())
        raise PruneError(
            f"unknown prune method {method!r}; known methods: {known}",
            hint=f"set prune.method in the recipe to one of {list(PRUNERS)}",
        ) from None
