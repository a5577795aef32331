"""Torch helpers shared by the pruners: finding Conv/Linear layers, counting parameters, masks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from edgekit.errors import PruneError
from edgekit.prune.report import LayerAction, LayerPruneRecord, fraction

WEIGHT_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd, nn.Linear)


def weight_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Conv (any rank, transposed included) and Linear layer with a weight, by qualified name.

    A layer object reachable under two names is listed once; so is a weight tensor shared by two layers.
    A layer whose weight is tied to a module of another kind (a Linear head tied to an ``nn.Embedding``)
    is left out: zeroing it would zero that module too (see :func:`tied_layers`).
    """
    found: list[tuple[str, nn.Module]] = []
    seen_weights: set[int] = set()
    tied = tied_layers(module)
    for name, layer in module.named_modules():
        if not isinstance(layer, WEIGHT_LAYER_TYPES) or not isinstance(getattr(layer, "weight", None), torch.Tensor):
            continue
        if id(layer.weight) in seen_weights or name in tied:
            continue
        seen_weights.add(id(layer.weight))
        found.append((name, layer))
    return found


def tied_layers(module: nn.Module) -> dict[str, str]:
    """Conv/Linear layer name -> why it is not pruned: its weight is the very Parameter of a module that is not
    Conv/Linear (an LM head tied to its ``nn.Embedding``), which pruning the layer would change as well."""
    owners: dict[int, list[str]] = {}
    for name, layer in module.named_modules():
        if not isinstance(layer, WEIGHT_LAYER_TYPES):
            for param in layer.parameters(recurse=False):
                owners.setdefault(id(param), []).append(f"'{name}' ({type(layer).__name__})")
    tied = {}
    for name, layer in module.named_modules():
        weight = getattr(layer, "weight", None)
        if isinstance(layer, WEIGHT_LAYER_TYPES) and isinstance(weight, torch.Tensor) and id(weight) in owners:
            others = ", ".join(owners[id(weight)])
            tied[name] = f"its weight is tied to {others}; pruning it would change that module too, so both keep their weights"
    return tied


def reject_reparametrized(module: nn.Module, method: str) -> None:
    """Refuse layers whose weight is computed (torch.nn.utils.prune masks, parametrizations)."""
    from torch.nn.utils import parametrize

    for name, layer in module.named_modules():
        if hasattr(layer, "weight_orig") or hasattr(layer, "weight_mask"):
            raise PruneError(
                f"prune method '{method}': layer '{name}' carries a torch.nn.utils.prune reparametrization "
                "(weight_orig / weight_mask), so its weight is not a plain tensor",
                hint=f"call torch.nn.utils.prune.remove(model.get_submodule('{name}'), 'weight') before pruning with edgekit",
            )
        if parametrize.is_parametrized(layer):
            raise PruneError(
                f"prune method '{method}': layer '{name}' has parametrized tensors "
                f"({', '.join(layer.parametrizations.keys())}), so they cannot be pruned in place",
                hint="remove the parametrization first (torch.nn.utils.parametrize.remove_parametrizations)",
            )


def count_params(module: nn.Module, *, recurse: bool = True) -> tuple[int, int]:
    """(total, nonzero) parameter entries; shared parameters count once."""
    total = nonzero = 0
    for param in module.parameters(recurse=recurse):
        total += param.numel()
        nonzero += int(torch.count_nonzero(param.detach()))
    return total, nonzero


def weight_stats(layer: nn.Module) -> tuple[tuple[int, ...], int, int, int]:
    """(weight shape, own params, own nonzero params, nonzero weight entries) of one layer."""
    total, nonzero = count_params(layer, recurse=False)
    weight = getattr(layer, "weight", None)
    shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else ()
    weight_nonzero = int(torch.count_nonzero(weight.detach())) if isinstance(weight, torch.Tensor) else 0
    return shape, total, nonzero, weight_nonzero


def layer_record(
    name: str, layer: nn.Module, before: tuple[tuple[int, ...], int, int, int], action: LayerAction
) -> LayerPruneRecord:
    """A record from the layer's stats before (see :func:`weight_stats`) and its state now."""
    shape_before, params_before, nonzero_before, _ = before
    shape_after, params_after, nonzero_after, weight_nonzero_after = weight_stats(layer)
    weight_entries_before = int(np.prod(shape_before)) if shape_before else 0
    return LayerPruneRecord(
        name=name,
        kind=type(layer).__name__,
        action=action,
        weight_shape_before=shape_before,
        weight_shape_after=shape_after,
        params_before=params_before,
        params_after=params_after,
        nonzero_before=nonzero_before,
        nonzero_after=nonzero_after,
        sparsity=1.0 - fraction(weight_nonzero_after, weight_entries_before) if weight_entries_before else 0.0,
    )


def weight_sparsity(records: Iterable[LayerPruneRecord]) -> float:
    """Fraction of the records' original weight entries that are zero or removed now."""
    before = after_nonzero = 0
    for record in records:
        entries = int(np.prod(record.weight_shape_before)) if record.weight_shape_before else 0
        before += entries
        after_nonzero += round((1.0 - record.sparsity) * entries)
    return 1.0 - fraction(after_nonzero, before) if before else 0.0


def as_example_inputs(example_inputs: Any, method: str) -> tuple[torch.Tensor, ...]:
    """Example inputs as a tuple of tensors: a tensor, an array, or a sequence of them."""
    if example_inputs is None:
        raise PruneError(
            f"prune method '{method}' needs example inputs to trace the model and check the result",
            hint="pass example_inputs=(tensor, ...) shaped like one batch of the model's inputs",
        )
    items: Sequence[Any]
    if isinstance(example_inputs, (torch.Tensor, np.ndarray)):
        items = (example_inputs,)
    elif isinstance(example_inputs, Mapping):
        raise PruneError(
            f"prune method '{method}': example_inputs is a mapping ({list(example_inputs)}); "
            "give the tensors positionally, in the order forward() takes them",
            hint="for a recipe batch use tuple(batch[spec.name] for spec in recipe.inputs)",
        )
    elif isinstance(example_inputs, Sequence):
        items = example_inputs
    else:
        raise PruneError(
            f"prune method '{method}': example_inputs must be a tensor or a sequence of tensors, "
            f"got {type(example_inputs).__name__}"
        )
    out = []
    for index, item in enumerate(items):
        if isinstance(item, np.ndarray):
            item = torch.from_numpy(np.ascontiguousarray(item))
        if not isinstance(item, torch.Tensor):
            raise PruneError(f"prune method '{method}': example_inputs[{index}] is a {type(item).__name__}, not a tensor")
        out.append(item)
    return tuple(out)


def training_flags(module: nn.Module) -> dict[str, bool]:
    return {name: sub.training for name, sub in module.named_modules()}


def restore_training_flags(module: nn.Module, flags: Mapping[str, bool]) -> None:
    for name, sub in module.named_modules():
        if name in flags:
            sub.training = flags[name]
