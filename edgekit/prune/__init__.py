"""Pruning a PyTorch model before export: one registry of methods, one report type.

==============  ===================================================  ================================
method          what it does                                          what gets faster
==============  ===================================================  ================================
``magnitude``   zeros the smallest weights, one global threshold      nothing (dense kernels); size
``channel``     removes whole output channels, returns a smaller      every backend: the graph shrinks
                model (torch.fx dependency analysis)
``2:4``         zeros 2 of every 4 weights along the input dim        TensorRT sparse tensor cores
==============  ===================================================  ================================

Importing this package is cheap: torch loads when a pruner runs. Every pruner returns
``(module, PruneReport)``; :func:`fine_tune` runs a user callable afterwards and keeps the zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.errors import PruneError
from edgekit.prune.registry import PRUNERS, Pruner, get_pruner
from edgekit.prune.report import LayerPruneRecord, PruneReport, SkippedLayer, check_sparsity

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "PRUNERS",
    "LayerPruneRecord",
    "PruneReport",
    "Pruner",
    "SkippedLayer",
    "check_sparsity",
    "fine_tune",
    "get_pruner",
    "prune_model",
]


def prune_model(
    module: nn.Module,
    method: str,
    sparsity: float | None = None,
    example_inputs: Any = None,
    **options: Any,
) -> tuple[nn.Module, PruneReport]:
    """Prune ``module`` with ``method``; return the pruned module (the same object for in-place
    methods, a new one for ``channel``) and its report.

    ``sparsity``: for ``magnitude`` the fraction of Conv/Linear weights zeroed, for ``channel`` the
    fraction of output channels removed per prunable layer, for ``2:4`` fixed at 0.5 (leave it None).
    ``example_inputs``: one batch in forward()'s argument order (needed by ``channel``).
    """
    pruner = get_pruner(method)
    unknown = sorted(set(options) - set(pruner.options))
    if unknown:
        accepted = list(pruner.options) or "none"
        raise PruneError(
            f"prune method '{method}' does not take option(s) {unknown}; it accepts {accepted}",
            hint="remove the option from the recipe's prune section",
        )
    return pruner.load()(module, sparsity, example_inputs, **options)


def fine_tune(
    module: nn.Module,
    callable_ref: str | Callable[..., Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    report: PruneReport,
    search_dir: Path | None = None,
) -> tuple[nn.Module, PruneReport]:
    """Run ``fn(module, **kwargs) -> nn.Module`` after pruning; see :func:`edgekit.prune.fine_tuning.fine_tune`."""
    from edgekit.prune.fine_tuning import fine_tune as run_fine_tune

    return run_fine_tune(module, callable_ref, kwargs, report=report, search_dir=search_dir)
