"""Engine builders: turn a checked ONNX model into what a backend runs on the target.

One builder per backend, looked up by name. TensorRT engines are built where they run (see the
runtime); the ONNX Runtime builder writes the portable graph and records providers and options; the
OpenVINO builder keeps the ONNX graph and records device, precision hint and compiled-model cache key.
"""

from __future__ import annotations

from typing import Callable

from edgekit.engines.onnxruntime import EngineBuild, build_onnxruntime
from edgekit.engines.openvino import build_openvino
from edgekit.engines.tensorrt import build_tensorrt
from edgekit.precision import Backend

#: backend -> builder(model_path, out_path, target, recipe, precision, **backend options) -> EngineBuild
BUILDERS: dict[Backend, Callable[..., EngineBuild]] = {
    Backend.ONNXRUNTIME: build_onnxruntime, Backend.TENSORRT: build_tensorrt, Backend.OPENVINO: build_openvino,
}

__all__ = ["BUILDERS", "EngineBuild", "build_onnxruntime", "build_openvino", "build_tensorrt"]


