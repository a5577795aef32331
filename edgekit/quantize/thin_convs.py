"""Static int8 for separable (MobileNet-style) CNNs on ONNX Runtime CPU: convolutions with little arithmetic
per output element (depthwise Convs, 1x1 Convs on few channels) and HardSigmoid-gated products kept float,
the wide convolutions int8.

ONNX Runtime's FP32 path runs such a network as NCHWc Convs with the activation (ReLU, HardSwish) fused in:
one pass over each feature map. Quantized, every feature map also pays elementwise passes that FP32 does
not: ONNX Runtime has no integer HardSigmoid, so each HardSwish ``x * HardSigmoid(x)`` and each
squeeze-excite gate runs as DequantizeLinear -> HardSigmoid -> QuantizeLinear -> QLinearMul. A Conv saves
work in int8 in proportion to its multiply-adds per output element, ``(C_in / group) * kh * kw``, while
those passes cost the same per element; a depthwise 3x3 Conv does 9, a 1x1 Conv on 16 channels 16, and for
them int8 loses. Profiled (one thread, per op type, PaddleClas' orientation classifier, PP-LCNet): FP32
14.2 ms, all of it in fused Convs; edgekit's int8 21.6 ms: QLinearConv 8.6 ms plus 12.6 ms in QLinearMul,
QuantizeLinear, DequantizeLinear and HardSigmoid.

The rule, for graphs with separable blocks and HardSigmoid gates (HardSwish, squeeze-excite): a Conv with
fewer than ``min_macs`` multiply-adds per output element stays float, with the HardSigmoid that reads it
(fused into its float Conv), and so does every Mul gated by a HardSigmoid. On
the orientation classifier, side by side with FP32 (interleaved rounds): under 256, 0.89x (one thread) and
0.98x (two) on a Xeon with AMX, 0.79x on the corpus' AVX-512 VNNI host (two threads), where edgekit's
int8 ran 1.43x, 1.53x and 0.92x; top-1 0.979 (budget 0.98); under 64, 1.06x, 1.20x and 0.71x, top-1 1.0.
Keeping only the depthwise Convs float, with or without the gated Muls, was slower than int8 on the
orientation classifier (Xeon: 1.58-1.85x FP32) and no faster than FP32 on PP-OCR's direction classifier
(Xeon: 1.15-1.31x), where under 64 ran 0.85-0.87x (int8 1.47-1.48x; the float rewrites alone, auto's
``fp32-rewritten``, 0.58-0.60x). ``--precision int8`` keeps its plan for now: under 64 was faster than it
and no less accurate on both classifiers on both hosts, and on PP-PicoDet's layout detector (auto's timer:
0.53x FP32 against 0.55x, mAP@0.5 0.891 against 0.829), but it was not faster than FP32 on the Xeon, and
changing what int8 writes for every such graph wants a corpus run of its own; ``auto`` times the candidates
(:data:`THRESHOLDS`) and keeps a plan only when it is faster than FP32 inside the budget.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.engines.fp16 import tensor_consumers
from edgekit.quantize.plan import QuantizationPlan

#: ``min_macs`` of the candidates ``auto`` lists: 64 kept the orientation classifier's top-1 at 1.0; 256 was
#: the faster on both hosts measured but lost one of 48 evaluation images, and was never chosen in the corpus
#: (its build and evaluation cost PP-PicoDet's search 2.3 s), so it is not listed.
THRESHOLDS = (64,)
#: Activations fused into a float (NCHWc) Conv: the HardSigmoid of a HardSwish stays float with its Conv.
FUSED_GATES = ("HardSigmoid",)
#: Ops between a depthwise Conv and the pointwise Conv that reads it, in a separable block.
BLOCK_PASS_THROUGH = ("Relu", "Clip", "HardSigmoid", "HardSwish", "Sigmoid", "Mul", "GlobalAveragePool", "Reshape", "Flatten")


def candidate_name(min_macs: int) -> str:
    return f"int8-thin-convs-float-{min_macs}"


def _group(node: Any) -> int:
    return next((attribute.i for attribute in node.attribute if attribute.name == "group"), 1)


def _weight_shapes(graph: Any) -> dict[str, tuple[int, ...]]:
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
    return shapes


def macs_per_output(node: Any, weight_shapes: dict[str, tuple[int, ...]]) -> int | None:
    """A Conv's multiply-adds per output element, ``(C_in / group) * kh * kw`` (``None``: weight not constant)."""
    shape = weight_shapes.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
    if shape is None or len(shape) < 2:
        return None
    macs = shape[1]
    for size in shape[2:]:
        macs *= size
    return macs


