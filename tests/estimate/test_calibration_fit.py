from __future__ import annotations

import pytest

from edgekit.estimate.calibration import Observation, fit_factors, median_error_pct
from edgekit.estimate.roofline import default_factors, latency_from_classes


def _observations(scale: float, wobble: tuple[float, ...]) -> list[Observation]:
    """Graphs whose true latency is the default CPU factors' estimate x ``scale`` (x a little noise each)."""
    prior = default_factors("cpu")
    mixes = [{"conv": 5.0, "elementwise": 1.0}, {"matmul": 8.0, "normalization": 0.5}, {"conv": 1.0, "matmul": 2.0},
             {"pooling": 0.5, "conv": 3.0}, {"matmul": 1.0, "elementwise": 2.0}, {"conv": 0.5, "resize": 0.4}]  # fmt: skip
    return [Observation(f"g{i}", mix, 20, latency_from_classes(mix, 20, prior) * scale * w) for i, (mix, w) in enumerate(zip(mixes, wobble))]


def test_a_uniformly_slower_device_gets_the_priors_times_one_scale() -> None:
    prior = default_factors("cpu")
    observations = _observations(2.5, (1.0, 1.05, 0.96, 1.02, 0.98, 1.04))
    fitted = fit_factors(observations, prior, source="test")
    assert "one common scale" in fitted.source
    assert median_error_pct(observations, fitted) < 6.0 < median_error_pct(observations, prior)
    for cls in ("conv", "matmul"):
        assert fitted.efficiency[cls] == pytest.approx(prior.efficiency[cls] / 2.5, rel=0.15)


def test_no_observations_is_an_error_that_says_what_is_needed() -> None:
    from edgekit.estimate.graph_cost import EstimateError

    with pytest.raises(EstimateError, match="no observations to calibrate from"):
        fit_factors([], default_factors("cpu"), source="test")
