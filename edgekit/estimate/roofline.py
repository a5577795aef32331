"""The roofline: each node takes ``max(ops / peak, bytes / bandwidth) / efficiency[class] + overhead``.

Efficiency factors say what share of the roofline a node class reaches on an engine. The defaults below
are ESTIMATES (uncalibrated priors, not measurements): dense convolutions and GEMMs reach a fair share of
peak, memory-bound classes a share of bandwidth, each kernel launch or operator dispatch costs
``node_overhead_us``. ``edgekit fleet calibrate`` fits them per target and power mode from telemetry.

Because the factor divides each class's roofline time, latency is linear in the inverse factors:
``latency = sum_c roofline_c / e_c + nodes x overhead + fixed``; the calibration solves that system.

On a host whose kernels were micro-benchmarked (:mod:`edgekit.estimate.host_kernels`), each node's roofline
time is divided by its kind's MEASURED efficiency at its size (or, for a kind not benchmarked, by its class's
prior) before the factors apply, so the default factors there are 1 (:func:`host_factors`); the ``fixed`` part
is the measured control-flow cost (:func:`subgraph_fixed_us`: each ``If`` / loop iteration's subgraph invocation,
the premium of each node run inside a subgraph, a loop body's node dispatches; not scaled by any factor).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.estimate.graph_cost import GraphCost, NodeCost, node_kind
from edgekit.estimate.hardware import Hardware
from edgekit.estimate.node_times import TENSORRT_EFFICIENCY as TENSORRT_EFFICIENCY  # re-exported: callers import them from here
from edgekit.estimate.node_times import TENSORRT_LAYER_LAUNCH_US as TENSORRT_LAYER_LAUNCH_US
from edgekit.estimate.node_times import TENSORRT_MEMORY_SHARE as TENSORRT_MEMORY_SHARE
from edgekit.estimate.node_times import NodeTime as NodeTime
from edgekit.estimate.node_times import Roofline as Roofline

#: engine -> op class -> share of the roofline reached (uncalibrated priors); "node_overhead_us" per node.
DEFAULT_EFFICIENCY: dict[str, dict[str, float]] = {
    "cpu": {"conv": 0.45, "matmul": 0.55, "attention": 0.35, "elementwise": 0.35, "normalization": 0.25, "pooling": 0.3,
            "resize": 0.2, "data_movement": 0.3, "quantize": 0.3},  # fmt: skip
    "gpu": {"conv": 0.45, "matmul": 0.55, "attention": 0.35, "elementwise": 0.5, "normalization": 0.4, "pooling": 0.4,
            "resize": 0.3, "data_movement": 0.5, "quantize": 0.5},  # fmt: skip
}
DEFAULT_NODE_OVERHEAD_US = {"cpu": 3.0, "gpu": 8.0}
#: Runtime memory beyond weights and activations (ONNX Runtime / TensorRT libraries and arenas), an estimate.
RUNTIME_OVERHEAD_MB = {"cpu": 60.0, "gpu": 400.0}
#: The share of the power mode's watts the module draws while it infers (an estimate; calibration sets it from
#: the fleet's mean power, a lower bound since it includes idle time).
DEFAULT_POWER_FRACTION = 0.7


@dataclass(frozen=True)
class Factors:
    """Efficiency per op class, per-node overhead and active power share, with where they came from."""

    efficiency: dict[str, float]
    node_overhead_us: float
    power_fraction: float = DEFAULT_POWER_FRACTION
    source: str = "default priors (uncalibrated estimate)"

    def to_json(self) -> dict[str, Any]:
        return {"efficiency": self.efficiency, "node_overhead_us": self.node_overhead_us,
                "power_fraction": self.power_fraction, "source": self.source}  # fmt: skip


def engine_kind(engine: str) -> str:
    return "cpu" if engine == "cpu" else "gpu"


def default_factors(engine: str) -> Factors:
    kind = engine_kind(engine)
    return Factors(dict(DEFAULT_EFFICIENCY[kind]), DEFAULT_NODE_OVERHEAD_US[kind])


def host_factors(hardware: Hardware) -> Factors:
    """The uncalibrated factors for ``hardware``: the priors, with a measured host's per-node overhead; on a host
    whose kernels were micro-benchmarked, 1 for every class (the node times already carry the measured efficiency)."""
    if hardware.layer_model == "tensorrt":
        return Factors(dict(TENSORRT_EFFICIENCY), TENSORRT_LAYER_LAUNCH_US,
                       source="TensorRT layer priors (uncalibrated estimate): efficiency per fused-layer class, launch cost per layer")  # fmt: skip
    factors = default_factors(hardware.engine)
    if hardware.kernel_efficiency:
        return Factors(dict.fromkeys(factors.efficiency, 1.0), hardware.node_overhead_us or factors.node_overhead_us,
                       source="efficiency of each node kind measured by host micro-benchmarks (uncalibrated estimate); "
                              "per-node overhead measured on this host")  # fmt: skip
    if hardware.node_overhead_us:  # a measured host: its own dispatch overhead instead of the prior
        return Factors(factors.efficiency, hardware.node_overhead_us,
                       source="default priors (uncalibrated estimate); per-node overhead measured on this host")  # fmt: skip
    return factors


def node_roofline_s(node: NodeCost, hardware: Hardware) -> tuple[float, str, Hardware, str]:
    """(seconds at efficiency 1, "compute" or "memory", the engine that runs it, the precision whose peak it used)."""
    peak, used, engine = hardware.resolve(node.precision)
    in_cache = engine.cache_bytes is not None and engine.cache_bandwidth_bytes_s and node.bytes <= engine.cache_bytes
    if engine.large_peak_ops and engine.cache_bytes is not None and not in_cache and used in engine.large_peak_ops:
        peak = engine.large_peak_ops[used]  # operands past the L2: the measured out-of-cache rate
    compute_s = node.ops / peak if node.ops else 0.0
    bandwidth = engine.cache_bandwidth_bytes_s if in_cache else engine.bandwidth_bytes_s
    memory_s = node.bytes / bandwidth if bandwidth else 0.0  # no bandwidth figure: a lower bound, said in the sources
    return max(compute_s, memory_s), "compute" if compute_s >= memory_s else "memory", engine, used


def _measured_share(node: NodeCost, engine: Hardware, seconds: float) -> float:
    """The share of the roofline ``node`` reaches on a micro-benchmarked host: its kind's measured efficiency at
    its size, else its class's prior (1 where the engine has no benchmarks: the factors apply later)."""
    from edgekit.estimate.host_kernels import efficiency_at

    if not engine.kernel_efficiency:
        return 1.0
    points = engine.kernel_efficiency.get(node_kind(node))
    if points and seconds > 0:
        return efficiency_at(points, seconds)
    return DEFAULT_EFFICIENCY[engine_kind(engine.engine)].get(node.op_class, 1.0)


