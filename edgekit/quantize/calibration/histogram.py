"""A streaming histogram of activation magnitudes whose range grows without dropping data.

Negative and non-negative values are counted in two rows over the same bins of ``|x|``: row 0 holds
``x < 0``, row 1 holds ``x >= 0``. Their sum is the histogram of ``|x|`` (symmetric calibration); each
row alone is one side of the signed distribution (asymmetric calibration).
"""

from __future__ import annotations

import math

import numpy as np

from edgekit.quantize.calibration.errors import CalibrationError

#: Elements converted to float64 at a time, so a large activation never doubles in memory at once.
CHUNK_ELEMENTS = 1 << 20
NEGATIVE, NON_NEGATIVE = 0, 1


class MagnitudeHistogram:
    """``num_bins`` equal bins over ``[0, range_max]``; a value equal to ``range_max`` falls in the last bin.

    When a batch holds a magnitude beyond ``range_max``, the bin width grows by the smallest integer
    factor ``k`` that covers it and every ``k`` neighbouring bins are merged, so the counts stay exactly
    those of a histogram over the new range built in one pass (up to values on a bin edge).
    """

    def __init__(self, num_bins: int) -> None:
        if num_bins < 1:
            raise CalibrationError(f"a histogram needs at least one bin, got num_bins={num_bins}")
        self.num_bins = num_bins
        self.counts = np.zeros((2, num_bins), dtype=np.int64)
        self.range_max = 0.0
        self.observed_min = math.inf
        self.observed_max = -math.inf

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def bin_width(self) -> float:
        return self.range_max / self.num_bins

    @property
    def magnitudes(self) -> np.ndarray:
        """Counts of ``|x|`` per bin (both rows summed)."""
        return self.counts.sum(axis=0)

    def add(self, array: np.ndarray) -> None:
        """Count every element of ``array``; raises :class:`CalibrationError` on NaN or infinity."""
        flat = np.asarray(array).reshape(-1)
        if flat.size == 0:
            return
        low, high = finite_min_max(flat)
        self.observed_min = min(self.observed_min, low)
        self.observed_max = max(self.observed_max, high)
        self._grow_to(max(-low, high))
        for start in range(0, flat.size, CHUNK_ELEMENTS):
            self._add_chunk(flat[start : start + CHUNK_ELEMENTS].astype(np.float64))

    def _add_chunk(self, values: np.ndarray) -> None:
        row = (values >= 0).astype(np.int64)
        if self.range_max == 0.0:  # only zeros so far
            self.counts[NON_NEGATIVE, 0] += values.size
            return
        index = np.minimum((np.abs(values) * (self.num_bins / self.range_max)).astype(np.int64), self.num_bins - 1)
        flat_counts = np.bincount(index + row * self.num_bins, minlength=2 * self.num_bins)
        self.counts += flat_counts.reshape(2, self.num_bins)

    def _grow_to(self, amax: float) -> None:
        if amax <= self.range_max:
            return
        if self.range_max == 0.0:  # zeros counted so far stay in bin 0, which still holds 0.0
            self.range_max = amax
            return
        factor = max(2, math.ceil(amax / self.range_max))
        while self.range_max * factor < amax:  # guard against rounding in the division
            factor += 1
        merged = np.zeros_like(self.counts)
        if factor >= self.num_bins:
            merged[:, 0] = self.counts.sum(axis=1)
        else:
            groups = -(-self.num_bins // factor)
            padded = np.zeros((2, groups * factor), dtype=np.int64)
            padded[:, : self.num_bins] = self.counts
            merged[:, :groups] = padded.reshape(2, groups, factor).sum(axis=2)
        self.counts = merged
        self.range_max *= factor


def finite_min_max(flat: np.ndarray) -> tuple[float, float]:
    try:
        low, high = float(flat.min()), float(flat.max())
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"activations of dtype {flat.dtype} cannot be calibrated: {exc}", hint="calibrate floating-point tensors") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise CalibrationError(
            f"activations contain NaN or infinity (min {low}, max {high})",
            hint="check the calibration data and the model in FP32; an overflowing tensor cannot be quantized",
        )
    return low, high