def separable_blocks(graph: Any) -> int:
    """Depthwise Convs (one input channel per group, more than one group) whose output reaches a 1x1 Conv
    through activations, gates and squeeze-excite ops only: the separable blocks that make a graph
    MobileNet-style. ConvNeXt's depthwise Convs feed a LayerNorm and MatMuls, so they do not count."""
    shapes = _weight_shapes(graph)
    readers = tensor_consumers(graph)

    def pointwise(node: Any) -> bool:
        shape = shapes.get(node.input[1]) if node.op_type == "Conv" and _group(node) == 1 and len(node.input) > 1 else None
        return shape is not None and len(shape) >= 3 and all(size == 1 for size in shape[2:])

    def reaches_pointwise(tensor: str, depth: int) -> bool:
        return any(pointwise(reader) or (depth and reader.op_type in BLOCK_PASS_THROUGH
                                         and any(reaches_pointwise(out, depth - 1) for out in reader.output))
                   for reader in readers.get(tensor, []))

    return sum(1 for node in graph.node if node.op_type == "Conv" and _group(node) > 1 and macs_per_output(node, shapes) is not None
               and shapes[node.input[1]][1] == 1 and reaches_pointwise(node.output[0], 6))


def hardsigmoid_gated_muls(graph: Any) -> list[Any]:
    """Mul nodes one of whose inputs is a HardSigmoid's output: HardSwish's ``x * HardSigmoid(x)`` and
    squeeze-excite's channel gate."""
    producers = {out: node for node in graph.node for out in node.output}
    return [node for node in graph.node if node.op_type == "Mul"
            and any(producers.get(name) is not None and producers[name].op_type == "HardSigmoid" for name in node.input)]


def thin_float_nodes(model_path: Path, min_macs: int) -> dict[str, str]:
    """Node name -> why it stays float under the rule of this module, for graphs with separable blocks and
    HardSigmoid gates (empty otherwise: MobileNetV2's ReLU6 blocks pay no HardSigmoid passes, and ONNX
    Runtime requantizes a float depthwise Conv between ReLU6 and the next QuantizeLinear itself)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    gated = hardsigmoid_gated_muls(graph)
    if not gated or not separable_blocks(graph):
        return {}
    shapes = _weight_shapes(graph)
    readers = tensor_consumers(graph)
    kept: dict[str, str] = {}
    for node in graph.node:
        macs = macs_per_output(node, shapes)
        if macs is None or macs >= min_macs:
            continue
        kind = "depthwise Conv" if _group(node) > 1 else "Conv"
        kept[node.name] = (f"{kind} with {macs} multiply-adds per output element (< {min_macs}): kept float, int8 saves less than the "
                           "Q/DQ passes around it cost; ONNX Runtime runs it as an NCHWc Conv with its activation fused")
        for reader in readers.get(node.output[0], []):
            if reader.op_type in FUSED_GATES:
                kept[reader.name] = f"{reader.op_type} reading float Conv '{node.name}': kept float with it (fused into the float Conv)"
    for mul in gated:
        kept.setdefault(mul.name, "Mul gated by a HardSigmoid (HardSwish or squeeze-excite): kept float, ONNX Runtime has no integer "
                                  "HardSigmoid, so quantized it runs as DequantizeLinear, HardSigmoid, QuantizeLinear and QLinearMul")
    return {name: why for name, why in kept.items() if name}


def keep_thin_convs_float(model_path: Path, plan: QuantizationPlan, min_macs: int) -> QuantizationPlan:
    """``plan`` with the thin convolutions (under ``min_macs`` multiply-adds per output element) and the
    HardSigmoid-gated Muls of a separable CNN kept float, each with its reason; ``plan`` itself when the
    graph has no separable block or no HardSigmoid gate. Nodes the plan already keeps keep their own reason."""
    kept = {name: why for name, why in thin_float_nodes(model_path, min_macs).items() if name not in plan.excluded}
    if not kept:
        return plan
    convs = sum("multiply-adds per output element" in why for why in kept.values())
    note = (f"{convs} Conv(s) under {min_macs} multiply-adds per output element and {len(kept) - convs} HardSigmoid/gate node(s) "
            "kept float, the wider Convs int8 (edgekit.quantize.thin_convs)")
    return replace(plan.excluding(kept), notes=(*plan.notes, note))
