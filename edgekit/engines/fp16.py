"""FP16 conversion of an FP32 ONNX graph, with the numerically sensitive parts handled first.

Casting every float tensor to FP16 is wrong wherever a constant lies outside FP16's range: FP16's largest
finite value is 65504, and ONNX Runtime's converter clamps larger constants to it. PP-OCRv4's DBNet head
stores a BatchNormalization running variance of 1e7..1e8 (its convolution before it outputs values in the
thousands); clamped to 65504 the normalisation is off by up to 40x and the text map's IoU falls to 0.28.
Keeping the BatchNormalization in FP32 does not help, because its parameters are ``Constant`` nodes that
the converter still casts (and clamps) before casting back.

So, before converting:

1. every BatchNormalization that follows a Conv or ConvTranspose (optionally through a per-channel bias
   ``Add``) is folded into that convolution's weights and bias, in float64, written as FP32: exact in
   real arithmetic, and the folded weights are the scale the network really computes at;
2. every node that reads a float constant FP16 cannot hold (a magnitude above 65504, or a tensor whose
   non-zero values would mostly flush to zero, like a normalisation's 1e-9 floor) stays FP32, with that
   constant as an FP32 initializer. Sentinels (``finfo(float32).min`` in an attention mask) are not data:
   the converter clamps them to +-65504, which still masks.

:func:`convert_fp16_report` returns the converted model and a :class:`Fp16Conversion` whose manifest form
names what was folded and which nodes stay FP32, and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: FP16's largest finite magnitude and smallest positive subnormal.
FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 5.96e-08
#: A constant whose non-zero values flush to zero in FP16 for more than this fraction is kept FP32.
UNDERFLOW_FRACTION = 0.5
#: Magnitudes from here up are sentinels (an attention mask's ``finfo(float32).min``), not data: clamped to
#: +-65504 they still mask, while an FP32 node would hand -3.4e38 on to FP16 nodes as -inf (NaN after a softmax
#: of a fully masked row). Such constants are left to the converter's clamp.
SENTINEL_MAGNITUDE = 1e30

#: Why an fp16 bundle for a CPU provider is not a speed-up, by CPU architecture: recorded in the manifest and
#: logged at build time (corpus, AVX2 host, 2 threads, interleaved: CNNs 1.01-1.24x the FP32 latency, YOLOS 0.84x).
CPU_FP16_NOTES = {
    "x86_64": "ONNX Runtime's CPU provider on x86-64 has FP16 kernels for few operators; it runs the rest in FP32 "
              "behind Casts it inserts at load time, so this fp16 bundle is about half the size of FP32 but usually "
              "no faster, often slower than FP32: build fp32 or int8 for speed",
    "arm64": "ONNX Runtime's CPU provider runs FP16 natively only for some operators, and only on Arm64 cores with "
             "FP16 arithmetic (ARMv8.2-A and later); the rest run in FP32 behind inserted Casts: compare against fp32 "
             "on the device before choosing fp16 for speed",
}


@dataclass
class Fp16Conversion:
    """What :func:`convert_fp16_report` did besides casting: for the manifest and the build log."""

    folded_batch_norms: list[str] = field(default_factory=list)
    kept_fp32: dict[str, str] = field(default_factory=dict)  # node name -> why it stays FP32
    #: Float weights (initializers and Constant nodes with more than one element) by element type after conversion.
    fp16_weights: int = 0
    fp32_weights: int = 0

    def to_manifest(self) -> dict[str, Any]:
        return {
            "folded_batch_norms": len(self.folded_batch_norms),
            "kept_fp32": dict(self.kept_fp32),
            "fp16_weights": self.fp16_weights,
            "fp32_weights": self.fp32_weights,
        }


def _constants(graph: Any) -> dict[str, np.ndarray]:
    """Initializers and ``Constant`` node values of the top-level graph, by tensor name."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def tensor_consumers(graph: Any) -> dict[str, list[Any]]:
    """Tensor name -> the nodes of ``graph`` that read it (an input read twice by a node lists it twice)."""
    out: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _attribute(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _channel_vector(value: np.ndarray, channels: int, out_rank: int) -> np.ndarray | None:
    """``value`` as a per-channel vector when it broadcasts along axis 1 of an N,C,... tensor of ``out_rank``."""
    if value.size != channels or value.ndim > out_rank:
        return None
    padded = (1,) * (out_rank - value.ndim) + tuple(value.shape)
    if padded[1] != channels or any(d != 1 for i, d in enumerate(padded) if i != 1):
        return None
    return value.reshape(-1).astype(np.float64)


def _batch_norm_scale(bn: Any, constants: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel with BN(x) = scale * x + shift, or None when a parameter is not constant."""
    if len(bn.output) != 1 or len(bn.input) != 5 or _attribute(bn, "training_mode", 0):
        return None
    params = [constants.get(name) for name in bn.input[1:]]
    if any(p is None for p in params):
        return None
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
    scale = gamma / np.sqrt(var + float(_attribute(bn, "epsilon", 1e-5)))
    return scale, beta - mean * scale


def _fold_one(graph: Any, bn: Any, constants: dict[str, np.ndarray], consumers: dict[str, list[Any]],
              producers: dict[str, Any], outputs: set[str]) -> bool:
    """Fold ``bn`` into the convolution before it (through an optional per-channel bias Add); False if it cannot."""
    from onnx import numpy_helper

    folded = _batch_norm_scale(bn, constants)
    if folded is None:
        return False
    scale, shift = folded
    chain = []  # nodes between the convolution's output and the BN, each with one consumer
    current = producers.get(bn.input[0])
    bias_constant = None
    if current is not None and current.op_type == "Add":
        const_inputs = [name for name in current.input if name in constants]
        others = [name for name in current.input if name not in constants]
        if len(const_inputs) != 1 or len(others) != 1:
            return False
        bias_constant = constants[const_inputs[0]]
        chain.append(current)
        current = producers.get(others[0])
    if current is None or current.op_type not in ("Conv", "ConvTranspose") or len(current.input) < 2:
        return False
    for node in [current, *chain]:
        if len(consumers.get(node.output[0], [])) != 1 or node.output[0] in outputs:
            return False
    weight = constants.get(current.input[1])
    bias_name = current.input[2] if len(current.input) > 2 and current.input[2] else None
    bias = constants.get(bias_name) if bias_name else np.zeros(scale.size)
    if weight is None or bias is None or weight.dtype != np.float32:
        return False
    add_bias = np.zeros_like(scale)
    if bias_constant is not None:
        vector = _channel_vector(bias_constant, scale.size, weight.ndim)
        if vector is None:
            return False
        add_bias = vector
    weight = weight.astype(np.float64)
    group = int(_attribute(current, "group", 1))
    if current.op_type == "Conv":
        if weight.shape[0] != scale.size:
            return False
        new_weight = weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    else:  # ConvTranspose: weight is (C_in, C_out / group, k...); output channel g * (C_out/group) + j
        per_group = weight.shape[1]
        if per_group * group != scale.size:
            return False
        grouped = weight.reshape((group, weight.shape[0] // group, per_group) + weight.shape[2:])
        new_weight = (grouped * scale.reshape((group, 1, per_group) + (1,) * (weight.ndim - 2))).reshape(weight.shape)
    new_bias = (np.asarray(bias, dtype=np.float64).reshape(-1) + add_bias) * scale + shift
    stem = bn.name or bn.output[0]
    weight_name, new_bias_name = f"{stem}.folded_weight", f"{stem}.folded_bias"
    graph.initializer.extend([numpy_helper.from_array(new_weight.astype(np.float32), weight_name),
                              numpy_helper.from_array(new_bias.astype(np.float32), new_bias_name)])
    data_input = current.input[0]
    del current.input[:]
    current.input.extend([data_input, weight_name, new_bias_name])
    current.output[0] = bn.output[0]
    for node in [*chain, bn]:
        graph.node.remove(node)
    return True


def _drop_unused(graph: Any) -> None:
    """Remove initializers and Constant nodes nothing reads any more (the BN parameters, the old weights)."""
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for node in graph.node:  # names read inside subgraphs count as used
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                used |= {name for inner in sub.node for name in inner.input}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        graph.node.remove(node)


def fold_batch_norms(model: Any) -> list[str]:
    """Fold every BatchNormalization that follows a Conv/ConvTranspose into it, in place; the folded BN names."""
    graph = model.graph
    folded: list[str] = []
    changed = True
    while changed:  # one pass per fold keeps the lookup tables true to the graph
        changed = False
        constants, consumers = _constants(graph), tensor_consumers(graph)
        producers = {o: node for node in graph.node for o in node.output}
        outputs = {o.name for o in graph.output}
        for bn in [n for n in graph.node if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")]:
            if _fold_one(graph, bn, constants, consumers, producers, outputs):
                folded.append(bn.name or bn.output[0])
                changed = True
                break
    if folded:
        _drop_unused(graph)
    return folded


def _why_not_fp16(value: np.ndarray) -> str | None:
    if value.dtype != np.float32 or value.size == 0:
        return None
    magnitude = np.abs(value[np.isfinite(value)])
    data = magnitude[magnitude < SENTINEL_MAGNITUDE]
    if data.size and data.max() > FP16_MAX:
        return f"a constant up to {data.max():.3g}, beyond FP16's largest value {FP16_MAX:g}"
    nonzero = magnitude[magnitude > 0]
    if nonzero.size and (nonzero < FP16_MIN_SUBNORMAL).mean() > UNDERFLOW_FRACTION:
        return f"a constant whose non-zero values are mostly below FP16's smallest {FP16_MIN_SUBNORMAL:g} (they would flush to zero)"
    return None


def nodes_needing_fp32(model: Any) -> dict[str, str]:
    """Node name -> why it must stay FP32: it reads a float constant that FP16 cannot represent. Such
    constants made by ``Constant`` nodes become initializers (in place): ONNX Runtime's converter keeps an
    initializer FP32 for a blocked node, but casts a blocked Constant node's output to FP16 and back, which
    turns 9.79e7 into inf."""
    from onnx import numpy_helper

    graph = model.graph
    why_by_tensor = {name: why for name, value in _constants(graph).items() if (why := _why_not_fp16(value))}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] in why_by_tensor]:
        graph.initializer.append(numpy_helper.from_array(_constants_of(node), node.output[0]))
        graph.node.remove(node)
    kept: dict[str, str] = {}
    for node in graph.node:
        for name in node.input:
            if name in why_by_tensor:
                kept[node.name] = f"{node.op_type} reads {name}: {why_by_tensor[name]}"
    return kept


def _constants_of(node: Any) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value")


def _name_unnamed_nodes(model: Any) -> None:
    """The converter blocks nodes by name: give every unnamed node one."""
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}_fp16"


def convert_fp16_report(model: Any) -> tuple[Any, Fp16Conversion]:
    """``model`` with weights and compute in FP16 (inputs and outputs as declared), BatchNormalizations folded
    first and the nodes FP16 cannot represent kept FP32; and what was done."""
    from onnx import TensorProto
    from onnxruntime.transformers.float16 import convert_float_to_float16

    report = Fp16Conversion()
    _name_unnamed_nodes(model)
    report.folded_batch_norms = fold_batch_norms(model)
    report.kept_fp32 = nodes_needing_fp32(model)
    for node, why in report.kept_fp32.items():
        log.info("fp16: %s stays FP32: %s", node, why)
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False,
                                         node_block_list=sorted(report.kept_fp32) or None)
    weights = [*converted.graph.initializer,
               *(a.t for n in converted.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value")]
    weights = [t for t in weights if int(np.prod(t.dims)) > 1]
    report.fp16_weights = sum(t.data_type == TensorProto.FLOAT16 for t in weights)
    report.fp32_weights = sum(t.data_type == TensorProto.FLOAT for t in weights)
    return converted, report
