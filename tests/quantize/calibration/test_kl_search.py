"""The vectorised KL search against a slow, literal implementation of the same definition."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from edgekit.quantize.calibration.kl_search import ZERO_Q_COUNT, entropy_threshold_bins, kl_divergences


def reference_kl(hist: list[float], num_quant_bins: int, kept_bins: int) -> float:
    """KL(P || Q) for one candidate, bin by bin, as the module docstring defines it."""
    p = [float(v) for v in hist[:kept_bins]]
    p[-1] += float(sum(hist[kept_bins:]))
    q = [0.0] * kept_bins
    for level in range(num_quant_bins):
        members = [b for b in range(kept_bins) if b * num_quant_bins // kept_bins == level]
        mass = sum(float(hist[b]) for b in members)
        nonzero = [b for b in members if p[b] > 0]
        for b in nonzero:
            q[b] = mass / len(nonzero)
    q = [value if value > 0 else ZERO_Q_COUNT for value in q]
    p_total, q_total = sum(p), sum(q)
    return sum((pb / p_total) * math.log((pb / p_total) / (qb / q_total)) for pb, qb in zip(p, q) if pb > 0)


def random_histograms() -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(10)
    cases = []
    for num_bins, num_quant_bins in ((16, 4), (37, 8), (64, 8), (50, 7), (24, 24)):
        dense = rng.integers(0, 50, num_bins)
        sparse = np.where(rng.random(num_bins) < 0.6, 0, rng.integers(1, 9, num_bins))
        decaying = np.round(1000 * np.exp(-np.arange(num_bins) / 4.0)).astype(np.int64)
        decaying[-1] = 3  # an outlier after an empty stretch
        cases += [(dense, num_quant_bins), (sparse, num_quant_bins), (decaying, num_quant_bins)]
    return cases


@pytest.mark.parametrize(("hist", "num_quant_bins"), random_histograms())
def test_vectorised_divergences_equal_the_reference(hist: np.ndarray, num_quant_bins: int) -> None:
    if hist.sum() == 0:
        hist[0] = 1
    expected = [reference_kl(list(hist), num_quant_bins, i) for i in range(num_quant_bins, hist.size + 1)]
    found = kl_divergences(hist, num_quant_bins)
    np.testing.assert_allclose(found, expected, rtol=1e-9, atol=1e-12)
    assert entropy_threshold_bins(hist, num_quant_bins) == num_quant_bins + int(np.argmin(expected))


def test_clipping_an_isolated_outlier_costs_more_than_keeping_it_when_it_is_frequent() -> None:
    rare = np.zeros(64, dtype=np.int64)
    rare[:8] = 1000
    rare[63] = 1
    frequent = rare.copy()
    frequent[63] = 4000
    assert entropy_threshold_bins(rare, 8) < 64
    assert entropy_threshold_bins(frequent, 8) == 64


def test_a_histogram_narrower_than_the_levels_keeps_every_bin() -> None:
    assert entropy_threshold_bins(np.array([5, 0, 3]), 128) == 3


def test_2048_bins_for_300_tensors_takes_seconds_not_minutes() -> None:
    rng = np.random.default_rng(11)
    histograms = [np.histogram(np.abs(rng.standard_t(3, 5_000)), bins=2048)[0] for _ in range(20)]
    start = time.perf_counter()
    for hist in histograms:
        entropy_threshold_bins(hist, 128)
    seconds_per_tensor = (time.perf_counter() - start) / len(histograms)
    assert seconds_per_tensor * 300 < 15.0  # about 5 ms a tensor on a 2-core box
