"""Engine builders: turn a checked ONNX model into what a backend runs on the target.

One builder per backend, looked up by name. TensorRT engines are built where they run (see the
runtime); the ONNX Runtime builder writes the portable graph and records providers and options.
"""

from __future__ import annotations

from edgekit.engines.onnxruntime import EngineBuild, build_onnxruntime
from edgekit.precision import Backend

BUILDERS = {Backend.ONNXRUNTIME: build_onnxruntime}

__all__ = ["BUILDERS", "EngineBuild", "build_onnxruntime"]
