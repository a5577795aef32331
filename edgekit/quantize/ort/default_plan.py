"""ONNX Runtime's default static int8 plan (``quantize_static``: QDQ, per-channel int8 weights, uint8
activations, MinMax), auto's ``int8-ort-default`` candidate: written by ONNX Runtime with its own calibration pass
(:func:`write_ort_default_static`), or from ranges edgekit already collected, instead of that pass over the batches.

:func:`minmax_tensors` names the tensors ONNX Runtime's MinMax calibrator would observe on a model; auto
collects their plain min/max in the same pass as its own calibration (``calibrate(also_minmax=...)``), and
:func:`write_with_ranges` hands them to ``quantize_static`` as its calibration cache, so the quantizer,
its pre-steps and its defaults are ONNX Runtime's own and only the pass over the data is saved.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.calibration import TensorRange
from edgekit.quantize.ort.sessions import ort_session
from edgekit.quantize.plan import QuantizationPlan


def quantize_static_op_types() -> list[str]:
    """The op types ``quantize_static`` quantizes and calibrates when given none (its QLinear and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def minmax_tensors(model_path: Path) -> list[str]:
    """The float tensors ONNX Runtime's MinMax calibrator observes in ``quantize_static`` with its defaults:
    every float/float16 input and output (not an initializer) of a node whose op type it quantizes, whose
    type ONNX shape inference knows. Sorted, for a stable cache key."""
    import onnx
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(model_path))
    typed = {value.name: value for value in (*model.graph.value_info, *model.graph.output, *model.graph.input)}
    initializers = {tensor.name for tensor in model.graph.initializer}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    ops = set(quantize_static_op_types())
    names = set()
    for node in model.graph.node:
        if node.op_type not in ops:
            continue
        for name in (*node.input, *node.output):
            value = typed.get(name)
            if value is not None and value.type.HasField("tensor_type") and value.type.tensor_type.elem_type in floats and name not in initializers:
                names.add(name)
    return sorted(names)


def write_with_ranges(model_path: Path, out_path: Path, ranges: Mapping[str, TensorRange]) -> Path:
    """``quantize_static`` with its defaults on ``model_path``, its MinMax calibration replaced by ``ranges``
    (every tensor of :func:`minmax_tensors`, plain min/max), passed as ONNX Runtime's calibration cache."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    missing = sorted(set(minmax_tensors(model_path)) - set(ranges))
    if missing:
        raise QuantizationError(f"int8-ort-default: no MinMax range for {len(missing)} tensor(s) of {model_path}: {', '.join(missing[:5])}",
                                hint="collect them with calibrate(also_minmax=minmax_tensors(model)) on this same model file")
    data = TensorsData(CalibrationMethod.MinMax, {name: TensorData(lowest=np.array(r.min, dtype=np.float32), highest=np.array(r.max, dtype=np.float32))
                                                  for name, r in ranges.items()})
    with tempfile.TemporaryDirectory(prefix="edgekit-ort-ranges-", dir=Path(out_path).parent) as tmp:
        cache = Path(tmp) / "ranges.json"
        save_tensors_data(data, cache)
        try:
            quantize_static(str(model_path), str(out_path), None, quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                            calibration_cache_path=str(cache))
        except Exception as exc:
            raise _quantize_static_error(exc, model_path) from exc
    return Path(out_path)


def write_ort_default_static(model_path: Path, out_path: Path, batches: Sequence[Mapping[str, np.ndarray]]) -> Path:
    """ONNX Runtime's ``quantize_static`` with its defaults (QDQ, per-channel int8 weights, uint8
    activations, MinMax over ``batches``, every op type its QDQ registry quantizes): the plain recipe a
    user would run, as an ``auto`` candidate."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    names = {i.name for i in ort_session(model_path).get_inputs()}
    feeds = [{k: np.asarray(v) for k, v in batch.items() if k in names} for batch in batches]
    if not feeds:
        raise QuantizationError("int8-ort-default needs calibration batches", hint="add data.calibration to the recipe")

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    try:
        quantize_static(str(model_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    except Exception as exc:
        raise _quantize_static_error(exc, model_path) from exc
    return out_path


def _quantize_static_error(exc: Exception, model_path: Path) -> QuantizationError:
    """ONNX Runtime's own ``quantize_static`` failed: the error names the node it was writing where the traceback says."""
    import onnx

    from edgekit.quantize.ort.static_qdq import failing_node

    node = failing_node(exc, {n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node})
    at = f" at node '{node}'" if node else ""
    return QuantizationError(f"ONNX Runtime's quantize_static failed on {model_path}{at}: {type(exc).__name__}: {exc}",
                             hint="the edgekit int8 and FP32 candidates cover this model (they keep such a node float)")


def ort_default_plan(plan: QuantizationPlan) -> QuantizationPlan:
    """What :func:`write_ort_default_static` writes, as a plan for the manifest."""
    from onnxruntime.quantization.registry import QDQRegistry

    return replace(plan, activation_type="uint8", activation_symmetric=False, weight_type="int8", per_channel=True, calibrator="minmax",
                   op_types=tuple(sorted(QDQRegistry)), excluded={}, dynamic_nodes=(), float_outputs=(), float_consumers_skip_qdq=False,
                   channels_last_flatten=False, channels_last_stem=False, reduce_range=False,
                   notes=("written by onnxruntime.quantization.quantize_static with its defaults: QDQ, per-channel int8 weights, "
                          "uint8 activations, MinMax calibration, every op type in its QDQ registry",))
