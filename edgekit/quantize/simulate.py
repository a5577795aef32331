"""Estimate a model's accuracy and size in a format this host cannot run (FP8, MXFP8, MXFP4, NVFP4).

Weights of MatMul/Gemm/Conv are rounded through the exact codec (``edgekit.quantize.codecs``) and
written back as FP32, so ONNX Runtime on the CPU computes what the format would store. For FP8,
activations entering those ops are also rounded, with ONNX ``Cast`` to FLOAT8E4M3FN and back (round to
nearest even, saturating) after dividing by the calibrated per-tensor scale. MX and NVFP4 simulate
weights only: their activation scales are computed per block at run time on the device, which this
estimate does not model — the sweep says so next to the number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgekit.precision import Precision
from edgekit.quantize.codecs import FORMATS, quantize_dequantize

#: precision -> (weight format in the codec registry, whether activations are simulated too)
SIMULATED: dict[Precision, tuple[str, bool]] = {
    Precision.FP8: ("fp8_e4m3", True),
    Precision.MXFP8: ("mxfp8_e4m3", False),
    Precision.MXFP4: ("mxfp4", False),
    Precision.NVFP4: ("nvfp4", False),
}
WEIGHT_OPS = ("MatMul", "Gemm", "Conv")
FP8_MAX = 448.0


@dataclass(frozen=True)
class SimulatedModel:
    path: Path
    precision: Precision
    weight_format: str
    activations_simulated: bool
    estimated_size_bytes: int
    weights_simulated: int

    def to_manifest(self) -> dict[str, Any]:
        return {"precision": self.precision.value, "weight_format": self.weight_format, "activations_simulated": self.activations_simulated,
                "estimated_size_bytes": self.estimated_size_bytes, "weights_simulated": self.weights_simulated}


def _reduction_axis(op_type: str, input_index: int, array: np.ndarray, trans_b: int) -> int:
    """The axis blocks run along: the reduction (input-feature) axis of the weight."""
    if op_type == "Conv":
        return 1
    if op_type == "Gemm" and input_index == 1 and trans_b:
        return array.ndim - 1
    return 0 if array.ndim == 2 else array.ndim - 2


def simulate(fp32_path: Path, out_path: Path, precision: Precision, activation_amax: Mapping[str, float] | None = None) -> SimulatedModel:
    """Write ``out_path``: ``fp32_path`` with weights (and, for FP8, activations) rounded through ``precision``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight_format, simulate_activations = SIMULATED[precision]
    spec = FORMATS[weight_format]
    model = onnx.load(str(fp32_path), load_external_data=True)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    done: set[str] = set()
    size = 0
    for node in graph.node:
        if node.op_type not in WEIGHT_OPS:
            continue
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        for index in (1,):
            name = node.input[index] if len(node.input) > index else ""
            if name not in initializers or name in done:
                continue
            array = numpy_helper.to_array(initializers[name]).astype(np.float32)
            axis = _reduction_axis(node.op_type, index, array, trans_b)
            if spec.block_size:
                rounded = quantize_dequantize(array, weight_format, axis=axis, tensor_name=name)
            else:
                amax = float(np.abs(array).max()) or 1.0
                rounded = quantize_dequantize(array, weight_format, scale=amax / FP8_MAX, tensor_name=name)
            initializers[name].CopyFrom(numpy_helper.from_array(rounded.astype(np.float32), name))
            size += spec.encoded_bytes(array.shape, axis=axis)
            done.add(name)
    untouched = sum(numpy_helper.to_array(i).nbytes for n, i in initializers.items() if n not in done)
    if simulate_activations and activation_amax:
        new_nodes = []
        for node in graph.node:
            if node.op_type in WEIGHT_OPS and node.input[0] in activation_amax:
                source = node.input[0]
                scale = max(activation_amax[source], 1e-12) / FP8_MAX
                prefix = f"{node.name or source}_fp8sim"
                scale_name = prefix + "_scale"
                graph.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), scale_name))
                new_nodes += [
                    helper.make_node("Div", [source, scale_name], [prefix + "_scaled"]),
                    helper.make_node("Cast", [prefix + "_scaled"], [prefix + "_fp8"], to=TensorProto.FLOAT8E4M3FN),
                    helper.make_node("Cast", [prefix + "_fp8"], [prefix + "_back"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", [prefix + "_back", scale_name], [prefix + "_out"]),
                ]
                node.input[0] = prefix + "_out"
            new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 19)
        if opset < 19:  # Cast to FLOAT8E4M3FN exists from opset 19
            model = onnx.version_converter.convert_version(model, 19)
    onnx.save(model, str(out_path))
    return SimulatedModel(out_path, precision, weight_format, simulate_activations and bool(activation_amax), size + untouched, len(done))
