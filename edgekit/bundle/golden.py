"""Golden files: a few recipe inputs with their FP32 reference outputs, for the device's self-check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgekit.data import Batch, sequence_steps
from edgekit.recipe import Recipe, StateSpec


def golden_batches(recipe: Recipe, samples: list[Batch]) -> list[Batch]:
    """The samples the golden files hold: the first ``build.golden_batches`` batches, or for a stateful
    recipe every chunk of its first ``build.golden_batches`` sequences (the self-check replays them in order)."""
    count = recipe.build.golden_batches
    steps = sequence_steps(samples) if recipe.state else None
    if steps is None:
        return samples[:count]
    first = sorted({sequence for sequence, _ in steps})[:count]
    return [batch for batch, (sequence, _) in zip(samples, steps) if sequence in first]


def write_golden(root: Path, pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], atol: float, rtol: float, min_cosine: float,
                 *, steps: list[tuple[int, int]] | None = None, state: tuple[StateSpec, ...] = ()) -> dict[str, Any]:
    """Write ``golden/inputs_NNN.npz`` and ``golden/outputs_NNN.npz``; return the manifest section.

    For a stateful model ``steps`` gives each pair's (sequence, step) and ``state`` the state pairs: the
    manifest then lists them so that the self-check feeds each call's state outputs to the next call of
    its sequence. The inputs files keep the reference's state inputs too (a runtime that does not know
    sequences replays them as recorded)."""
    directory = root / "golden"
    directory.mkdir(exist_ok=True)
    batches = []
    for index, (inputs, outputs) in enumerate(pairs):
        inputs_name = f"golden/inputs_{index:03d}.npz"
        outputs_name = f"golden/outputs_{index:03d}.npz"
        np.savez(root / inputs_name, **inputs)
        np.savez(root / outputs_name, **outputs)
        entry: dict[str, Any] = {"inputs": inputs_name, "outputs": outputs_name}
        if steps is not None and state:
            entry["sequence"], entry["step"] = steps[index]
        batches.append(entry)
    section: dict[str, Any] = {"batches": batches, "atol": atol, "rtol": rtol, "min_cosine": min_cosine}
    if steps is not None and state:
        section["state"] = [{"input": s.input, "output": s.output} for s in state]
    return section
