"""Graph writers for the floating-point formats of Hopper and Blackwell GPUs: FP8, MXFP8, MXFP4, NVFP4.

Weights are standard ONNX, encoded by edgekit's exact codec (:mod:`edgekit.quantize.codecs`):

- ``fp8``: weights as FLOAT8E4M3FN with one FP32 scale per output channel (``amax / 448``), and a per-tensor
  E4M3 QuantizeLinear/DequantizeLinear pair (calibrated ``amax / 448``) on the activation entering every
  quantized MatMul/Gemm/Conv: TensorRT's explicit FP8 quantization pattern. Opset 19.
- ``mxfp8`` / ``mxfp4``: weights as E4M3 / E2M1 elements with one E8M0 scale per 32 along the reduction axis:
  ``DequantizeLinear(block_size=32)`` with a FLOAT8E8M0 scale tensor. Opset 24.
- ``nvfp4``: E2M1 weights with one E4M3 scale per 16 and an FP32 tensor scale, as two DequantizeLinear nodes:
  ``scale = DQ(e4m3 scales, tensor scale)``, ``weight = DQ(e2m1, scale, block_size=16)``. Opset 23.

The activations of ``mxfp8`` and ``nvfp4`` are block-quantized at run time by TensorRT's DynamicQuantize, which
standard ONNX cannot express: the graph carries TensorRT's own ``trt``-domain ops for it
(:mod:`edgekit.quantize.block_activations`); ``mxfp4`` is weight-only. Block-quantized weights need the reduction
axis to be one of the last two and a multiple of the block; other weights stay float and the plan says why.

ONNX Runtime's CPU provider has no FLOAT4E2M1 DequantizeLinear and no ``trt`` ops, so the host measures accuracy
on a *twin* (:func:`fold_weight_dequantize`): the written graph with every weight DequantizeLinear decoded by the
codec into an FP32 initializer, bit-identical to what the device dequantizes, and the run-time activation
quantizers emulated in standard ops, bit-identical to the codec.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.onnx_save import EXTERNAL_DATA_BYTES, EXTERNAL_TENSOR_MIN_BYTES, save_onnx
from edgekit.precision import Precision
from edgekit.quantize import block_activations
from edgekit.quantize.codecs import (
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    encode_e4m3,
    mx_quantize,
    nvfp4_quantize,
    pack_fp4,
    unpack_fp4,
)
from edgekit.quantize.codecs.blocks import from_blocks
from edgekit.quantize.codecs.minifloat import describe_positions
from edgekit.quantize.plan import QuantizationPlan

log = logging.getLogger(__name__)

FP8_MAX = 448.0
#: precision -> (the opset its DequantizeLinear form needs, block size or 0 for per-channel)
FORMAT_OPSET = {Precision.FP8: (19, 0), Precision.MXFP8: (24, 32), Precision.MXFP4: (24, 32), Precision.NVFP4: (23, 16)}
WRITTEN = tuple(FORMAT_OPSET)
#: What the host measures these formats on, for the manifest.
HOST_TWIN = ("a twin of model.onnx whose weight DequantizeLinear nodes edgekit's codec decoded to FP32 (bit-identical "
             "weights) and whose TensorRT run-time activation quantizers (mxfp8, nvfp4) are emulated in standard ONNX ops "
             "(bit-identical to the codec), run by ONNX Runtime's CPU provider at basic optimisation: it cannot load FP4 or "
             "E8M0 DequantizeLinear or TensorRT's ops, and drops FP8 Q/DQ pairs at its default level")
#: The block formats quantize MatMul/Gemm weights only (TensorRT blocks along one of the last two axes).
BLOCK_OP_TYPES = ("MatMul", "Gemm")


@dataclass
class FloatFormatResult:
    """What :func:`write_float_format` did, for the manifest."""

    precision: Precision
    opset: int
    weights: dict[str, str] = field(default_factory=dict)  # initializer -> its format
    activations: dict[str, float | None] = field(default_factory=dict)  # tensor -> its FP32 scale (None: computed at run time)
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why its weight stayed float
    float_activations: dict[str, str] = field(default_factory=dict)  # node -> why its quantized weight meets a float activation
    weight_bytes: int = 0  # encoded bytes of the quantized weights (elements + scales)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "format": self.precision.value,
            "opset": self.opset,
            "quantized_weights": len(self.weights),
            "quantized_activations": len(self.activations),
            "encoded_weight_bytes": self.weight_bytes,
            "float_weights": dict(sorted(self.skipped.items())),
            "activations": self.activation_description(),
            "float_activations": dict(sorted(self.float_activations.items())),
        }

    def activation_description(self) -> str:
        if self.precision is Precision.FP8:
            return "fp8 e4m3 per-tensor (calibrated)"
        if self.precision in block_activations.ACTIVATION_FORMATS:
            return (block_activations.ACTIVATION_FORMATS[self.precision].description
                    + " (TensorRT DynamicQuantize: trt-domain ops in model.onnx)")
        return "float (weight-only): " + block_activations.WEIGHT_ONLY_WHY.get(self.precision, "")


# ------------------------------------------------------------------------------------------- encoding


def _tensor(name: str, onnx_type: int, shape: tuple[int, ...], raw: bytes) -> Any:
    from onnx import helper

    return helper.make_tensor(name, onnx_type, list(shape), vals=raw, raw=True)


def _float(name: str, values: np.ndarray) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ascontiguousarray(values, dtype=np.float32), name)


def _scales_in_place(scales: np.ndarray, axis: int) -> np.ndarray:
    """Block scales ``(*rest, n_blocks)`` in DequantizeLinear's layout: the tensor's shape with ``n_blocks`` on ``axis``."""
    return np.ascontiguousarray(np.moveaxis(scales, -1, axis))


def encode_weight(name: str, weight: np.ndarray, precision: Precision, axis: int, out_axis: int) -> tuple[list[Any], list[Any], int]:
    """(initializers, DequantizeLinear nodes producing ``name + '_dq'``, encoded bytes) for one weight.

    ``axis`` is the reduction axis (blocks run along it); ``out_axis`` the output-channel axis (FP8 scales)."""
    from onnx import TensorProto, helper

    out = name + "_dq"
    shape = tuple(int(d) for d in weight.shape)
    non_finite = ~np.isfinite(weight)
    if non_finite.any():  # one NaN/inf would make its channel's (or block's) scale NaN/inf: every value in it lost
        raise QuantizationError(
            f"{precision.value}: weight '{name}' holds {float(weight[non_finite].flat[0])!r} {describe_positions(non_finite)}; "
            f"its {'output channel' if precision is Precision.FP8 else 'block'} scale would be non-finite and every value sharing it lost",
            hint="find where the NaN/inf comes from (a diverged checkpoint, an overflow in an exported constant) and fix it before "
            "quantizing, or keep the node float with quantization.exclude_nodes",
        )
    if precision is Precision.FP8:
        reduce_axes = tuple(a for a in range(weight.ndim) if a != out_axis)
        amax = np.abs(weight).max(axis=reduce_axes).astype(np.float32)
        scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
        codes = encode_e4m3(weight / np.expand_dims(scale, reduce_axes), tensor_name=name)
        inits = [_tensor(name + "_e4m3", TensorProto.FLOAT8E4M3FN, shape, codes.tobytes()), _float(name + "_scale", scale)]
        node = helper.make_node("DequantizeLinear", [name + "_e4m3", name + "_scale"], [out], name=name + "_DequantizeLinear", axis=out_axis)
        return inits, [node], codes.size + scale.size * 4
    block = FORMAT_OPSET[precision][1]
    if precision in (Precision.MXFP8, Precision.MXFP4):
        elem = "e4m3" if precision is Precision.MXFP8 else "e2m1"
        encoded = mx_quantize(weight, elem=elem, block=block, axis=axis, tensor_name=name)
        codes = from_blocks(encoded.codes, shape, axis)
        scales = _scales_in_place(encoded.scales_e8m0, axis)
        if elem == "e4m3":
            weight_init = _tensor(name + "_e4m3", TensorProto.FLOAT8E4M3FN, shape, codes.tobytes())
        else:
            weight_init = _tensor(name + "_e2m1", TensorProto.FLOAT4E2M1, shape, pack_fp4(codes).tobytes())
        scale_init = _tensor(name + "_e8m0", TensorProto.FLOAT8E8M0, scales.shape, scales.tobytes())
        # An E8M0 scale cannot be the output type (the default): output_dtype says FP32.
        node = helper.make_node("DequantizeLinear", [weight_init.name, scale_init.name], [out], name=name + "_DequantizeLinear",
                                axis=axis, block_size=block, output_dtype=TensorProto.FLOAT)
        return [weight_init, scale_init], [node], encoded.nbytes
    encoded4 = nvfp4_quantize(weight, block=block, axis=axis, tensor_name=name)
    codes = from_blocks(encoded4.codes, shape, axis)
    scales = _scales_in_place(encoded4.block_scales_e4m3, axis)
    inits = [
        _tensor(name + "_e2m1", TensorProto.FLOAT4E2M1, shape, pack_fp4(codes).tobytes()),
        _tensor(name + "_e4m3_scale", TensorProto.FLOAT8E4M3FN, scales.shape, scales.tobytes()),
        _float(name + "_tensor_scale", np.array(encoded4.tensor_scale, dtype=np.float32)),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", [name + "_e4m3_scale", name + "_tensor_scale"], [name + "_block_scale"],
                         name=name + "_scale_DequantizeLinear"),
        helper.make_node("DequantizeLinear", [name + "_e2m1", name + "_block_scale"], [out], name=name + "_DequantizeLinear",
                         axis=axis, block_size=block),
    ]
    return inits, nodes, encoded4.nbytes


# --------------------------------------------------------------------------------------------- writer


def _weight_axes(node: Any, weight: np.ndarray) -> tuple[int, int] | str:
    """(reduction axis, output-channel axis) of a node's weight, or why it cannot be quantized."""
    attrs = {a.name: a.i for a in node.attribute if a.type == a.INT}
    if node.op_type == "Conv":
        return 1, 0
    if node.op_type == "Gemm":
        if attrs.get("transA", 0):
            return "Gemm with transA=1"
        return (1, 0) if attrs.get("transB", 0) else (0, 1)
    if weight.ndim < 2:
        return "a 1-D MatMul operand"
    return weight.ndim - 2, weight.ndim - 1


