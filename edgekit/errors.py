"""Host-side errors. The base classes live in :mod:`edgekit_runtime.errors` so that one hierarchy
covers both the dev host and the device."""

from __future__ import annotations

from edgekit_runtime.errors import (
    BackendError,
    BundleError,
    EdgekitError,
    InputSignatureError,
    InternalError,
)

__all__ = [
    "BackendError",
    "BuildError",
    "BundleError",
    "ConfigError",
    "EdgekitError",
    "EvaluationError",
    "ExportError",
    "InputSignatureError",
    "InternalError",
    "ParityError",
    "RecipeError",
    "SourceError",
    "TargetError",
    "AccuracyBudgetError",
]


class ConfigError(EdgekitError):
    """A YAML configuration file (recipe, target profile) is missing, unparsable or invalid."""


class RecipeError(ConfigError):
    """A recipe is missing, malformed, or names something that does not exist."""


class TargetError(ConfigError):
    """A target profile is unknown or invalid."""


class SourceError(EdgekitError):
    """A model source cannot be loaded (factory import fails, wrong return type, corrupt file)."""


class ExportError(EdgekitError):
    """ONNX export failed (unsupported op, checker failure)."""


class ParityError(ExportError):
    """The exported ONNX model does not match PyTorch within the recipe's tolerance."""


class BuildError(EdgekitError):
    """The engine build failed, or the output directory cannot be written."""


class EvaluationError(EdgekitError):
    """The recipe's evaluation data or metric cannot be computed."""


class AccuracyBudgetError(EvaluationError):
    """The built model is outside the recipe's accuracy budget."""


class PruneError(EdgekitError):
    """Pruning cannot be done as asked (unknown method, sparsity out of range, untraceable model, ...)."""


__all__.append("PruneError")


class QuantizationError(EdgekitError):
    """A tensor cannot be quantized to the requested format (unknown format, bad block size or axis,
    values the format cannot represent such as NaN in FP4 E2M1), or encoded codes are invalid."""


__all__.append("QuantizationError")
