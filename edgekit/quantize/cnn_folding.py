"""Exact graph rewrites that give ONNX Runtime's static int8 convolutions longer integer chains on the
CNNs exporters write (Paddle2ONNX's PP-OCR above all). Each rewrite computes the same function in float;
each op it removes would otherwise sit between two ``QLinearConv`` as its own integer op (with a rounding
step) or as a float op between a DequantizeLinear and a QuantizeLinear.

* :func:`fold_conv_affine`: ``Conv -> Mul(c) [-> Add(d)]`` with constant per-tensor or per-output-channel
  ``c``, ``d`` (PP-LCNetV3's learnable affine blocks, batch norms exported as Mul/Add) becomes one Conv
  with scaled weights and bias.
* :func:`hardswish_as_hardsigmoid`: ``x * Clip(x + 3, 0, 6) / 6`` (four ops: Add, Clip, Mul, Div) becomes
  ``x * HardSigmoid(x, 1/6, 1/2)`` (two).
* :func:`fold_affine_into_next_conv`: ``Mul(c) -> Add(d) -> Conv`` with scalar ``c``, ``d`` and an unpadded
  Conv becomes that Conv with weights ``c W`` and bias ``b + d sum(W)`` (padding would add ``d`` only inside
  the image, so a padded Conv is left alone).

On PP-OCRv4's detector these remove 28 + 23 affine pairs and turn 24 HardSwish expansions into two ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FoldCounts:
    conv_affine: int
    hardswish: int
    affine_into_conv: int

    def note(self) -> str | None:
        if not (self.conv_affine or self.hardswish or self.affine_into_conv):
            return None
        return (f"exact float rewrites before quantization, so integer chains run longer: {self.conv_affine} Conv -> Mul/Add folded into "
                f"the Conv, {self.hardswish} HardSwish expansions as x * HardSigmoid(x), {self.affine_into_conv} Mul/Add folded into the "
                "next (unpadded) Conv")


class _Graph:
    """Producers, consumers and constants of a graph, rebuilt after each rewrite."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.graph = model.graph
        self.initializers = {init.name: init for init in self.graph.initializer}
        self.constants = {name: numpy_helper.to_array(init) for name, init in self.initializers.items()}
        for node in self.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.producers = {out: node for node in self.graph.node for out in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in self.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in self.graph.output}

    def only_consumer(self, tensor: str) -> Any | None:
        readers = self.consumers.get(tensor, [])
        return readers[0] if len(readers) == 1 and tensor not in self.outputs else None

    def constant_operand(self, node: Any) -> tuple[str, np.ndarray] | None:
        """(the other input, the constant) of a binary node with exactly one constant input."""
        if len(node.input) != 2:
            return None
        a, b = node.input
        if b in self.constants and a not in self.constants:
            return a, self.constants[b]
        if a in self.constants and b not in self.constants:
            return b, self.constants[a]
        return None

    def set_initializer(self, name: str, array: np.ndarray) -> str:
        """Write ``array`` under a fresh name derived from ``name`` (the old one may be shared)."""
        from onnx import numpy_helper

        fresh = f"{name}_folded"
        index = 0
        while fresh in self.initializers:
            index += 1
            fresh = f"{name}_folded{index}"
        tensor = numpy_helper.from_array(np.ascontiguousarray(array.astype(np.float32)), fresh)
        self.graph.initializer.append(tensor)
        self.initializers[fresh] = tensor
        return fresh


