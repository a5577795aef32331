"""Golden files: a few recipe inputs with their FP32 reference outputs, for the device's self-check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def write_golden(root: Path, pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], atol: float, rtol: float, min_cosine: float) -> dict[str, Any]:
    """Write ``golden/inputs_NNN.npz`` and ``golden/outputs_NNN.npz``; return the manifest section."""
    directory = root / "golden"
    directory.mkdir(exist_ok=True)
    batches = []
    for index, (inputs, outputs) in enumerate(pairs):
        inputs_name = f"golden/inputs_{index:03d}.npz"
        outputs_name = f"golden/outputs_{index:03d}.npz"
        np.savez(root / inputs_name, **inputs)
        np.savez(root / outputs_name, **outputs)
        batches.append({"inputs": inputs_name, "outputs": outputs_name})
    return {"batches": batches, "atol": atol, "rtol": rtol, "min_cosine": min_cosine}
