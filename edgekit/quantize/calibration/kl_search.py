"""TensorRT-style entropy calibration: the clipping threshold whose quantized distribution loses the
least information, measured as KL(P || Q) over a histogram of magnitudes.

For every candidate threshold bin ``i`` in ``num_quant_bins .. num_bins``:

* P is ``hist[:i]`` with everything beyond (the outliers that would be clipped) added to ``P[i-1]``;
* Q quantizes ``hist[:i]`` (without the outliers, as TensorRT does) into ``num_quant_bins`` levels:
  bin ``b`` belongs to level ``floor(b * num_quant_bins / i)``, and each level's count is spread evenly
  over its bins where P is non-zero;
* bins where Q is zero get ``ZERO_Q_COUNT`` counts (additive smoothing, then renormalisation), so a bin
  that P needs and Q cannot represent costs a large but finite divergence. Zeros of P add nothing.

The search is vectorised over all candidates with prefix sums, so one tensor costs
``O(num_bins * num_quant_bins)`` arithmetic in a handful of NumPy calls.
"""

from __future__ import annotations

import functools

import numpy as np

from edgekit.errors import InternalError

#: Count given to a bin where Q is zero (in histogram counts, i.e. far below one sample).
ZERO_Q_COUNT = 1e-4
_TINY = 1e-300


def _x_log_x(values: np.ndarray) -> np.ndarray:
    positive = values > 0
    return np.where(positive, values * np.log(np.where(positive, values, 1.0)), 0.0)


def kl_divergences(hist: np.ndarray, num_quant_bins: int) -> np.ndarray:
    """KL(P || Q) for the candidates ``i = num_quant_bins .. len(hist)``; entry ``k`` is ``i = num_quant_bins + k``.

    ``hist`` is a 1-D histogram of magnitudes with a positive total.
    """
    counts = np.asarray(hist, dtype=np.float64)
    num_bins = counts.size
    if counts.ndim != 1 or not 1 <= num_quant_bins <= num_bins or counts.sum() <= 0:
        raise InternalError(f"kl_divergences needs a non-empty 1-D histogram with >= {num_quant_bins} bins")
    total = counts.sum()
    prefix = np.concatenate(([0.0], np.cumsum(counts)))
    prefix_nonzero = np.concatenate(([0], np.cumsum(counts > 0))).astype(np.int32)
    prefix_x_log_x = np.concatenate(([0.0], np.cumsum(_x_log_x(counts))))

    candidates = np.arange(num_quant_bins, num_bins + 1)
    last = candidates - 1
    outliers = total - prefix[candidates]
    p_log_p = prefix_x_log_x[last] + _x_log_x(counts[last] + outliers)

    bounds = _level_bounds(num_bins, num_quant_bins)
    q_mass = np.diff(prefix[bounds], axis=1)
    p_nonzero_bins = np.diff(prefix_nonzero[bounds], axis=1)
    p_nonzero_bins[:, -1] += (counts[last] == 0) & (outliers > 0)  # the folded bin may become non-zero

    representable = q_mass > 0
    q_zero_bins = candidates - (p_nonzero_bins * representable).sum(axis=1)
    q_total = prefix[candidates] + ZERO_Q_COUNT * q_zero_bins
    # log of Q per bin of each level; levels with no mass contribute 0 below (their P mass is 0 too) ...
    log_q = np.log(np.maximum(q_mass / np.maximum(p_nonzero_bins, 1), _TINY))
    # ... except the outliers folded into the last level, which meet Q = ZERO_Q_COUNT when that level is empty.
    log_q_last = np.where(representable[:, -1], log_q[:, -1], np.log(ZERO_Q_COUNT))
    p_log_q = (q_mass * log_q).sum(axis=1) + outliers * log_q_last
    return (p_log_p - p_log_q) / total - np.log(total) + np.log(q_total)


@functools.lru_cache(maxsize=8)
def _level_bounds(num_bins: int, num_quant_bins: int) -> np.ndarray:
    """``bounds[k, j]``: first bin of level ``j`` for candidate ``i = num_quant_bins + k`` (``bounds[k, -1] = i``)."""
    candidates = np.arange(num_quant_bins, num_bins + 1)
    levels = np.arange(num_quant_bins + 1)
    bounds = (levels[None, :] * candidates[:, None] + num_quant_bins - 1) // num_quant_bins
    bounds.setflags(write=False)
    return bounds


def entropy_threshold_bins(hist: np.ndarray, num_quant_bins: int) -> int:
    """The number of bins ``i`` kept below the threshold with the least KL divergence (ties: the smallest).

    The threshold itself is ``i * bin_width``. A histogram narrower than ``num_quant_bins`` keeps all bins.
    """
    counts = np.asarray(hist)
    if counts.size <= num_quant_bins:
        return int(counts.size)
    divergences = kl_divergences(counts, num_quant_bins)
    return num_quant_bins + int(np.argmin(divergences))
