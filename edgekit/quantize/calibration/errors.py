"""The error raised when activation ranges cannot be calibrated."""

from __future__ import annotations

from edgekit.errors import QuantizationError


class CalibrationError(QuantizationError):
    """Activation calibration cannot be done as asked: unknown calibrator or option, a tensor name the
    model does not have, a calibration batch that does not fit the model, or activations with NaN/inf."""