def subgraph_fixed_us(node: NodeCost, engine: Hardware) -> float:
    """The measured control-flow cost of ``node`` (us), no factor scales it: a subgraph invocation per call (an If
    that ran, a Loop / Scan iteration), the premium a node pays for running inside a subgraph (an If branch's nodes),
    and a Loop / Scan body's node dispatches (the top-level dispatch plus that premium, per body node and iteration)."""
    call, inside = engine.subgraph_overhead_us or 0.0, engine.subgraph_node_us or 0.0
    return (node.subgraph_calls * call + (inside if node.in_subgraph else 0.0)
            + node.body_node_calls * ((engine.node_overhead_us or 0.0) + inside))  # fmt: skip


def roofline(cost: GraphCost, hardware: Hardware) -> Roofline:
    """Each node's roofline time at efficiency 1 (factors are applied by :func:`latency_ms`); a node ONNX Runtime
    splits over its intra-op threads (:func:`edgekit.estimate.host_kernels.runs_parallel`) also pays the measured
    cost of that split (the pool's dispatch and barrier) as fixed time."""
    from edgekit.estimate.host_kernels import runs_parallel

    if hardware.layer_model == "tensorrt":
        from edgekit.estimate.tensorrt_layers import tensorrt_roofline

        return tensorrt_roofline(cost, hardware)
    nodes, notes, fallbacks = [], [], set()
    on_other: dict[str, int] = {}  # precision -> nodes the fallback engine ran
    for node in cost.nodes:
        if node.fused:
            continue
        seconds, bound, engine, used = node_roofline_s(node, hardware)
        if engine is not hardware:
            on_other[node.precision] = on_other.get(node.precision, 0) + 1
        if used != node.precision:
            fallbacks.add(f"{node.precision} ops timed at the {engine.engine} {used} peak (no {node.precision} figure there)")
        seconds /= _measured_share(node, engine, seconds)
        fixed = subgraph_fixed_us(node, engine) / 1e3
        if engine.parallel_sync_us and runs_parallel(node):  # split over the intra-op pool: dispatch + barrier
            fixed += engine.parallel_sync_us / 1e3
        nodes.append(NodeTime(node.name, node.op_type, node.op_class, node.precision, seconds * 1e3, bound, 0.0, fixed))
    notes.extend(sorted(fallbacks))
    if on_other and hardware.fallback is not None:
        counts = ", ".join(f"{n} {p}" for p, n in sorted(on_other.items()))
        notes.append(f"nodes the {hardware.engine} cannot run ({counts}) run on the {hardware.fallback.engine} instead "
                     "(the CPU execution provider fallback), at its figures:")  # fmt: skip
        notes.extend(f"  {source}" for source in hardware.fallback.sources)
    return Roofline(tuple(nodes), len(nodes), tuple(notes), sum(on_other.values()))


def apply_factors(line: Roofline, factors: Factors) -> tuple[tuple[NodeTime, ...], float]:
    """(nodes with their time, total latency ms)."""
    overhead_ms = factors.node_overhead_us / 1e3
    timed = tuple(NodeTime(n.name, n.op_type, n.op_class, n.precision, n.roofline_ms, n.bound,
                           n.roofline_ms / factors.efficiency.get(n.op_class, 1.0) + overhead_ms + n.fixed_ms, n.fixed_ms)
                  for n in line.nodes)  # fmt: skip
    return timed, sum(n.ms for n in timed)


def latency_from_classes(class_ms: Mapping[str, float], nodes: int, factors: Factors, fixed_ms: float = 0.0) -> float:
    """The same sum from per-class roofline totals (what calibration fits against)."""
    return sum(ms / factors.efficiency.get(cls, 1.0) for cls, ms in class_ms.items()) + nodes * factors.node_overhead_us / 1e3 + fixed_ms
