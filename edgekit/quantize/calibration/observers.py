"""Observers: what a calibrator learns about one tensor, batch by batch, and the range it picks.

One interface (:class:`Observer`), one registry (:data:`CALIBRATORS`, name -> observer class) and one
frozen options dataclass per calibrator. :class:`CalibratorSpec` names a calibrator with resolved options;
it is what the pipeline stores, what the cache key hashes, and a factory of fresh observers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np

from edgekit.quantize.calibration.errors import CalibrationError
from edgekit.quantize.calibration.histogram import NEGATIVE, NON_NEGATIVE, MagnitudeHistogram, finite_min_max
from edgekit.quantize.calibration.kl_search import entropy_threshold_bins
from edgekit.quantize.calibration.ranges import TensorRange


def _check_symmetric(value: object) -> None:
    if not isinstance(value, bool):
        raise CalibrationError(f"calibrator option symmetric must be true or false, got {value!r}")


@dataclass(frozen=True)
class MinMaxOptions:
    """``symmetric``: clip to ``[-amax, amax]``; otherwise to the observed ``[min, max]``."""

    symmetric: bool = True

    def __post_init__(self) -> None:
        _check_symmetric(self.symmetric)


@dataclass(frozen=True)
class HistogramOptions:
    symmetric: bool = True
    num_bins: int = 2048

    def __post_init__(self) -> None:
        _check_symmetric(self.symmetric)
        if isinstance(self.num_bins, bool) or not isinstance(self.num_bins, int) or self.num_bins < 1:
            raise CalibrationError(f"calibrator option num_bins must be a positive integer, got {self.num_bins!r}", hint="TensorRT uses 2048")


@dataclass(frozen=True)
class EntropyOptions(HistogramOptions):
    """``num_quant_bins``: quantization levels per side of zero in the KL search: 128 for int8 (symmetric,
    and per side when asymmetric); 256 suits a uint8 tensor that is non-negative (a ReLU output)."""

    num_quant_bins: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.num_quant_bins, bool) or not isinstance(self.num_quant_bins, int) or not 2 <= self.num_quant_bins <= self.num_bins:
            raise CalibrationError(
                f"calibrator option num_quant_bins must be an integer in 2..num_bins ({self.num_bins}), got {self.num_quant_bins!r}",
                hint="128 for int8; num_bins should be much larger (2048)",
            )


@dataclass(frozen=True)
class PercentileOptions(HistogramOptions):
    """``percentile`` of the magnitudes (symmetric) or of each tail (asymmetric) kept unclipped."""

    num_bins: int = 8192
    percentile: float = 99.99

    def __post_init__(self) -> None:
        super().__post_init__()
        value = self.percentile
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 100.0:
            raise CalibrationError(f"calibrator option percentile must be a number in (0, 100], got {value!r}", hint="for example 99.99")


class Observer(ABC):
    """Sees every batch of one tensor (``update``) and then picks its clipping range (``compute``)."""

    method: ClassVar[str]
    options_type: ClassVar[type[Any]]

    def __init__(self, options: Any = None) -> None:
        self.options = self.options_type() if options is None else options
        if not isinstance(self.options, self.options_type):
            raise CalibrationError(f"calibrator '{self.method}' takes {self.options_type.__name__}, got {type(self.options).__name__}")
        self.batches_seen = 0

    def update(self, array: np.ndarray) -> None:
        """Observe one batch of the tensor; raises :class:`CalibrationError` on NaN/inf or a non-numeric array."""
        if not isinstance(array, np.ndarray):
            raise CalibrationError(f"an observer takes a NumPy array, got {type(array).__name__}")
        if array.size:
            self._update(array)
        self.batches_seen += 1

    def compute(self) -> TensorRange:
        """The clipping range for everything observed so far."""
        if not self._has_data():
            raise CalibrationError(
                f"calibrator '{self.method}' observed no values ({self.batches_seen} batches, all empty)",
                hint="pass at least one calibration batch that produces this tensor with a non-zero size",
            )
        return self._compute()

    @abstractmethod
    def _update(self, array: np.ndarray) -> None: ...

    @abstractmethod
    def _has_data(self) -> bool: ...

    @abstractmethod
    def _compute(self) -> TensorRange: ...


class MinMaxObserver(Observer):
    """Running minimum and maximum."""

    method = "minmax"
    options_type = MinMaxOptions

    def __init__(self, options: MinMaxOptions | None = None) -> None:
        super().__init__(options)
        self.observed_min = math.inf
        self.observed_max = -math.inf

    def _update(self, array: np.ndarray) -> None:
        low, high = finite_min_max(array.reshape(-1))
        self.observed_min = min(self.observed_min, low)
        self.observed_max = max(self.observed_max, high)

    def _has_data(self) -> bool:
        return self.observed_min <= self.observed_max

    def _compute(self) -> TensorRange:
        if self.options.symmetric:
            amax = max(-self.observed_min, self.observed_max, 0.0)
            return TensorRange(-amax, amax, self.method, True)
        return TensorRange(self.observed_min, self.observed_max, self.method, False)


class HistogramObserver(Observer):
    """Shared base: a growing :class:`MagnitudeHistogram`; subclasses pick a threshold per side of zero.

    Symmetric: one threshold ``t`` from the histogram of ``|x|`` gives ``[-t, t]``. Asymmetric: the
    negative and non-negative sides are searched on their own, giving ``[-t_neg, t_pos]``. Thresholds
    never exceed the observed extremes.
    """

    options: HistogramOptions

    def __init__(self, options: HistogramOptions | None = None) -> None:
        super().__init__(options)
        self.histogram = MagnitudeHistogram(self.options.num_bins)

    def _update(self, array: np.ndarray) -> None:
        self.histogram.add(array)

    def _has_data(self) -> bool:
        return self.histogram.total > 0

    @abstractmethod
    def _threshold(self, side_counts: np.ndarray, total: int) -> float:
        """The clipping magnitude for one side's counts; ``total`` counts every observed value."""

    def _compute(self) -> TensorRange:
        hist = self.histogram
        total = hist.total
        if self.options.symmetric:
            amax = max(-hist.observed_min, hist.observed_max, 0.0)
            threshold = min(self._threshold(hist.magnitudes, total), amax)
            return TensorRange(-threshold, threshold, self.method, True)
        low = max(-self._threshold(hist.counts[NEGATIVE], total), min(hist.observed_min, 0.0))
        high = min(self._threshold(hist.counts[NON_NEGATIVE], total), max(hist.observed_max, 0.0))
        return TensorRange(low, high, self.method, False)


