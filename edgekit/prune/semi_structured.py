"""2:4 semi-structured sparsity: in every group of 4 consecutive weights along the reduction
(input) dimension, keep the 2 largest magnitudes and zero the other 2.

Groups follow the layout NVIDIA's sparse tensor cores (TensorRT ``kSPARSE_WEIGHTS``) expect:

* Linear ``[out, in]``: 4 consecutive input features of one output row.
* Conv ``[out, in/groups, *kernel]``: 4 consecutive input channels at one output channel and one
  kernel position. For 1x1 convolutions this is the same as grouping the flattened
  ``in*kh*kw`` row; for larger kernels it is not, and grouping the flattened row would give a pattern
  TensorRT does not recognise (it would silently build dense kernels).

A layer is eligible when that reduction dimension (``in_features`` or ``in_channels / groups``) is a
multiple of 4; others are skipped and listed in the report. Transposed convolutions are skipped
(their weight puts the reduction dimension first).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from edgekit.errors import PruneError
from edgekit.prune._layers import (
    count_params,
    layer_record,
    reject_reparametrized,
    tied_layers,
    weight_layers,
    weight_sparsity,
    weight_stats,
)
from edgekit.prune.report import PruneReport, SkippedLayer, zeroing_notes

log = logging.getLogger(__name__)

METHOD = "2:4"
GROUP_SIZE = 4
KEEP_PER_GROUP = 2
SPARSITY = 0.5
ENGINE_NOTE = (
    "2:4 sparsity speeds up only engines with sparse tensor cores: TensorRT with kSPARSE_WEIGHTS, FP16 or "
    "INT8, on Ampere-or-newer GPUs (Jetson Orin included); ONNX Runtime and CPUs run these layers dense"
)
LAYOUT_NOTE = (
    "conv groups run along input channels at each kernel position (the TensorRT/cuSPARSELt layout), "
    "not along the flattened in*kh*kw row"
)


@dataclass(frozen=True)
class TwoFourViolation:
    """A layer whose weight breaks the 2:4 pattern, with the first offending group."""

    layer: str
    bad_groups: int
    total_groups: int
    first_output: int
    first_kernel_position: tuple[int, ...]
    first_inputs: tuple[int, int]  # [start, stop) along the reduction dimension
    first_nonzero: int

    def __str__(self) -> str:
        where = f"output {self.first_output}"
        if self.first_kernel_position:
            where += f", kernel position {self.first_kernel_position}"
        start, stop = self.first_inputs
        return (
            f"{self.layer}: {self.bad_groups} of {self.total_groups} groups of 4 have more than 2 nonzero weights "
            f"(first: {where}, inputs {start}..{stop - 1} hold {self.first_nonzero} nonzeros)"
        )


def ineligible_reason(layer: nn.Module) -> str | None:
    """Why ``layer`` cannot hold the 2:4 pattern, or None if it can."""
    if isinstance(layer, nn.modules.conv._ConvTransposeNd):
        return "transposed convolution: its weight is [in, out, ...], the 2:4 layout is not defined for it"
    reduction = int(layer.weight.shape[1])
    if reduction % GROUP_SIZE:
        what = "in_features" if isinstance(layer, nn.Linear) else "in_channels per group"
        return f"reduction dimension ({what} = {reduction}) is not a multiple of {GROUP_SIZE}"
    return None


def _reduction_last(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` viewed as ``[out, *kernel, reduction]`` so groups of 4 are consecutive in memory order."""
    return weight.detach().movedim(1, -1)


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """Boolean keep-mask, shaped like ``weight``: the 2 largest magnitudes of every group of 4."""
    moved = _reduction_last(weight)
    groups = moved.reshape(-1, GROUP_SIZE).abs().float()
    top = groups.topk(KEEP_PER_GROUP, dim=1).indices
    keep = torch.zeros(groups.shape, dtype=torch.bool, device=weight.device).scatter_(1, top, True)
    return keep.reshape(moved.shape).movedim(-1, 1)


def eligible_layers(module: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[SkippedLayer]]:
    eligible, skipped = [], []
    for name, layer in weight_layers(module):
        reason = ineligible_reason(layer)
        if reason is None:
            eligible.append((name, layer))
        else:
            skipped.append(SkippedLayer(name, type(layer).__name__, reason))
    for name, reason in tied_layers(module).items():  # e.g. a Linear head tied to an nn.Embedding
        skipped.append(SkippedLayer(name, type(module.get_submodule(name)).__name__, reason))
    return eligible, skipped


