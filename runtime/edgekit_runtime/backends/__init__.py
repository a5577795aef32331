"""Inference backends, looked up by the name in a bundle manifest's ``backend`` section."""

from __future__ import annotations

from typing import Any

from edgekit_runtime.backends.base import Runner
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.backends.openvino import OpenVinoRunner
from edgekit_runtime.backends.tensorrt import TensorRTRunner
from edgekit_runtime.errors import BackendError

#: Backend name -> runner class. Importing a runner module imports no engine library (onnxruntime,
#: tensorrt, pycuda and openvino load when a runner loads).
BACKENDS: dict[str, type[Runner]] = {"onnxruntime": OnnxRuntimeRunner, "tensorrt": TensorRTRunner, "openvino": OpenVinoRunner}

# Backends edgekit knows of but this runtime cannot run yet, with the reason shown to the user.
_PLANNED_BACKENDS: dict[str, str] = {}

__all__ = ["BACKENDS", "OnnxRuntimeRunner", "OpenVinoRunner", "Runner", "TensorRTRunner", "create_runner"]


def create_runner(bundle: Any, **overrides: Any) -> Runner:
    """Make the (not yet loaded) runner that the bundle's manifest asks for.

    ``bundle`` is a :class:`~edgekit_runtime.bundle.Bundle`; ``overrides`` replace options of the
    manifest's ``backend`` section for this device, e.g. ``intra_op_threads=1`` or
    ``execution_providers=["CPUExecutionProvider"]``. Use the result as a context manager.
    """
    name = bundle.backend.get("name")
    runner_class = BACKENDS.get(name) if isinstance(name, str) else None
    if runner_class is None:
        known = ", ".join(sorted(BACKENDS))
        if name in _PLANNED_BACKENDS:
            raise BackendError(
                f"bundle '{bundle.root}' needs the {name} backend: {_PLANNED_BACKENDS[name]}",
                hint=f"rebuild the bundle for a backend this runtime has ({known})",
            )
        raise BackendError(
            f"bundle '{bundle.root}': unknown backend {name!r} in manifest.json backend.name",
            hint=f"backends this edgekit-runtime knows: {known}",
        )
    return runner_class.from_bundle(bundle, **overrides)