class EntropyObserver(HistogramObserver):
    """TensorRT-style entropy calibration: the threshold with the least KL(P || Q) (see :mod:`kl_search`)."""

    method = "entropy"
    options_type = EntropyOptions
    options: EntropyOptions

    def _threshold(self, side_counts: np.ndarray, total: int) -> float:
        if side_counts.sum() == 0:
            return 0.0
        return entropy_threshold_bins(side_counts, self.options.num_quant_bins) * self.histogram.bin_width


class PercentileObserver(HistogramObserver):
    """Clip so that at most ``100 - percentile`` percent of all values lie beyond the threshold (per side
    when asymmetric), interpolating linearly inside the bin where that happens."""

    method = "percentile"
    options_type = PercentileOptions
    options: PercentileOptions

    def _threshold(self, side_counts: np.ndarray, total: int) -> float:
        allowed_beyond = total * (100.0 - self.options.percentile) / 100.0
        needed_below = side_counts.sum() - allowed_beyond
        if needed_below <= 0:
            return 0.0
        cumulative = np.cumsum(side_counts)
        index = int(np.searchsorted(cumulative, needed_below, side="left"))
        below_bin = cumulative[index] - side_counts[index]
        fraction = (needed_below - below_bin) / side_counts[index]
        return (index + float(fraction)) * self.histogram.bin_width


#: Calibrator name -> observer class. Every entry is exercised by the tests.
CALIBRATORS: dict[str, type[Observer]] = {
    MinMaxObserver.method: MinMaxObserver,
    EntropyObserver.method: EntropyObserver,
    PercentileObserver.method: PercentileObserver,
}


@dataclass(frozen=True)
class CalibratorSpec:
    """A calibrator by name with its resolved options; calling it makes a fresh observer for a tensor."""

    method: str
    options: Any

    def __post_init__(self) -> None:
        observer_type = _observer_type(self.method)
        if not isinstance(self.options, observer_type.options_type):
            raise CalibrationError(
                f"calibrator '{self.method}' takes {observer_type.options_type.__name__}, got {type(self.options).__name__}",
                hint=f"use CalibratorSpec.create('{self.method}', ...)",
            )

    @classmethod
    def create(cls, method: str = "entropy", **options: Any) -> CalibratorSpec:
        """``CalibratorSpec.create("percentile", percentile=99.9)``; unknown names or options raise."""
        options_type = _observer_type(method).options_type
        known = [f.name for f in fields(options_type)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise CalibrationError(f"calibrator '{method}' has no option {', '.join(unknown)}", hint=f"its options: {', '.join(known)}")
        return cls(method, options_type(**options))

    def __call__(self, tensor_name: str) -> Observer:
        return _observer_type(self.method)(self.options)

    def options_json(self) -> dict[str, Any]:
        return asdict(self.options)


def _observer_type(method: str) -> type[Observer]:
    try:
        return CALIBRATORS[method]
    except (KeyError, TypeError):
        raise CalibrationError(f"unknown calibrator {method!r}", hint=f"use one of {', '.join(CALIBRATORS)}") from None
