"""Shared inputs for the codec tests: a float32 sweep that holds every rounding tie of the small formats."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def float32_sweep() -> np.ndarray:
    """Every float32 whose low 12 mantissa bits are 0x000, 0x001, 0x800 or 0xFFF (4 Mi values, both signs).

    FP8/FP4 round at mantissa bit 19 or above, so every exact tie between two representable values (low bits all
    zero), the float32 just above it (0x001) and just below the next one (0xFFF) are in here, over the whole range:
    float32 subnormals, values beyond every format's max, ±inf and NaNs with many payloads.
    """
    high = np.arange(1 << 20, dtype=np.uint32) << 12
    bits = np.concatenate([high | low for low in (0x000, 0x001, 0x800, 0xFFF)])
    return bits.view(np.float32)
