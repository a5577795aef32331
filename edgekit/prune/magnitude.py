"""Global unstructured magnitude pruning: zero the smallest weights across all Conv/Linear layers.

One threshold for the whole model (not one per layer), so layers with many small weights lose more
of them. The weights are zeroed in place; no ``torch.nn.utils.prune`` reparametrization is left
behind, so export sees plain tensors.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from edgekit.errors import PruneError
from edgekit.prune._layers import (
    WEIGHT_LAYER_TYPES,
    count_params,
    layer_record,
    reject_reparametrized,
    tied_layers,
    weight_layers,
    weight_sparsity,
    weight_stats,
)
from edgekit.prune.report import PruneReport, SkippedLayer, check_sparsity, zeroing_notes

log = logging.getLogger(__name__)

METHOD = "magnitude"
DENSE_KERNEL_NOTE = (
    "unstructured sparsity does not speed up dense kernels: ONNX Runtime and TensorRT still multiply "
    "the zeros, so latency is unchanged; the gain is in compressed file size only (zeros compress well)"
)


def magnitude_prune(module: nn.Module, sparsity: float) -> PruneReport:
    """Zero the ``sparsity`` fraction of smallest-magnitude Conv/Linear weights, in place.

    Biases, normalization layers and embeddings are left alone. The count of zeros is exact:
    ``round(sparsity * total weights)`` entries end up zero (weights already zero count as the
    smallest).
    """
    sparsity = check_sparsity(sparsity, method=METHOD)
    reject_reparametrized(module, METHOD)
    layers = weight_layers(module)
    if not layers:
        tied = "; ".join(f"{name}: {why}" for name, why in tied_layers(module).items())
        raise PruneError(
            f"prune method '{METHOD}': {type(module).__name__} has no Conv or Linear layer to prune" + (f" ({tied})" if tied else ""),
            hint="magnitude pruning acts on nn.Conv*/nn.Linear weights only",
        )
    params_before, nonzero_params_before = count_params(module)
    stats_before = {name: weight_stats(layer) for name, layer in layers}

    weights = [layer.weight for _, layer in layers]
    magnitudes = torch.cat([weight.detach().abs().flatten().float() for weight in weights])
    if not bool(torch.isfinite(magnitudes).all()):
        bad = [name for name, layer in layers if not bool(torch.isfinite(layer.weight.detach()).all())]
        raise PruneError(
            f"prune method '{METHOD}': layers {bad} have NaN or infinite weights; magnitudes cannot be ranked",
            hint="fix the checkpoint (NaN weights usually mean training diverged)",
        )
    to_zero = math.floor(sparsity * magnitudes.numel() + 0.5)
    keep = torch.ones(magnitudes.numel(), dtype=torch.bool)
    if to_zero > 0:
        smallest = torch.topk(magnitudes, to_zero, largest=False, sorted=False).indices
        keep[smallest] = False
    with torch.no_grad():
        for weight, mask in zip(weights, torch.split(keep, [w.numel() for w in weights])):
            weight.mul_(mask.view_as(weight).to(weight.dtype))

    records = tuple(layer_record(name, layer, stats_before[name], "zeroed") for name, layer in layers)
    params_after, nonzero_params_after = count_params(module)
    achieved = weight_sparsity(records)
    newly_zeroed = sum(stats_before[r.name][3] for r in records) - sum(weight_stats(layer)[3] for _, layer in layers)
    threshold = float(magnitudes[~keep].max()) if to_zero > 0 else 0.0
    log.info("magnitude pruning: %d of %d weights zeroed (threshold |w| <= %.3g)", to_zero, magnitudes.numel(), threshold)
    return PruneReport(
        method=METHOD,
        target_sparsity=sparsity,
        achieved_sparsity=achieved,
        params_before=params_before,
        params_after=params_after,
        nonzero_params_before=nonzero_params_before,
        nonzero_params_after=nonzero_params_after,
        layers=records,
        skipped=_skipped_others(module, {name for name, _ in layers}),
        newly_zeroed=newly_zeroed,
        options={"threshold_abs": threshold},
        notes=(
            f"one global threshold |w| <= {threshold:.6g} over {magnitudes.numel()} weights of {len(layers)} Conv/Linear layers",
            *zeroing_notes(newly_zeroed, magnitudes.numel(), achieved, sparsity),
            DENSE_KERNEL_NOTE,
        ),
    )


def _skipped_others(module: nn.Module, pruned: set[str]) -> tuple[SkippedLayer, ...]:
    """Layers with parameters that magnitude pruning does not touch, for the report."""
    tied = tied_layers(module)
    skipped = []
    for name, layer in module.named_modules():
        if name in pruned or not any(True for _ in layer.parameters(recurse=False)):
            continue
        if name in tied:
            reason = tied[name]
        elif isinstance(layer, WEIGHT_LAYER_TYPES):
            reason = "shares its weight tensor with a layer listed as pruned"
        else:
            reason = "not a Conv/Linear layer (only their weights are pruned)"
        skipped.append(SkippedLayer(name, type(layer).__name__, reason))
    return tuple(skipped)


def run(module: nn.Module, sparsity: float | None, example_inputs: Any = None) -> tuple[nn.Module, PruneReport]:
    """Registry entry: prune in place and hand back the same module."""
    return module, magnitude_prune(module, sparsity)  # type: ignore[arg-type]
