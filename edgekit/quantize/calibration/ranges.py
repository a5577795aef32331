"""Calibrated activation ranges and the (scale, zero point) pairs ONNX QuantizeLinear uses for them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from edgekit.quantize.calibration.errors import CalibrationError

QuantDtype = Literal["int8", "uint8", "fp8_e4m3"]
QUANT_DTYPES: tuple[str, ...] = get_args(QuantDtype)

#: Largest finite value of FLOAT8E4M3FN, the FP8 format QuantizeLinear targets for activations.
FP8_E4M3_MAX = 448.0
#: Integer grid of each integer dtype.
_INT_LIMITS = {"int8": (-128, 127), "uint8": (0, 255)}
_TINY_SCALE = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class TensorRange:
    """The clipping range ``[min, max]`` a calibrator chose for one tensor.

    ``symmetric`` ranges satisfy ``min == -max``. ``method`` names the calibrator (``minmax``,
    ``entropy``, ``percentile``) so that a bundle records where its ranges came from.
    """

    min: float
    max: float
    method: str
    symmetric: bool

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min) and math.isfinite(self.max)):
            raise CalibrationError(f"{self.method} range [{self.min}, {self.max}] is not finite", hint="calibration data must not produce NaN or inf")
        if self.min > self.max:
            raise CalibrationError(f"{self.method} range has min {self.min} > max {self.max}")

    @property
    def amax(self) -> float:
        """The largest magnitude in the range."""
        return max(abs(self.min), abs(self.max))

    def scale_zero_point(self, dtype: QuantDtype = "int8", symmetric: bool | None = None) -> tuple[float, int]:
        """``(scale, zero_point)`` for ``QuantizeLinear``: ``q = saturate(round(x / scale) + zero_point)``.

        * symmetric int8: ``zero_point = 0``, ``scale = amax / 127``;
        * symmetric uint8: ``zero_point = 128``, ``scale = amax / 127``;
        * asymmetric int8/uint8: the range is widened to include 0.0, ``scale = (max - min) / 255`` and
          the integer ``zero_point`` makes 0.0 exactly representable;
        * ``fp8_e4m3`` (symmetric only): ``scale = amax / 448``, ``zero_point = 0``.

        ``symmetric`` defaults to the range's own. The scale is rounded to float32 (what the graph stores)
        before the zero point is derived from it. A range of width zero gets ``scale = 1.0``.
        """
        if dtype not in QUANT_DTYPES:
            raise CalibrationError(f"unknown quantized dtype '{dtype}'", hint=f"use one of {', '.join(QUANT_DTYPES)}")
        symmetric = self.symmetric if symmetric is None else symmetric
        if dtype == "fp8_e4m3":
            if not symmetric:
                raise CalibrationError("fp8_e4m3 quantization is symmetric only (zero point 0.0)", hint="pass symmetric=True")
            return _float32_scale(self.amax / FP8_E4M3_MAX), 0
        qmin, qmax = _INT_LIMITS[dtype]
        if symmetric:
            return _float32_scale(self.amax / 127.0), (qmin + qmax + 1) // 2
        low, high = min(self.min, 0.0), max(self.max, 0.0)
        scale = _float32_scale((high - low) / (qmax - qmin))
        zero_point = int(np.clip(np.round(qmin - low / scale), qmin, qmax))
        return scale, zero_point

    def to_json(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "method": self.method, "symmetric": self.symmetric}

    @classmethod
    def from_json(cls, data: object, where: str) -> TensorRange:
        """Read what :meth:`to_json` wrote; ``where`` names the file and tensor for error messages."""
        if not isinstance(data, dict) or set(data) != {"min", "max", "method", "symmetric"}:
            raise CalibrationError(f"{where}: expected an object with keys min, max, method, symmetric, got {data!r}")
        low, high, method, symmetric = data["min"], data["max"], data["method"], data["symmetric"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise CalibrationError(f"{where}: min and max must be numbers, got {low!r} and {high!r}")
        if not isinstance(method, str) or not isinstance(symmetric, bool):
            raise CalibrationError(f"{where}: method must be a string and symmetric a boolean")
        return cls(float(low), float(high), method, symmetric)


def _float32_scale(scale: float) -> float:
    if scale <= 0.0:
        return 1.0
    return float(np.float32(max(scale, _TINY_SCALE)))
