"""What a roofline pass gives back (each node's or layer's time, the whole pass), and the TensorRT layer priors.

Below both :mod:`edgekit.estimate.roofline` (per ONNX node) and :mod:`edgekit.estimate.tensorrt_layers` (per
fused TensorRT-shaped layer), which each return a :class:`Roofline`; :mod:`~edgekit.estimate.roofline`
re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgekit.estimate.graph_cost import ALL_CLASSES

#: TensorRT-shaped layers (:mod:`edgekit.estimate.tensorrt_layers`) on an NVIDIA GPU: the share of the roofline a
#: fused layer reaches, per layer class, and the launch cost of one layer (uncalibrated priors, not fitted to the
#: published figures: a fused conv / GEMM keeps the per-node GPU prior, pointwise and reformat layers stream at
#: a higher share of bandwidth than a lone elementwise node, a layer launch costs what an enqueued kernel does)
TENSORRT_EFFICIENCY: dict[str, float] = {"conv": 0.45, "matmul": 0.55, "attention": 0.45, "elementwise": 0.6, "normalization": 0.6,
                                         "pooling": 0.5, "resize": 0.4, "data_movement": 0.6, "quantize": 0.6}  # fmt: skip
TENSORRT_LAYER_LAUNCH_US = 5.0
#: the share of the memory bandwidth a streaming layer reaches (a prior, the same for every layer class)
TENSORRT_MEMORY_SHARE = 0.75


@dataclass(frozen=True)
class NodeTime:
    name: str
    op_type: str
    op_class: str
    precision: str
    roofline_ms: float  # at efficiency 1: max(compute, memory)
    bound: str  # "compute" or "memory"
    ms: float
    fixed_ms: float = 0.0  # a measured cost no factor scales (an If's subgraph invocation)


@dataclass(frozen=True)
class Roofline:
    nodes: tuple[NodeTime, ...]
    counted_nodes: int
    notes: tuple[str, ...] = field(default=())
    fallback_nodes: int = 0  # nodes the fallback engine (the CPU) ran

    def class_roofline_ms(self) -> dict[str, float]:
        out = dict.fromkeys(ALL_CLASSES, 0.0)
        for node in self.nodes:
            out[node.op_class] += node.roofline_ms
        return out

    @property
    def fixed_ms(self) -> float:
        return sum(node.fixed_ms for node in self.nodes)
