"""The errors of TensorRT engine building and loading; all are :class:`EdgekitError` subclasses whose
messages name what failed, where, and how to fix it."""

from __future__ import annotations

from edgekit_runtime.errors import BackendError, BundleError


class TensorRTUnavailableError(BackendError):
    """TensorRT's Python bindings cannot be imported, or the installed version is not one edgekit drives."""


class CudaUnavailableError(BackendError):
    """pycuda is missing, or no CUDA device can be opened."""


class EngineBuildError(BackendError):
    """TensorRT could not build an engine: ONNX parser errors (with node names), layers DLA cannot run
    without GPU fallback, a plan the installed TensorRT cannot express, or an empty build result."""


class EngineMismatchError(BackendError):
    """A serialized engine was built by another TensorRT version or for another GPU than this device's."""


class PlanError(BundleError):
    """A bundle's ``tensorrt/plan.json`` is missing or malformed."""