def _convert_opset(model: Any, opset: int, path: Path) -> Any:
    import onnx

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if current >= opset:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, opset)
    except Exception as exc:
        raise QuantizationError(
            f"{path}: converting the graph from opset {current} to {opset} (needed by this format's DequantizeLinear) failed: {exc}",
            hint=f"for a PyTorch model, export at opset {opset} (recipe export.opset) so no conversion is needed; an ONNX file must "
            f"already be opset {opset}: upgrade it with the tool that produced it",
        ) from exc
    if converted.ir_version < 10:
        converted.ir_version = 10 if opset < 23 else 11
    return converted


def write_float_format(fp32_path: Path, out_path: Path, plan: QuantizationPlan, activation_amax: Mapping[str, float] | None = None) -> FloatFormatResult:
    """Write ``out_path``: ``fp32_path`` with ``plan.precision`` weights (and FP8 activations) as standard ONNX."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    precision = plan.precision
    if precision not in FORMAT_OPSET:
        raise QuantizationError(f"{precision.value} is not a floating-point format this writer knows", hint=f"formats: {', '.join(p.value for p in WRITTEN)}")
    activation_format = block_activations.ACTIVATION_FORMATS.get(precision)
    needs_amax = precision is Precision.FP8 or (activation_format is not None and activation_format.needs_tensor_scale)
    if needs_amax and not activation_amax:
        raise QuantizationError(f"{precision.value} needs calibrated activation ranges", hint="add data.calibration to the recipe (a callable or an npz_dir)")
    opset, block = FORMAT_OPSET[precision]
    model = _convert_opset(onnx.load(str(fp32_path), load_external_data=True), opset, fp32_path)
    ranks = _activation_ranks(model, fp32_path) if activation_format is not None else {}
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    block_only = "TensorRT block-quantizes along one of the last two axes; a Conv weight's reduction axis (input channels) is not"
    result = FloatFormatResult(precision, max(opset, next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))))
    dequantized: dict[str, str] = {}  # weight initializer -> its DequantizeLinear output
    activation_dq: dict[str, str] = {}  # activation tensor -> its Q/DQ output
    new_nodes: list[Any] = []
    for node in graph.node:
        if node.op_type not in plan.op_types or node.name in plan.excluded:
            new_nodes.append(node)
            continue
        if block and node.op_type not in BLOCK_OP_TYPES:
            result.skipped[node.name] = block_only
            new_nodes.append(node)
            continue
        weight_name = node.input[1] if len(node.input) > 1 else ""
        if weight_name not in initializers:
            result.skipped[node.name] = "its weight is not a constant initializer"
            new_nodes.append(node)
            continue
        if weight_name not in dequantized:
            weight = numpy_helper.to_array(initializers[weight_name]).astype(np.float32)
            axes = _weight_axes(node, weight)
            if isinstance(axes, str):
                result.skipped[node.name] = axes
                new_nodes.append(node)
                continue
            axis, out_axis = axes
            if block and (axis < weight.ndim - 2 or weight.shape[axis] % block):
                result.skipped[node.name] = f"reduction axis of length {weight.shape[axis]} is not a multiple of the {block}-element block"
                new_nodes.append(node)
                continue
            inits, dq_nodes, nbytes = encode_weight(weight_name, weight, precision, axis, out_axis)
            graph.initializer.extend(inits)
            new_nodes.extend(dq_nodes)
            dequantized[weight_name] = dq_nodes[-1].output[0]
            result.weights[weight_name] = precision.value
            result.weight_bytes += nbytes
        node.input[1] = dequantized[weight_name]
        source = node.input[0]
        if precision is Precision.FP8 and activation_amax is not None and source in activation_amax:
            if source not in activation_dq:
                scale = max(float(activation_amax[source]), 1e-12) / FP8_MAX
                prefix = f"{source}_fp8"
                graph.initializer.extend([
                    numpy_helper.from_array(np.array(scale, dtype=np.float32), prefix + "_scale"),
                    helper.make_tensor(prefix + "_zero", TensorProto.FLOAT8E4M3FN, [], vals=b"\x00", raw=True),
                ])
                new_nodes.append(helper.make_node("QuantizeLinear", [source, prefix + "_scale", prefix + "_zero"], [prefix + "_q"],
                                                  name=prefix + "_QuantizeLinear"))
                new_nodes.append(helper.make_node("DequantizeLinear", [prefix + "_q", prefix + "_scale", prefix + "_zero"], [prefix + "_dq"],
                                                  name=prefix + "_DequantizeLinear"))
                activation_dq[source] = prefix + "_dq"
                result.activations[source] = scale
            node.input[0] = activation_dq[source]
        if activation_format is not None:
            why = _why_float_activation(source, ranks, activation_amax if activation_format.needs_tensor_scale else None)
            if why:
                result.float_activations[node.name] = why
            else:
                if source not in activation_dq:
                    scale = (block_activations.nvfp4_tensor_scale(activation_amax[source])  # type: ignore[index]  # checked above
                             if activation_format.needs_tensor_scale else None)
                    inits, quantizer, output = block_activations.quantizer_nodes(source, precision, scale)
                    graph.initializer.extend(inits)
                    new_nodes.extend(quantizer)
                    activation_dq[source] = output
                    result.activations[source] = scale
                node.input[0] = activation_dq[source]
        new_nodes.append(node)
    if not result.weights:
        raise QuantizationError(
            f"{precision.value} found no weight it can quantize in {fp32_path.name}"
            + (f" ({'; '.join(f'{k}: {v}' for k, v in list(result.skipped.items())[:3])})" if result.skipped else ""),
            hint="the block formats quantize MatMul/Gemm weights whose reduction axis is a multiple of the block; "
            "use fp8 or int8 for convolutional models",
        )
    del graph.node[:]
    graph.node.extend(new_nodes)
    used = {i for n in graph.node for i in n.input}
    for init in [i for name, i in initializers.items() if name in result.weights and name not in used]:
        graph.initializer.remove(init)
        for overridable in [i for i in graph.input if i.name == init.name]:  # an initializer that was an input too
            graph.input.remove(overridable)  # (ONNX's overridable default) goes with it, as in the int8 writers
    if activation_dq and activation_format is not None:
        model.opset_import.append(helper.make_opsetid(block_activations.TRT_DOMAIN, 1))
    _save_and_check(model, out_path, full_check=activation_format is None or not activation_dq)
    return result


def _save_and_check(model: Any, out_path: Path, full_check: bool) -> None:
    """Save ``model`` (its tensors as external data when it is over :data:`EXTERNAL_DATA_BYTES`), then check the saved
    file by its path: the checker cannot take a message over 2 GiB in memory."""
    import onnx

    save_onnx(model, out_path, external=model.ByteSize() > EXTERNAL_DATA_BYTES)
    onnx.checker.check_model(str(out_path), full_check=full_check)


def _activation_ranks(model: Any, source: Path) -> dict[str, int]:
    """Rank of every tensor shape inference can tell. A model over :data:`EXTERNAL_DATA_BYTES` is inferred on its file's
    graph without the weights' data (``source``, loaded as stored): the in-memory inference cannot take it whole."""
    import onnx

    if model.ByteSize() > EXTERNAL_DATA_BYTES:
        model = onnx.load(str(source), load_external_data=False)
    inferred = onnx.shape_inference.infer_shapes(model)
    return {info.name: len(info.type.tensor_type.shape.dim) for info in [*inferred.graph.value_info, *inferred.graph.input]
            if info.type.tensor_type.HasField("shape")}