def prune_2_4(module: nn.Module) -> PruneReport:
    """Apply the 2:4 pattern in place to every eligible Conv/Linear weight."""
    reject_reparametrized(module, METHOD)
    eligible, skipped = eligible_layers(module)
    if not eligible:
        detail = "; ".join(f"{s.name}: {s.reason}" for s in skipped) or "it has no Conv or Linear layer"
        raise PruneError(
            f"prune method '{METHOD}': no layer of {type(module).__name__} can hold the 2:4 pattern ({detail})",
            hint="2:4 needs Linear in_features or Conv in_channels (per group) that are multiples of 4",
        )
    params_before, nonzero_params_before = count_params(module)
    stats_before = {name: weight_stats(layer) for name, layer in eligible}
    with torch.no_grad():
        for _, layer in eligible:
            layer.weight.mul_(mask_2_4(layer.weight).to(layer.weight.dtype))
    records = tuple(layer_record(name, layer, stats_before[name], "zeroed") for name, layer in eligible)
    params_after, nonzero_params_after = count_params(module)
    log.info("2:4 pruning: %d layers pruned, %d skipped", len(records), len(skipped))
    achieved = weight_sparsity(records)
    newly_zeroed = sum(stats_before[r.name][3] for r in records) - sum(weight_stats(layer)[3] for _, layer in eligible)
    weights = sum(int(np.prod(r.weight_shape_before)) for r in records)
    notes = [LAYOUT_NOTE, *zeroing_notes(newly_zeroed, weights, achieved, SPARSITY), ENGINE_NOTE]
    if skipped:
        notes.append(f"{len(skipped)} layer(s) stay dense: {', '.join(s.name for s in skipped)}")
    return PruneReport(
        method=METHOD,
        target_sparsity=SPARSITY,
        achieved_sparsity=achieved,
        params_before=params_before,
        params_after=params_after,
        nonzero_params_before=nonzero_params_before,
        nonzero_params_after=nonzero_params_after,
        layers=records,
        skipped=tuple(skipped),
        sparse_2_4=True,
        newly_zeroed=newly_zeroed,
        options={"group_size": GROUP_SIZE, "keep_per_group": KEEP_PER_GROUP},
        notes=tuple(notes),
    )


def verify_2_4(module: nn.Module) -> list[TwoFourViolation]:
    """Every eligible layer whose weight has a group of 4 with more than 2 nonzeros ([] if none)."""
    violations = []
    eligible, _ = eligible_layers(module)
    for name, layer in eligible:
        moved = _reduction_last(layer.weight)
        nonzero_per_group = (moved.reshape(-1, GROUP_SIZE) != 0).sum(dim=1)
        bad = torch.nonzero(nonzero_per_group > KEEP_PER_GROUP).flatten()
        if bad.numel() == 0:
            continue
        first = int(bad[0])
        position = np.unravel_index(first * GROUP_SIZE, tuple(moved.shape))
        violations.append(
            TwoFourViolation(
                layer=name,
                bad_groups=int(bad.numel()),
                total_groups=int(nonzero_per_group.numel()),
                first_output=int(position[0]),
                first_kernel_position=tuple(int(p) for p in position[1:-1]),
                first_inputs=(int(position[-1]), int(position[-1]) + GROUP_SIZE),
                first_nonzero=int(nonzero_per_group[first]),
            )
        )
    return violations


def run(module: nn.Module, sparsity: float | None, example_inputs: Any = None) -> tuple[nn.Module, PruneReport]:
    """Registry entry: the pattern fixes sparsity at 0.5, so only None or 0.5 is accepted."""
    if sparsity is not None and (isinstance(sparsity, bool) or sparsity != SPARSITY):
        raise PruneError(
            f"prune method '{METHOD}': sparsity is fixed at {SPARSITY} by the 2:4 pattern, got {sparsity!r}",
            hint="leave prune.sparsity out (or set it to 0.5) for 2:4, or use method 'magnitude' for another sparsity",
        )
    return module, prune_2_4(module)
