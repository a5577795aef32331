"""The quantization plan: what a build will quantize, how, and what stays in higher precision (and why).

A plan is backend-neutral data; the writers in ``ort/`` (int8, int8-dynamic, int4) and
``float_writers`` (fp8, mxfp8, mxfp4, nvfp4) turn it into a graph. The manifest records the plan as resolved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edgekit.precision import Backend, Precision
from edgekit.quantize.cpu_isa import reduce_range_for
from edgekit.recipe import QuantizationSpec
from edgekit.target import TargetProfile

#: Ops whose inputs static/dynamic int8 quantizes (QDQ around them); everything else stays float.
INT8_OP_TYPES = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True)
class QuantizationPlan:
    precision: Precision
    backend: Backend
    activation_type: str  # "uint8" | "int8" | "fp8_e4m3" | "none"
    activation_symmetric: bool
    weight_type: str  # "int8" | "int4" | "fp8_e4m3" | "mxfp8" | ...
    per_channel: bool
    calibrator: str | None
    op_types: tuple[str, ...] = INT8_OP_TYPES
    excluded: dict[str, str] = field(default_factory=dict)  # node name -> why it stays in higher precision
    dynamic_nodes: tuple[str, ...] = ()  # nodes quantized dynamically inside a static plan (mixed)
    #: Op types whose outputs get no Q/DQ pair (static QDQ): right when their consumers run in float anyway
    #: (a transformer's MatMul -> bias Add), where output quantization only adds rounding error and two ops.
    float_outputs: tuple[str, ...] = ()
    #: Static QDQ: float consumers of a quantized tensor (a residual Add, LayerNorm) read the float tensor
    #: instead of its quantize-dequantize; ONNX Runtime's writer otherwise routes every consumer through it.
    float_consumers_skip_qdq: bool = False
    #: Static QDQ for ONNX Runtime: flatten conv feature maps in NHWC order (:mod:`edgekit.quantize.ort.layout`).
    channels_last_flatten: bool = False
    #: Static QDQ for ONNX Runtime: compute float stem convolutions channels-last (:mod:`edgekit.quantize.ort.layout`).
    channels_last_stem: bool = False
    #: int8 weights in 7 bits (-64..64) so that x86 AVX2 u8s8 kernels cannot saturate (:mod:`edgekit.quantize.cpu_isa`).
    reduce_range: bool = False
    int4: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def excluding(self, nodes: dict[str, str]) -> "QuantizationPlan":
        return replace(self, excluded={**self.excluded, **nodes})

    def to_manifest(self) -> dict[str, Any]:
        data = asdict(self)
        data["precision"] = self.precision.value
        data["backend"] = self.backend.value
        data["op_types"] = list(self.op_types)
        data["dynamic_nodes"] = list(self.dynamic_nodes)
        data["float_outputs"] = list(self.float_outputs)
        data["notes"] = list(self.notes)
        return data


def activation_type_for(target: TargetProfile, backend: Backend, requested: str) -> tuple[str, bool, str]:
    """(dtype, symmetric, why). uint8 asymmetric where ONNX Runtime's x86/ARM CPU kernels fuse QDQ into
    u8s8 integer kernels; int8 symmetric for TensorRT (its explicit-quantization rule) and GPU providers."""
    if requested != "auto":
        return requested, requested == "int8", "recipe quantization.activation_type"
    if backend is Backend.TENSORRT:
        return "int8", True, "TensorRT explicit quantization needs symmetric int8 Q/DQ"
    providers = [ep.name for ep in target.backend(backend).execution_providers]
    if providers and providers[0] in ("TensorrtExecutionProvider", "CUDAExecutionProvider"):
        return "int8", True, f"{providers[0]} runs symmetric int8 Q/DQ"
    return "uint8", False, "ONNX Runtime CPU fuses uint8-activation QDQ into integer kernels (int8 activations are not fused on x86)"


def make_plan(spec: QuantizationSpec, target: TargetProfile, backend: Backend, precision: Precision) -> QuantizationPlan:
    """The plan a precision implies for this target, before sensitivity analysis adds exclusions."""
    excluded = {name: "recipe quantization.exclude_nodes" for name in spec.exclude_nodes}
    op_types = tuple(t for t in INT8_OP_TYPES if t not in spec.exclude_op_types)
    if precision in (Precision.INT8, Precision.INT8_DYNAMIC):
        reduce_range, range_why = reduce_range_for(target, backend)
        range_notes = (range_why,) if range_why else ()
        if precision is Precision.INT8:
            act, symmetric, why = activation_type_for(target, backend, spec.activation_type)
            reduce_range = reduce_range and act == "uint8"  # the saturation is a u8s8 one
            return QuantizationPlan(precision, backend, act, symmetric, "int8", spec.per_channel, spec.calibrator, op_types, excluded,
                                    reduce_range=reduce_range, notes=(why, *(range_notes if act == "uint8" else ())))
        dynamic_op_types = tuple(t for t in ("MatMul", "Gemm") if t not in spec.exclude_op_types)
        return QuantizationPlan(precision, backend, "uint8", False, "int8", spec.per_channel, None, dynamic_op_types, excluded,
                                reduce_range=reduce_range,
                                notes=("activations quantized per call (DynamicQuantizeLinear); no calibration", *range_notes))
    if precision is Precision.INT4:
        int4_op_types = tuple(t for t in ("MatMul", "Gemm") if t not in spec.exclude_op_types)  # a Gemm runs as a MatMul
        return QuantizationPlan(precision, backend, "none", False, "int4", True, None, int4_op_types, excluded, int4=spec.int4.model_dump(),
                                notes=("weight-only: activations stay float",))
    if precision is Precision.FP8:
        return QuantizationPlan(precision, backend, "fp8_e4m3", True, "fp8_e4m3", True, spec.calibrator, op_types, excluded, float_outputs=op_types,
                                notes=("E4M3 weights per output channel and per-tensor E4M3 activations (TensorRT explicit quantization)",))
    if precision in (Precision.MXFP8, Precision.MXFP4, Precision.NVFP4):
        from edgekit.quantize.block_activations import ACTIVATION_FORMATS, WEIGHT_ONLY_WHY

        activations = ACTIVATION_FORMATS.get(precision)
        note = (f"block-scaled weights; activations {activations.description}, by TensorRT's DynamicQuantize" if activations else
                f"block-scaled weights; {WEIGHT_ONLY_WHY[precision]}")
        return QuantizationPlan(precision, backend, precision.value if activations else "none", True, precision.value, True,
                                spec.calibrator if precision.needs_calibration else None,
                                op_types, excluded, float_outputs=op_types, notes=(note,))
    raise ValueError(f"{precision.value} is not a quantized precision")
