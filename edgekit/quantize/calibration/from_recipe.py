"""The calibrator a recipe asks for, and where calibration ranges are cached.

Shared by the quantize stage (:mod:`edgekit.quantize.stage`) and the ``auto`` search's ONNX Runtime
planner, which both calibrate with the recipe's ``build.quantization`` settings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.quantize.calibration.observers import CalibratorSpec

if TYPE_CHECKING:
    from edgekit.quantize.plan import QuantizationPlan
    from edgekit.recipe import QuantizationSpec


def default_cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "calibration"


def calibrator_spec(spec: QuantizationSpec, plan: QuantizationPlan) -> CalibratorSpec:
    symmetric = plan.activation_symmetric
    if spec.calibrator == "percentile":
        return CalibratorSpec.create("percentile", percentile=spec.percentile, symmetric=symmetric)
    if spec.calibrator == "entropy":
        # Asymmetric (uint8) ranges search each side with its own levels: 256 for a one-sided ReLU output.
        return CalibratorSpec.create("entropy", symmetric=symmetric, num_quant_bins=128 if symmetric else 256)
    return CalibratorSpec.create("minmax", symmetric=symmetric)
