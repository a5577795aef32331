"""ONNX Runtime graph writers for a :class:`QuantizationPlan`: static QDQ (with edgekit's own
calibrated ranges), dynamic int8, and weight-only int4 (``MatMulNBits``, or blocked int4 Q/DQ for
TensorRT). Each takes an FP32 model file and writes a quantized one."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)


class Range(Protocol):
    min: float
    max: float


def _save(model: Any, path: Path) -> Path:
    import onnx

    large = model.ByteSize() > 1_800_000_000
    onnx.save(model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None)
    return path


def preprocess(fp32_path: Path, out_path: Path) -> Path:
    """ONNX Runtime's quantization pre-processing: symbolic shape inference and basic graph cleanup, so
    that the quantizer sees fused, shaped ops."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=False, auto_merge=True)
    except Exception as exc:  # symbolic shape inference fails on some graphs; plain shape inference still works
        log.info("symbolic shape inference failed (%s); pre-processing without it", exc)
        quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=True)
    return out_path


def quantizable_nodes(model_path: Path, op_types: tuple[str, ...]) -> list[str]:
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [node.name for node in graph.node if node.op_type in op_types]


def calibration_tensors(model_path: Path, plan: QuantizationPlan) -> list[str]:
    """Activation tensors the static writer needs ranges for: non-constant inputs and the outputs of
    every node it quantizes (QDQ pairs sit on both sides of a quantized op)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    skip = set(plan.excluded) | set(plan.dynamic_nodes)
    names: list[str] = []
    for node in graph.node:
        if node.op_type in plan.op_types and node.name not in skip:
            for tensor in [*node.input, *node.output]:
                if tensor and tensor not in constants and tensor not in names:
                    names.append(tensor)
    return names


def write_static_qdq(fp32_path: Path, out_path: Path, plan: QuantizationPlan, ranges: Mapping[str, Range]) -> Path:
    """Insert QuantizeLinear/DequantizeLinear pairs with the given activation ranges (per-channel int8
    weights); excluded nodes stay float; ``plan.dynamic_nodes`` are then quantized dynamically."""
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    model = onnx.load(str(fp32_path), load_external_data=True)
    tensors = TensorsData(
        CalibrationMethod.MinMax,
        {name: TensorData(lowest=np.array(r.min, dtype=np.float32), highest=np.array(r.max, dtype=np.float32)) for name, r in ranges.items()},
    )
    activation = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}[plan.activation_type]
    skip = set(plan.excluded) | set(plan.dynamic_nodes)
    quantizer = QDQQuantizer(
        model,
        plan.per_channel,
        False,  # reduce_range: not needed with VNNI/ARM dot-product kernels
        QuantType.QInt8,
        activation,
        tensors,
        [],  # nodes_to_quantize: empty = all of op_types
        sorted(skip),
        list(plan.op_types),
        {
            "ActivationSymmetric": plan.activation_symmetric,
            "WeightSymmetric": True,
            "DedicatedQDQPair": False,
            "QDQKeepRemovableActivations": False,
        },
    )
    try:
        quantizer.quantize_model()
    except Exception as exc:
        raise QuantizationError(f"static QDQ quantization of {fp32_path} failed: {exc}", hint="exclude the node named above (quantization.exclude_nodes)") from exc
    staged = _save(quantizer.model.model, out_path.with_name(out_path.stem + ".static.onnx"))
    if plan.dynamic_nodes:
        write_dynamic(staged, out_path, plan, nodes=list(plan.dynamic_nodes))
        staged.unlink()
    else:
        staged.replace(out_path)
    return out_path


def write_dynamic(fp32_path: Path, out_path: Path, plan: QuantizationPlan, nodes: list[str] | None = None) -> Path:
    """Dynamic int8: int8 weights (per channel), activations quantized per call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        quantize_dynamic(
            str(fp32_path),
            str(out_path),
            op_types_to_quantize=list(plan.op_types),
            per_channel=plan.per_channel,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes or [],
            nodes_to_exclude=sorted(plan.excluded),
            extra_options={"MatMulConstBOnly": True},
        )
    except Exception as exc:
        raise QuantizationError(f"dynamic int8 quantization of {fp32_path} failed: {exc}") from exc
    return out_path


def write_int4(fp32_path: Path, out_path: Path, plan: QuantizationPlan) -> Path:
    """Weight-only int4, block-wise along the reduction axis. ONNX Runtime gets ``MatMulNBits`` (and
    ``GatherBlockQuantized`` for embeddings when asked); TensorRT gets blocked int4 DequantizeLinear."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    from onnxruntime.quantization.quant_utils import QuantFormat

    settings = plan.int4
    op_types = ("MatMul", "Gather") if settings.get("include_embeddings") else ("MatMul",)
    quant_format = QuantFormat.QDQ if plan.backend is Backend.TENSORRT else QuantFormat.QOperator
    if settings.get("method") == "hqq":
        config: Any = nbits.HQQWeightOnlyQuantConfig(block_size=settings["block_size"], bits=4, op_types_to_quantize=op_types,
                                                     quant_format=quant_format)
    else:
        config = nbits.DefaultWeightOnlyQuantConfig(block_size=settings["block_size"], is_symmetric=settings.get("symmetric", True),
                                                    accuracy_level=4 if plan.backend is Backend.ONNXRUNTIME else None,
                                                    quant_format=quant_format, op_types_to_quantize=op_types,
                                                    quant_axes=(("MatMul", 0), ("Gather", 1)))
    model = onnx.load(str(fp32_path), load_external_data=True)
    quantizer = nbits.MatMulNBitsQuantizer(model, nodes_to_exclude=sorted(plan.excluded), algo_config=config)
    try:
        quantizer.process()
    except Exception as exc:
        raise QuantizationError(f"int4 weight-only quantization of {fp32_path} failed: {exc}") from exc
    return _save(quantizer.model.model, out_path)


def temp_path(suffix: str = ".onnx") -> Path:
    return Path(tempfile.mkdtemp(prefix="edgekit-quant-")) / f"model{suffix}"