def _why_float_activation(source: str, ranks: Mapping[str, int], amax: Mapping[str, float] | None) -> str | None:
    """Why the activation ``source`` cannot take TensorRT's run-time block quantizer, or None."""
    rank = ranks.get(source)
    if rank not in (2, 3):
        return f"TensorRT's DynamicQuantize takes 2-D or 3-D tensors; activation {source} is {'of unknown rank' if rank is None else f'{rank}-D'}"
    if amax is not None and source not in amax:
        return f"activation {source} has no calibrated range for its tensor scale"
    return None


# ------------------------------------------------------------------------------------------ host twin


def _decode_initializer(tensor: Any) -> np.ndarray:
    """float32 values of an initializer in any type the writers emit, decoded by the codec (not by onnx)."""
    from onnx import TensorProto, numpy_helper

    shape = tuple(tensor.dims)
    count = int(np.prod(shape)) if shape else 1
    raw = np.frombuffer(tensor.raw_data, dtype=np.uint8) if tensor.raw_data else None
    if tensor.data_type == TensorProto.FLOAT4E2M1 and raw is not None:
        return decode_e2m1(unpack_fp4(raw, count)).reshape(shape)
    if tensor.data_type == TensorProto.FLOAT8E4M3FN and raw is not None:
        return decode_e4m3(raw[:count]).reshape(shape)
    if tensor.data_type == TensorProto.FLOAT8E8M0 and raw is not None:
        return decode_e8m0(raw[:count]).reshape(shape)
    return numpy_helper.to_array(tensor).astype(np.float32)


