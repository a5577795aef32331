"""Activation calibration for INT8/FP8 quantization: observers (MinMax, TensorRT-style entropy,
percentile), activation collection with ONNX Runtime, and a cache of the resulting ranges."""

from __future__ import annotations

from edgekit.quantize.calibration.cache import CacheKey, CalibrationCache, hash_calibration_data, hash_model_files
from edgekit.quantize.calibration.calibrate import CalibrationResult, calibrate
from edgekit.quantize.calibration.collect import collect_activations, default_activation_tensors
from edgekit.quantize.calibration.errors import CalibrationError
from edgekit.quantize.calibration.observers import (
    CALIBRATORS,
    CalibratorSpec,
    EntropyObserver,
    EntropyOptions,
    HistogramObserver,
    MinMaxObserver,
    MinMaxOptions,
    Observer,
    PercentileObserver,
    PercentileOptions,
)
from edgekit.quantize.calibration.ranges import QuantDtype, TensorRange

__all__ = [
    "CALIBRATORS",
    "CacheKey",
    "CalibrationCache",
    "CalibrationError",
    "CalibrationResult",
    "CalibratorSpec",
    "EntropyObserver",
    "EntropyOptions",
    "HistogramObserver",
    "MinMaxObserver",
    "MinMaxOptions",
    "Observer",
    "PercentileObserver",
    "PercentileOptions",
    "QuantDtype",
    "TensorRange",
    "calibrate",
    "collect_activations",
    "default_activation_tensors",
    "hash_calibration_data",
    "hash_model_files",
]
