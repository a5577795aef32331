"""Observers: MinMax vs entropy vs percentile on known distributions, histogram growth, option checks."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.quantize.calibration import (
    CALIBRATORS,
    CalibrationError,
    CalibratorSpec,
    EntropyObserver,
    EntropyOptions,
    MinMaxObserver,
    PercentileOptions,
)
from edgekit.quantize.calibration.histogram import MagnitudeHistogram


@pytest.fixture(scope="module")
def skewed() -> np.ndarray:
    """A standard-normal bulk of 200k values plus 20 outliers with magnitudes 30..60."""
    rng = np.random.default_rng(0)
    outliers = rng.choice([-1.0, 1.0], 20) * rng.uniform(30.0, 60.0, 20)
    return np.concatenate([rng.normal(0.0, 1.0, 200_000), outliers]).astype(np.float32)


def observe(method: str, batches: list[np.ndarray], **options: object):
    observer = CalibratorSpec.create(method, **options)("t")
    for batch in batches:
        observer.update(batch)
    return observer


def test_entropy_and_percentile_clip_outliers_minmax_keeps(skewed: np.ndarray) -> None:
    minmax = observe("minmax", [skewed]).compute()
    entropy = observe("entropy", [skewed]).compute()
    percentile = observe("percentile", [skewed]).compute()
    assert minmax.max == pytest.approx(float(np.abs(skewed).max()))
    assert minmax.max > 50.0
    # The normal bulk reaches about 4.5; KL keeps a little less, percentile 99.99 a little more.
    assert 3.5 < entropy.max < 5.0
    assert entropy.max < 0.1 * minmax.max
    observer = observe("percentile", [skewed])
    assert percentile.max == pytest.approx(np.percentile(np.abs(skewed), 99.99), abs=observer.histogram.bin_width)
    assert 4.0 < percentile.max < 5.5
    assert abs(entropy.max - percentile.max) > 0.1
    for found in (minmax, entropy, percentile):
        assert found.symmetric and found.min == -found.max


def test_entropy_on_a_heavy_tailed_laplace_clips_far_below_the_outlier() -> None:
    rng = np.random.default_rng(1)
    data = rng.laplace(0.0, 1.0, 100_000).astype(np.float32)
    data[:10] = 80.0
    entropy = observe("entropy", [data]).compute()
    assert observe("minmax", [data]).compute().max == 80.0
    assert 8.0 < entropy.max < 16.0


def test_entropy_keeps_the_full_range_of_a_uniform_distribution() -> None:
    data = np.random.default_rng(2).uniform(-1.0, 1.0, 100_000).astype(np.float32)
    amax = float(np.abs(data).max())
    entropy = observe("entropy", [data]).compute()
    assert entropy.max >= 0.98 * amax
    assert entropy.max <= amax


def test_percentile_100_is_the_observed_maximum(skewed: np.ndarray) -> None:
    found = observe("percentile", [skewed], percentile=100.0).compute()
    assert found.max == pytest.approx(float(np.abs(skewed).max()))


@pytest.mark.parametrize("method", sorted(CALIBRATORS))
def test_every_calibrator_gives_symmetric_and_asymmetric_ranges(method: str) -> None:
    data = np.random.default_rng(3).normal(1.0, 0.5, 20_000).astype(np.float32)
    symmetric = observe(method, [data], symmetric=True).compute()
    asymmetric = observe(method, [data], symmetric=False).compute()
    assert symmetric.method == asymmetric.method == method
    assert symmetric.min == -symmetric.max
    assert 2.0 < symmetric.max <= float(np.abs(data).max())
    assert not asymmetric.symmetric
    assert float(data.min()) <= asymmetric.min <= 0.0 < asymmetric.max <= float(data.max())


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_asymmetric_histogram_calibrators_on_non_negative_data_start_at_zero(method: str) -> None:
    data = np.maximum(np.random.default_rng(4).normal(0.0, 1.0, 50_000), 0.0).astype(np.float32)
    data[:5] = 40.0
    found = observe(method, [data], symmetric=False).compute()
    assert found.min == 0.0
    assert 2.0 < found.max < 6.0


def test_asymmetric_percentile_clips_each_tail() -> None:
    rng = np.random.default_rng(5)
    data = np.concatenate([rng.uniform(-1.0, 0.0, 50_000), rng.uniform(0.0, 4.0, 50_000)]).astype(np.float32)
    found = observe("percentile", [data], symmetric=False, percentile=99.0).compute()
    expected_low, expected_high = np.percentile(data, [1.0, 99.0])
    assert found.min == pytest.approx(expected_low, abs=2e-3)
    assert found.max == pytest.approx(expected_high, abs=2e-3)


def test_histogram_grown_over_batches_matches_one_shot_histogram() -> None:
    rng = np.random.default_rng(6)
    batches = [rng.normal(0.0, scale, 5_000).astype(np.float32) for scale in (0.5, 1.5, 7.0, 0.1)]
    batches.append(np.zeros(100, dtype=np.float32))
    grown = MagnitudeHistogram(256)
    for batch in batches:
        grown.add(batch)
    data = np.concatenate(batches).astype(np.float64)
    assert grown.range_max >= np.abs(data).max()
    assert grown.total == data.size
    for row, values in ((0, -data[data < 0]), (1, data[data >= 0])):
        one_shot, _ = np.histogram(values, bins=256, range=(0.0, grown.range_max))
        # Equal up to values that sit exactly on a bin edge, which may land one bin over.
        assert int(np.abs(np.cumsum(grown.counts[row] - one_shot)).max()) <= 2
        assert grown.counts[row].sum() == one_shot.sum()


def test_percentile_over_batches_matches_percentile_over_concatenated_data() -> None:
    rng = np.random.default_rng(7)
    batches = [rng.laplace(0.0, scale, 20_000).astype(np.float32) for scale in (0.2, 1.0, 3.0)]
    streamed = observe("percentile", batches, percentile=99.9)
    one_shot = observe("percentile", [np.concatenate(batches)], percentile=99.9)
    assert streamed.histogram.range_max > one_shot.histogram.range_max  # it grew (and kept every count)
    assert streamed.compute().max == pytest.approx(one_shot.compute().max, abs=streamed.histogram.bin_width)


def test_one_huge_outlier_collapses_old_counts_into_bin_zero_without_losing_them() -> None:
    histogram = MagnitudeHistogram(64)
    histogram.add(np.linspace(-1.0, 1.0, 1000))
    histogram.add(np.array([1e6]))
    assert histogram.total == 1001
    assert histogram.counts[:, 0].sum() == 1000
    assert histogram.counts[1, -1] == 1


def test_zeros_first_then_values() -> None:
    observer = observe("percentile", [np.zeros(10, dtype=np.float32), np.full(10, 2.0, dtype=np.float32)], percentile=100.0)
    assert observer.histogram.counts[1, 0] == 10
    assert observer.compute().max == pytest.approx(2.0)


def test_all_zero_tensor_gives_a_zero_range_with_a_usable_scale() -> None:
    for method in CALIBRATORS:
        found = observe(method, [np.zeros((4, 4), dtype=np.float32)]).compute()
        assert (found.min, found.max) == (0.0, 0.0)
        assert found.scale_zero_point("int8") == (1.0, 0)


def test_minmax_tracks_running_extremes_of_integer_and_float16_arrays() -> None:
    observer = MinMaxObserver()
    observer.update(np.array([[1, -3]], dtype=np.int64))
    observer.update(np.array([2.5], dtype=np.float16))
    assert (observer.compute().min, observer.compute().max) == (-3.0, 3.0)


def test_nan_activations_are_rejected() -> None:
    for method in CALIBRATORS:
        observer = CalibratorSpec.create(method)("t")
        with pytest.raises(CalibrationError, match="NaN or infinity"):
            observer.update(np.array([1.0, np.nan], dtype=np.float32))
        with pytest.raises(CalibrationError, match="NaN or infinity"):
            observer.update(np.array([np.inf], dtype=np.float32))


def test_compute_without_data_and_non_array_update_are_errors() -> None:
    observer = EntropyObserver()
    observer.update(np.zeros((0, 3), dtype=np.float32))
    with pytest.raises(CalibrationError, match="observed no values") as info:
        observer.compute()
    assert "at least one calibration batch" in str(info.value)
    with pytest.raises(CalibrationError, match="NumPy array, got list"):
        observer.update([1.0, 2.0])  # type: ignore[arg-type]


def test_unknown_calibrator_and_option_errors_name_the_fix() -> None:
    with pytest.raises(CalibrationError, match="unknown calibrator 'kl'") as info:
        CalibratorSpec.create("kl")
    assert "minmax, entropy, percentile" in str(info.value)
    with pytest.raises(CalibrationError, match="calibrator 'entropy' has no option percentile") as info:
        CalibratorSpec.create("entropy", percentile=99.0)
    assert "num_quant_bins" in str(info.value)
    with pytest.raises(CalibrationError, match="option symmetric must be true or false, got 'no'"):
        CalibratorSpec.create("minmax", symmetric="no")
    with pytest.raises(CalibrationError, match="option symmetric must be true or false, got 0"):
        CalibratorSpec.create("entropy", symmetric=0)
    with pytest.raises(CalibrationError, match="num_bins must be a positive integer, got 0"):
        CalibratorSpec.create("percentile", num_bins=0)
    with pytest.raises(CalibrationError, match=r"num_quant_bins must be an integer in 2\.\.num_bins \(64\), got 128"):
        EntropyOptions(num_bins=64)
    with pytest.raises(CalibrationError, match=r"percentile must be a number in \(0, 100\], got 101"):
        PercentileOptions(percentile=101)
    with pytest.raises(CalibrationError, match="calibrator 'entropy' takes EntropyOptions, got PercentileOptions"):
        EntropyObserver(PercentileOptions())  # type: ignore[arg-type]
    with pytest.raises(CalibrationError, match="takes EntropyOptions, got PercentileOptions"):
        CalibratorSpec("entropy", PercentileOptions())


def test_spec_makes_fresh_observers_and_reports_resolved_options() -> None:
    spec = CalibratorSpec.create("percentile", percentile=99.9)
    first, second = spec("a"), spec("b")
    assert first is not second and first.options is second.options
    assert spec.options_json() == {"symmetric": True, "num_bins": 8192, "percentile": 99.9}
    assert CalibratorSpec.create().method == "entropy"
