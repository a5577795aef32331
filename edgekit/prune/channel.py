"""Structured channel pruning that really shrinks the model.

For every prunable Conv/Linear producer (see :mod:`edgekit.prune._channel_graph`) the filters with
the largest L1 (or L2) norm are kept, ``1 - ratio`` of them (rounded half up, at least 1, optionally
rounded up to a multiple of ``round_to`` so kernels stay vector-friendly); the matching input
channels of the next Conv, input features of the next Linear (a block of ``H*W`` features per
channel after a flatten) and BatchNorm channels go with them. The input module is not modified:
a pruned deep copy is returned, checked by a forward pass on the example inputs.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any, Literal

import torch
from torch import nn

from edgekit.errors import InternalError, PruneError
from edgekit.prune._channel_graph import BATCHNORM_TYPES, ChannelPlan, plan_channels
from edgekit.prune._layers import (
    as_example_inputs,
    count_params,
    layer_record,
    reject_reparametrized,
    restore_training_flags,
    training_flags,
    weight_layers,
    weight_sparsity,
    weight_stats,
)
from edgekit.prune.report import LayerAction, PruneReport, SkippedLayer, check_sparsity

log = logging.getLogger(__name__)

METHOD = "channel"
Norm = Literal["l1", "l2"]
NORMS: tuple[str, ...] = ("l1", "l2")


def channels_to_keep(channels: int, ratio: float, round_to: int = 1) -> int:
    """``1 - ratio`` of ``channels`` rounded half up, at least 1, then up to a multiple of ``round_to`` (capped)."""
    keep = max(1, math.floor((1.0 - ratio) * channels + 0.5))
    if round_to > 1:
        keep = min(channels, math.ceil(keep / round_to) * round_to)
    return keep


def filter_norms(weight: torch.Tensor, norm: Norm) -> torch.Tensor:
    """One score per output channel (dim 0): the L1 or L2 norm of its filter."""
    rows = weight.detach().flatten(1).float()
    return rows.abs().sum(dim=1) if norm == "l1" else rows.norm(dim=1)


def strongest_channels(weight: torch.Tensor, keep: int, norm: Norm) -> torch.Tensor:
    """Indices (ascending) of the ``keep`` filters with the largest norm; ties keep the lower index."""
    order = torch.argsort(filter_norms(weight, norm), descending=True, stable=True)
    return order[:keep].sort().values


def channel_prune(
    module: nn.Module,
    ratio: float,
    example_inputs: Any,
    *,
    norm: Norm = "l1",
    round_to: int = 1,
) -> tuple[nn.Module, PruneReport]:
    """Remove ``ratio`` of the output channels of every prunable layer; return a smaller copy and a report.

    ``example_inputs`` is one batch (a tensor or a sequence of tensors in forward()'s order); it is
    used to trace shapes and to check that the pruned model still runs and keeps its output shapes.
    Layers that cannot be pruned safely (feeding a residual add, a concatenation, the model output,
    or anything not understood) keep their outputs and are listed in ``report.skipped``.
    """
    ratio = check_sparsity(ratio, method=METHOD, what="ratio (sparsity)")
    if norm not in NORMS:
        raise PruneError(f"prune method '{METHOD}': norm must be one of {list(NORMS)}, got {norm!r}", hint="use 'l1' (default) or 'l2'")
    if isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1:
        raise PruneError(
            f"prune method '{METHOD}': round_to must be an integer >= 1, got {round_to!r}",
            hint="1 keeps the exact count; 8 rounds kept channels up to a multiple of 8",
        )
    inputs = as_example_inputs(example_inputs, METHOD)
    reject_reparametrized(module, METHOD)

    pruned = copy.deepcopy(module)
    flags = training_flags(pruned)
    pruned.eval()
    try:
        plan = plan_channels(pruned, inputs)
        if not plan.groups:
            reasons = "; ".join(f"{name}: {why}" for name, why in plan.blocked.items()) or "it has no Conv or Linear layer"
            raise PruneError(
                f"prune method '{METHOD}': no layer of {type(module).__name__} can lose channels safely ({reasons})",
                hint="use method 'magnitude' or '2:4', which work on any Conv/Linear layer",
            )
        tracked = _tracked_layers(pruned)
        stats_before = {name: weight_stats(layer) for name, layer in tracked.items()}
        params_before, nonzero_params_before = count_params(pruned)
        actions, skipped = _apply(pruned, plan, ratio, round_to, norm)
        _verify(pruned, inputs, plan.outputs)
    finally:
        restore_training_flags(pruned, flags)

    conv_linear = {name for name, _ in weight_layers(pruned)}
    for name in conv_linear - set(plan.blocked) - {g.producer for g in plan.groups}:
        skipped.append(SkippedLayer(name, type(tracked[name]).__name__, "not called as a module in the traced forward"))
    records = tuple(
        layer_record(name, layer, stats_before[name], actions.get(name, "unchanged"))  # type: ignore[arg-type]
        for name, layer in tracked.items()
        if name in conv_linear or name in actions
    )
    params_after, nonzero_params_after = count_params(pruned)
    removed = params_before - params_after
    if removed < 0:  # a Parameter shared with a module the plan did not see was copied instead of shrunk
        raise InternalError(
            f"channel pruning made {type(module).__name__} larger ({params_before} -> {params_after} parameters); "
            "this is a bug in edgekit's channel pruner (a tied weight it did not detect?), please report it "
            "(method 'magnitude' avoids it)"
        )
    notes = [
        f"removed {removed} of {params_before} parameters ({100.0 * removed / max(params_before, 1):.1f}%); "
        "the exported graph has smaller tensors, so dense kernels do less work",
        f"'sparsity' is the fraction of output channels removed from each prunable layer; channels ranked by {norm.upper()} filter norm",
        "accuracy usually drops until the pruned model is fine-tuned",
    ]
    if not any(action in ("outputs", "outputs+inputs") for action in actions.values()):
        notes.append(f"no layer lost channels: every prunable layer keeps all of them at ratio {ratio}")
    log.info("channel pruning: %d layers shrunk, %d left as they were", len(actions), len(skipped))
    report = PruneReport(
        method=METHOD,
        target_sparsity=ratio,
        achieved_sparsity=weight_sparsity(r for r in records if r.name in conv_linear),
        params_before=params_before,
        params_after=params_after,
        nonzero_params_before=nonzero_params_before,
        nonzero_params_after=nonzero_params_after,
        layers=records,
        skipped=tuple(sorted(skipped, key=lambda s: list(tracked).index(s.name) if s.name in tracked else 0)),
        options={"norm": norm, "round_to": round_to},
        notes=tuple(notes),
    )
    return pruned, report


def _tracked_layers(module: nn.Module) -> dict[str, nn.Module]:
    return {
        name: layer
        for name, layer in module.named_modules()
        if isinstance(layer, (nn.modules.conv._ConvNd, nn.Linear, *BATCHNORM_TYPES))
    }


def _apply(
    module: nn.Module, plan: ChannelPlan, ratio: float, round_to: int, norm: Norm
) -> tuple[dict[str, LayerAction], list[SkippedLayer]]:
    """Shrink every group; indices are chosen from the original weights before anything changes."""
    chosen: list[tuple[Any, torch.Tensor]] = []
    skipped: list[SkippedLayer] = []
    for group in plan.groups:
        layer = module.get_submodule(group.producer)
        keep = channels_to_keep(group.channels, ratio, round_to)
        if keep == group.channels:
            reason = f"keeps all {group.channels} channels after rounding (ratio {ratio}, round_to {round_to})"
            skipped.append(SkippedLayer(group.producer, type(layer).__name__, reason))
            continue
        chosen.append((group, strongest_channels(layer.weight, keep, norm)))
    for name, reason in plan.blocked.items():
        skipped.append(SkippedLayer(name, type(module.get_submodule(name)).__name__, reason))

    actions: dict[str, LayerAction] = {}
    for group, index in chosen:
        _shrink_outputs(module.get_submodule(group.producer), index)
        actions[group.producer] = "outputs+inputs" if actions.get(group.producer) == "inputs" else "outputs"
        for dep in group.dependents:
            expanded = (index[:, None] * dep.block + torch.arange(dep.block)[None, :]).flatten()
            target = module.get_submodule(dep.name)
            if dep.role == "features":
                _shrink_batchnorm(target, expanded)
                actions[dep.name] = "features"
            else:
                _shrink_inputs(target, expanded)
                actions[dep.name] = "outputs+inputs" if actions.get(dep.name) == "outputs" else "inputs"
    return actions, skipped


def _replace_parameter(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(layer, name)
    setattr(layer, name, nn.Parameter(value.detach().clone(), requires_grad=old.requires_grad))


def _shrink_outputs(layer: nn.Module, index: torch.Tensor) -> None:
    _replace_parameter(layer, "weight", layer.weight[index])
    if layer.bias is not None:
        _replace_parameter(layer, "bias", layer.bias[index])
    if isinstance(layer, nn.Linear):
        layer.out_features = len(index)
    else:
        layer.out_channels = len(index)


def _shrink_inputs(layer: nn.Module, index: torch.Tensor) -> None:
    _replace_parameter(layer, "weight", layer.weight[:, index])
    if isinstance(layer, nn.Linear):
        layer.in_features = len(index)
    else:
        layer.in_channels = len(index)


def _shrink_batchnorm(layer: nn.Module, index: torch.Tensor) -> None:
    if layer.weight is not None:
        _replace_parameter(layer, "weight", layer.weight[index])
    if layer.bias is not None:
        _replace_parameter(layer, "bias", layer.bias[index])
    for buffer in ("running_mean", "running_var"):
        value = getattr(layer, buffer, None)
        if value is not None:
            setattr(layer, buffer, value[index].clone())
    layer.num_features = len(index)


def _output_shapes(value: Any, path: str = "output") -> list[tuple[str, tuple[int, ...] | str]]:
    if isinstance(value, torch.Tensor):
        return [(path, tuple(value.shape))]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in _output_shapes(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _output_shapes(v, f"{path}[{k!r}]")]
    return [(path, type(value).__name__)]


def _verify(module: nn.Module, inputs: tuple[torch.Tensor, ...], reference_outputs: Any) -> None:
    """The pruned model must run on the example inputs and give outputs shaped as before."""
    try:
        with torch.no_grad():
            outputs = module(*inputs)
    except Exception as exc:
        raise InternalError(
            f"channel pruning produced a {type(module).__name__} whose forward fails ({type(exc).__name__}: {exc}); "
            "this is a bug in edgekit's channel pruner, please report it (method 'magnitude' avoids it)"
        ) from exc
    before, after = _output_shapes(reference_outputs), _output_shapes(outputs)
    if before != after:
        raise InternalError(
            f"channel pruning changed the output shapes of {type(module).__name__}: {before} -> {after}; "
            "this is a bug in edgekit's channel pruner, please report it"
        )


def run(module: nn.Module, sparsity: float | None, example_inputs: Any = None, **options: Any) -> tuple[nn.Module, PruneReport]:
    """Registry entry: ``sparsity`` is the channel ratio; options are ``norm`` and ``round_to``."""
    return channel_prune(module, sparsity, example_inputs, **options)  # type: ignore[arg-type]
