"""Fine-tuning after pruning: call the user's ``fn(module, **kwargs) -> nn.Module``, keep the zeros.

For methods that zero weights in place (magnitude, 2:4) the zeros would be undone by training, so
the pruned positions are held at zero twice over: their gradients are masked while ``fn`` runs (with
SGD, Adam or AdamW a weight that starts at zero with zero gradient stays at zero), and the masks are
multiplied in again after ``fn`` returns, whatever ``fn`` did. Channel pruning needs no masks: the
removed channels no longer exist.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgekit.errors import EdgekitError, PruneError
from edgekit.prune._layers import count_params, layer_record, weight_sparsity
from edgekit.prune.registry import get_pruner
from edgekit.prune.report import PruneReport

log = logging.getLogger(__name__)

FIELD = "prune.fine_tune.callable"


def resolve_fine_tune(callable_ref: str | Callable[..., Any], search_dir: Path | None = None) -> tuple[Callable[..., Any], str]:
    """The callable and a printable ``module:name`` for it; ``search_dir`` (the recipe's folder) is tried on sys.path."""
    if callable(callable_ref):
        fn = callable_ref
        name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
        return fn, name
    if not isinstance(callable_ref, str) or ":" not in callable_ref:
        raise PruneError(
            f"{FIELD}: expected 'package.module:function' or a callable, got {callable_ref!r}",
            hint="e.g. edgekit.demos.digits_finetune:fine_tune_digits",
        )
    from edgekit.sources._util import import_callable

    return import_callable(callable_ref, PruneError, FIELD, search_dir), callable_ref


def zero_masks(module: nn.Module, report: PruneReport) -> dict[str, torch.Tensor]:
    """Layer name -> bool mask of the weights that are nonzero now, for the layers the report zeroed."""
    masks = {}
    for record in report.layers:
        if record.action != "zeroed":
            continue
        try:
            layer = module.get_submodule(record.name)
        except AttributeError:
            raise PruneError(
                f"fine-tune: the prune report names layer '{record.name}' but the module has no such submodule",
                hint="pass the report that pruning this very module returned",
            ) from None
        masks[record.name] = layer.weight.detach() != 0
    return masks


def fine_tune(
    module: nn.Module,
    callable_ref: str | Callable[..., Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    report: PruneReport,
    search_dir: Path | None = None,
) -> tuple[nn.Module, PruneReport]:
    """Run ``fn(module, **kwargs)`` on a pruned module; return its result and the updated report.

    ``report`` is the one pruning returned; for magnitude and 2:4 its zeroed layers are held at zero.
    Errors raised by ``fn`` become :class:`PruneError` (edgekit errors pass through unchanged).
    """
    fn, name = resolve_fine_tune(callable_ref, search_dir)
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise PruneError(f"prune.fine_tune.kwargs must be a mapping of keyword arguments, got {type(kwargs).__name__}")
    masks = zero_masks(module, report) if get_pruner(report.method).keeps_masks else {}

    handles = [
        module.get_submodule(layer_name).weight.register_hook(_GradientMask(mask)) for layer_name, mask in masks.items()
    ]
    try:
        result = fn(module, **dict(kwargs))
    except EdgekitError:
        raise
    except Exception as exc:
        raise PruneError(
            f"fine-tune callable '{name}' raised {type(exc).__name__}: {exc}",
            hint="check prune.fine_tune.kwargs against the callable's signature",
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
    if not isinstance(result, nn.Module):
        raise PruneError(
            f"fine-tune callable '{name}' returned {type(result).__name__}, not a torch.nn.Module",
            hint="the callable must return the fine-tuned module (it may be the same object it was given)",
        )
    _reapply(result, masks, name)
    return result, _updated_report(result, report, name, len(masks))


class _GradientMask:
    """Tensor hook: zero the gradient of pruned weights so optimizers leave them at zero."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.mask.to(grad.dtype)


def _reapply(module: nn.Module, masks: Mapping[str, torch.Tensor], name: str) -> None:
    for layer_name, mask in masks.items():
        try:
            weight = module.get_submodule(layer_name).weight
        except AttributeError:
            raise PruneError(
                f"fine-tune callable '{name}' returned a module without layer '{layer_name}', so its sparsity mask cannot be kept",
                hint="fine-tuning must keep the pruned model's structure",
            ) from None
        if weight.shape != mask.shape:
            raise PruneError(
                f"fine-tune callable '{name}' changed the weight of '{layer_name}' from {tuple(mask.shape)} to {tuple(weight.shape)}",
                hint="fine-tuning must keep the pruned model's structure",
            )
        with torch.no_grad():
            weight.mul_(mask.to(device=weight.device, dtype=weight.dtype))


def _updated_report(module: nn.Module, report: PruneReport, name: str, masked: int) -> PruneReport:
    layers = []
    for record in report.layers:
        try:
            layer = module.get_submodule(record.name)
        except AttributeError:
            continue
        before = (record.weight_shape_before, record.params_before, record.nonzero_before, 0)
        layers.append(dataclasses.replace(layer_record(record.name, layer, before, record.action), kind=record.kind))
    params_after, nonzero_after = count_params(module)
    note = f"fine-tuned by {name}" + (f"; sparsity masks of {masked} layers re-applied after it" if masked else "")
    log.info("%s", note)
    return dataclasses.replace(
        report,
        layers=tuple(layers),
        achieved_sparsity=weight_sparsity(r for r in layers if r.action != "features"),
        params_after=params_after,
        nonzero_params_after=nonzero_after,
        fine_tune=name,
        notes=(*report.notes, note),
    )


__all__ = ["fine_tune", "resolve_fine_tune", "zero_masks"]