def _per_channel(constant: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` [N, C, ...] map as one value per channel (or one value)
    without changing its shape, as shape [C]."""
    if constant.ndim > rank:
        return None
    if constant.size == 1:
        return np.full(channels, float(constant.reshape(-1)[0]), np.float64)
    squeezed = constant.reshape(-1)
    shape = constant.shape
    if squeezed.size == channels and (shape[-2:] == (1, 1) if len(shape) >= 3 else False) and len(shape) <= 4:
        return squeezed.astype(np.float64)
    return None


def _conv_parts(g: _Graph, conv: Any) -> tuple[np.ndarray, np.ndarray] | None:
    if conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in g.initializers:
        return None
    weight = g.constants[conv.input[1]].astype(np.float64)
    if len(conv.input) > 2 and conv.input[2]:
        if conv.input[2] not in g.initializers:
            return None
        bias = g.constants[conv.input[2]].astype(np.float64)
    else:
        bias = np.zeros(weight.shape[0])
    return weight, bias


def _set_conv(g: _Graph, conv: Any, weight: np.ndarray, bias: np.ndarray) -> None:
    conv.input[1] = g.set_initializer(conv.input[1], weight)
    bias_name = g.set_initializer(conv.input[2] if len(conv.input) > 2 and conv.input[2] else f"{conv.name}_bias", bias)
    if len(conv.input) > 2:
        conv.input[2] = bias_name
    else:
        conv.input.append(bias_name)


def fold_conv_affine(model: Any) -> int:
    """Fold ``Conv -> Mul(c) [-> Add(d)]`` into the Conv; returns the Convs changed."""
    folded = 0
    while True:
        g = _Graph(model)
        for conv in list(g.graph.node):
            parts = _conv_parts(g, conv)
            step = g.only_consumer(conv.output[0]) if parts else None
            if parts is None or step is None or step.op_type not in ("Mul", "Add"):
                continue
            operand = g.constant_operand(step)
            channels = parts[0].shape[0]
            values = _per_channel(operand[1], channels, parts[0].ndim) if operand else None
            if values is None:
                continue
            weight, bias = parts
            if step.op_type == "Mul":
                weight = weight * values.reshape(-1, *([1] * (weight.ndim - 1)))
                bias = bias * values
            else:
                bias = bias + values
            _set_conv(g, conv, weight, bias)
            conv.output[0], step.output[0] = step.output[0], conv.output[0]  # the Conv now writes what the step wrote
            g.graph.node.remove(step)
            folded += 1
            break
        else:
            return folded


def hardswish_as_hardsigmoid(model: Any) -> int:
    """Rewrite ``x * Clip(x + 3, 0, 6) / 6`` as ``x * HardSigmoid(x, alpha=1/6, beta=1/2)``; returns the count."""
    from onnx import helper

    g = _Graph(model)
    rewritten = 0
    for add in list(g.graph.node):
        operand = g.constant_operand(add) if add.op_type == "Add" else None
        if operand is None or operand[1].size != 1 or operand[1].ndim > 1 or float(operand[1].reshape(-1)[0]) != 3.0:
            continue
        x = operand[0]
        clip = g.only_consumer(add.output[0])
        if clip is None or clip.op_type != "Clip" or not _clips_to(g, clip, 0.0, 6.0):
            continue
        mul = g.only_consumer(clip.output[0])
        if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([x, clip.output[0]]):
            continue
        div = g.only_consumer(mul.output[0])
        scale = g.constant_operand(div) if div is not None and div.op_type in ("Div", "Mul") else None
        if scale is None or scale[0] != mul.output[0] or scale[1].size != 1:
            continue
        factor = float(scale[1].reshape(-1)[0])
        if not (div.op_type == "Div" and factor == 6.0 or div.op_type == "Mul" and abs(factor - 1 / 6) < 1e-7):
            continue
        gate = f"{add.name or x}_hardsigmoid"
        index = list(g.graph.node).index(add)
        for node in (add, clip, mul):
            g.graph.node.remove(node)
        g.graph.node.remove(div)
        g.graph.node.insert(index, helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1 / 6, beta=0.5))
        g.graph.node.insert(index + 1, helper.make_node("Mul", [x, gate], [div.output[0]], name=f"{gate}_mul"))
        rewritten += 1
    return rewritten


def _clips_to(g: _Graph, clip: Any, low: float, high: float) -> bool:
    bounds = [g.constants.get(name) if name else None for name in list(clip.input[1:3]) + [""] * (3 - len(clip.input))]
    values = [None if b is None else float(np.asarray(b).reshape(-1)[0]) for b in bounds[:2]]
    return values == [low, high]


def fold_affine_into_next_conv(model: Any) -> int:
    """Fold ``Mul(c) -> Add(d) -> Conv`` (scalars, unpadded Conv read by nothing else) into the Conv."""
    from onnx import helper

    folded = 0
    while True:
        g = _Graph(model)
        for mul in list(g.graph.node):
            operand = g.constant_operand(mul) if mul.op_type == "Mul" else None
            if operand is None or operand[1].size != 1:
                continue
            add = g.only_consumer(mul.output[0])
            shift = g.constant_operand(add) if add is not None and add.op_type == "Add" else None
            if shift is None or shift[1].size != 1:
                continue
            conv = g.only_consumer(add.output[0])
            parts = _conv_parts(g, conv) if conv is not None else None
            if parts is None or conv.input[0] != add.output[0]:
                continue
            attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
            if any(attributes.get("pads", [])) or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
                continue
            c, d = float(operand[1].reshape(-1)[0]), float(shift[1].reshape(-1)[0])
            weight, bias = parts
            bias = bias + d * weight.reshape(weight.shape[0], -1).sum(axis=1)
            _set_conv(g, conv, weight * c, bias)
            conv.input[0] = operand[0]
            g.graph.node.remove(add)
            g.graph.node.remove(mul)
            folded += 1
            break
        else:
            return folded


def fold_for_int8(model_path: Path, out_path: Path) -> tuple[Path, FoldCounts]:
    """All three rewrites on a model file; writes ``out_path`` only when something changed."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=True)
    counts = FoldCounts(fold_conv_affine(model), hardswish_as_hardsigmoid(model), fold_affine_into_next_conv(model))
    if counts.note() is None:
        return model_path, counts
    _drop_unused_initializers(model)
    onnx.save(model, str(out_path))
    return out_path, counts


def _drop_unused_initializers(model: Any) -> None:
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    for init in [i for i in model.graph.initializer if i.name not in used]:
        model.graph.initializer.remove(init)