def _dequantize(values: np.ndarray, scale: np.ndarray, axis: int, block: int) -> np.ndarray:
    if scale.ndim == 0 or scale.size == 1:
        return (values * scale.reshape(())).astype(np.float32)
    if block:
        expanded = np.repeat(scale, block, axis=axis)
        expanded = np.take(expanded, np.arange(values.shape[axis]), axis=axis)
        return (values * expanded).astype(np.float32)
    shape = [1] * values.ndim
    shape[axis] = -1
    return (values * scale.reshape(shape)).astype(np.float32)


def fold_weight_dequantize(model_path: Path, out_path: Path) -> Path:
    """Write ``out_path``: the graph with every constant DequantizeLinear (weights, their scales) replaced by
    its FP32 result, decoded by edgekit's codec. Activation Q/DQ pairs stay: run the twin at ONNX Runtime's
    ``basic`` optimisation level, where FP8 Q/DQ keeps its saturating rounding (``all`` drops the pair).

    Weights are read and decoded one at a time. A twin over :data:`EXTERNAL_DATA_BYTES` (its FP32 weights are up to
    8x the written model's) keeps its tensors in ``<out_path>.data``, each written there as it is decoded: the graph
    proto never holds them, so no message reaches protobuf's 2 GiB limit."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_path), load_external_data=False)
    emulated = block_activations.emulate_activation_quantizers(model)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}  # folded DequantizeLinear output -> its shape

    def constant(name: str) -> bool:
        return name in shapes or name in initializers

    def zero_point(node: Any) -> bool:  # absent or all zero: the DequantizeLinear is a plain scale
        if len(node.input) < 3 or not node.input[2]:
            return True
        if node.input[2] not in initializers:
            return False
        return not np.any(_decode_initializer(_in_memory(initializers[node.input[2]], model_path.parent)))

    kept, folds = [], []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and constant(node.input[0]) and constant(node.input[1]) and zero_point(node):
            values = node.input[0]
            shapes[node.output[0]] = shapes[values] if values in shapes else tuple(int(d) for d in initializers[values].dims)
            folds.append(node)
        else:
            kept.append(node)
    used = {i for n in kept for i in n.input} | {o.name for o in graph.output}
    read_by_folds = {i for n in folds for i in n.input}
    twin_bytes = sum(4 * int(np.prod(shape)) for name, shape in shapes.items() if name in used)
    twin_bytes += sum(_tensor_bytes(init) for name, init in initializers.items() if name in used)
    writer = _TwinTensors(out_path, external=twin_bytes > EXTERNAL_DATA_BYTES)
    try:
        for name, init in initializers.items():  # biases, float weights, activation scales: their data read in or moved
            if name in used:
                writer.keep(init, model_path.parent)
        constants: dict[str, np.ndarray] = {}  # folded outputs a later DequantizeLinear reads (nvfp4's block scales)

        def value(name: str) -> np.ndarray:
            if name in constants:
                return constants[name]
            return _decode_initializer(_in_memory(initializers[name], model_path.parent))

        for node in folds:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            values = value(node.input[0])
            axis = int(attrs.get("axis", 1)) % max(values.ndim, 1)
            folded = _dequantize(values, value(node.input[1]), axis, int(attrs.get("block_size", 0)))
            del values
            if node.output[0] in read_by_folds:
                constants[node.output[0]] = folded
            if node.output[0] in used:
                graph.initializer.append(writer.folded(node.output[0], folded))
            del folded
    finally:
        writer.close()
    for init in [init for name, init in initializers.items() if name not in used]:
        graph.initializer.remove(init)
    del graph.node[:]
    graph.node.extend(kept)
    if not writer.external:
        writer.data_path.unlink(missing_ok=True)
    onnx.save(model, str(out_path))  # the external tensors' data is in place already: this writes the graph alone
    onnx.checker.check_model(str(out_path))
    log.info("host twin %s: %d DequantizeLinear nodes decoded, %d activation quantizers emulated%s", out_path.name, len(folds), emulated,
             f"; {twin_bytes / 1e9:.2f} GB of tensors in {writer.data_path.name}" if writer.external else "")
    return out_path


def _in_memory(tensor: Any, base_dir: Path) -> Any:
    """``tensor``, or a copy of it with its external data read in (the model's own copy stays without it)."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if not uses_external_data(tensor):
        return tensor
    loaded = TensorProto()
    loaded.CopyFrom(tensor)
    load_external_data_for_tensor(loaded, str(base_dir))
    return loaded


def _tensor_bytes(tensor: Any) -> int:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    return int(entries.get("length", 0)) if "location" in entries else tensor.ByteSize()


class _TwinTensors:
    """The host twin's initializers: inline, or (``external``) each written to ``<out_path>.data`` as it comes."""

    def __init__(self, out_path: Path, external: bool) -> None:
        self.external = external
        self.data_path = out_path.with_name(out_path.name + ".data")
        self._file = open(self.data_path, "wb") if external else None  # noqa: SIM115  # closed by close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _store(self, tensor: Any, raw: bytes) -> None:
        """``raw`` as ``tensor``'s data: inline, or appended to the data file with the tensor pointing at it."""
        from onnx import TensorProto

        del tensor.external_data[:]
        if self._file is None or len(raw) < EXTERNAL_TENSOR_MIN_BYTES:
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = raw
            return
        tensor.ClearField("raw_data")
        offset = self._file.tell()
        self._file.write(raw)
        tensor.data_location = TensorProto.EXTERNAL
        for key, entry in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(len(raw)))):
            item = tensor.external_data.add()
            item.key, item.value = key, entry

    def folded(self, name: str, array: np.ndarray) -> Any:
        from onnx import TensorProto

        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape))
        self._store(tensor, np.ascontiguousarray(array, dtype="<f4").tobytes())
        return tensor

    def keep(self, init: Any, base_dir: Path) -> None:
        """An initializer the twin keeps as it is, in place: its external data (the written model's file) read in, or
        moved to the twin's own data file."""
        from onnx.external_data_helper import uses_external_data

        if uses_external_data(init):
            self._store(init, _in_memory(init, base_dir).raw_data)
        elif self._file is not None and init.HasField("raw_data") and len(init.raw_data) >= EXTERNAL_TENSOR_MIN_BYTES:
            self._store(init, init.raw_data)
