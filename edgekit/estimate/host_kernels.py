"""Micro-benchmarks of the kernels a measured host runs, for the roofline of ``x86-64-cpu``: what share of the
measured roofline (:mod:`edgekit.estimate.host_peak`) each kind of node reaches, and what an ``If`` costs.

A GEMM peak does not say how fast a depthwise convolution, a 3-input-channel stem, a batch of 8x8 convolutions or a
tanh runs. Each kind (:func:`edgekit.estimate.graph_cost.node_kind`) is timed here on synthetic nodes at a small and a
larger size, as a chain of identical nodes run by ONNX Runtime at ``ORT_ENABLE_ALL`` (the kernel ONNX Runtime picks for
it here: NCHWc convolutions on x86, fused activations) and timed by the wall clock, and its efficiency is the
roofline time of one node (costed by the same graph cost) over the chain's time per node. An estimate interpolates a node's efficiency from its kind's
points by the node's roofline time (log scale, clamped to the measured range). Nothing here looks at a model: the
shapes are generic ones picked per kernel (channels 16-256, sizes past and within the L2), none copied from a model
whose estimate is scored against a measurement (``scripts/estimate_accuracy.py``), so the default estimate is not
fitted to the models it is checked on.

Kinds where one class's share of the roofline differs by kernel (runs on a 2-core AVX-512 host, 2026-11-28): 1-D
convolutions run im2col and a GEMM image by image with no NCHWc kernel, so one whose output is a few samples an image
(``conv-1d-short``) reached 0.05-0.75 of the roofline, a long signal's (``conv-1d``) 0.6-1.2 and a one-channel
waveform front end (``conv-1d-stem``) 0.2-0.5; a 7x7 depthwise convolution (``conv-depthwise-large``) 0.7-1.2 where a
3x3 reached 0.3-1.3; ONNX Runtime's LayerNorm 0.2-0.8 over rows of 128-384 features and 0.02-0.17 over rows of 16-32
(``layernorm-narrow``: the per-row reductions dominate); its GELU 0.12-0.72 where Tanh reached 0.2-1.5 (12 ops an
element counted against 8); InstanceNorm (GroupNorm as exported) 0.3-1.2. Before these kinds the normalisations took
the class prior (0.25) and GELU the Tanh points.

:func:`subgraph_costs_us`: chains of ``If`` nodes with 1 and :data:`SUBGRAPH_NODES` tiny nodes a branch against the same
nodes without the ``If``: what an If costs per call, and what each node inside a subgraph costs beyond a top-level node.

:func:`parallel_sync_us`: what splitting one node over ONNX Runtime's intra-op pool costs (waking the other threads,
the barrier at its end, which on a loaded host waits for a descheduled thread): a chain of small MatMuls (ones MLAS
splits) on all threads, less the same chain's time on one thread divided by the threads. :func:`runs_parallel` says
which nodes ONNX Runtime splits, by the sizes at which its profiler showed a split here (``thread_scheduling_stats``
with a block size): MLAS splits a GEMM or convolution from 64 K multiply-adds (64x64x64 ran on 2 threads); an
elementwise Add ran on 1 thread at 65 536 elements and on 2 at 131 072 (ONNX Runtime's per-op cost model).

Every timing here is the :data:`QUIET_PERCENTILE` of its runs (:func:`quiet_time`), the speed of the runs no other
process interrupted: on a shared host a benchmark of 0.1-1 ms mostly runs whole between preemptions while a model of
several ms on a spinning 2-thread pool mostly does not, so a median describes a different load for each and their
ratio is not the kernel's. A model's time is compared at the same percentile (``scripts/estimate_accuracy.py``).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.engines.ort_session import cpu_session

RUNS = 10
IF_CHAIN = 64
SUBGRAPH_NODES = 8  # the larger branch of subgraph_costs_us: the slope from 1 to this many nodes is the per-node premium
CHAIN = 6  # identical nodes a synthetic graph chains, so the layout reorders at its ends are shared
#: a kind may beat the roofline of its measured figures (an in-cache kernel against the copy bandwidth); bounded
MAX_EFFICIENCY = 4.0
PARALLEL_MACS = 65536  # a GEMM or convolution this big (multiply-adds) is split by MLAS over the pool
PARALLEL_ELEMENTS = 131072  # another node writing this many elements is split by ONNX Runtime's cost model
SYNC_SHAPE = (256, 64)  # the MatMul chain of parallel_sync_us: 1 M multiply-adds a node, split on 2 threads
#: the percentile of a benchmark's run times it reports: the uncontended runs (a quiet host's median) on a shared host
QUIET_PERCENTILE = 10


def quiet_time(times: list[float]) -> float:
    """The :data:`QUIET_PERCENTILE` of ``times``: what a run takes when no other process interrupts it (on a quiet
    host about its median; on a loaded one the median mixes in preemptions whose share grows with the run's length)."""
    return float(np.percentile(times, QUIET_PERCENTILE))


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "kernel", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _chain(shape: list[int], step: Callable[[str, int], tuple[list[Any], list[Any], list[int]]], count: int = CHAIN) -> tuple[Any, dict[str, np.ndarray]]:
    """x[shape] -> ``count`` copies of the node ``step`` makes (nodes, initializers, output shape), one feeding the next."""
    from onnx import TensorProto, helper

    nodes, inits, current, out_shape = [], [], "x", shape
    for i in range(count):
        made, weights, out_shape = step(current, i)
        nodes += made
        inits += weights
        current = made[-1].output[0]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                   [helper.make_tensor_value_info(current, TensorProto.FLOAT, out_shape)], inits)  # fmt: skip
    return model, {"x": np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}


def _conv(batch: int, c_in: int, c_out: int, size: int, kernel: int, group: int = 1, dims: int = 2, stride: int = 1) -> tuple[Any, dict[str, np.ndarray]]:
    """Convolutions (+ Relu, which ONNX Runtime fuses) in a chain; a stem (c_in != c_out, the only kind with a
    ``stride`` other than 1) alone."""
    from onnx import helper, numpy_helper

    spatial = [size] * dims
    out_spatial = [(size + 2 * (kernel // 2) - kernel) // stride + 1] * dims

    def step(x: str, i: int) -> tuple[list[Any], list[Any], list[int]]:
        weight = numpy_helper.from_array(np.full((c_out, c_in // group, *[kernel] * dims), 0.01, np.float32), f"w{i}")
        bias = numpy_helper.from_array(np.zeros(c_out, np.float32), f"b{i}")
        conv = helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[kernel // 2] * (2 * dims), group=group,
                                strides=[stride] * dims, name=f"k{i}")  # fmt: skip
        return [conv, helper.make_node("Relu", [f"c{i}"], [f"y{i}"], name=f"act{i}")], [weight, bias], [batch, c_out, *out_spatial]

    return _chain([batch, c_in, *spatial], step, CHAIN if c_in == c_out else 1)


def _matmul(m: int, k: int) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import helper, numpy_helper

    def step(x: str, i: int) -> tuple[list[Any], list[Any], list[int]]:
        weight = numpy_helper.from_array(np.full((k, k), 0.01, np.float32), f"w{i}")
        return [helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"], name=f"k{i}")], [weight], [m, k]

    return _chain([m, k], step)


def _elementwise(op: str, elements: int, domain: str = "") -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import helper, numpy_helper

    def step(x: str, i: int) -> tuple[list[Any], list[Any], list[int]]:
        if op in ("Add", "Mul"):  # a second operand as big as the first: reads two tensors, writes one
            other = numpy_helper.from_array(np.full(elements, 0.5, np.float32), f"z{i}")
            return [helper.make_node(op, [x, f"z{i}"], [f"y{i}"], name=f"k{i}")], [other], [elements]
        return [helper.make_node(op, [x], [f"y{i}"], name=f"k{i}", domain=domain)], [], [elements]

    return _chain([elements], step)


def _normalization(op: str, shape: list[int]) -> tuple[Any, dict[str, np.ndarray]]:
    """LayerNormalization over the last axis of ``shape`` (rows x features) or InstanceNormalization over the
    spatial axes of ``shape`` (N, C, L), with a scale and bias, chained."""
    from onnx import helper, numpy_helper

    width = shape[-1] if op == "LayerNormalization" else shape[1]

    def step(x: str, i: int) -> tuple[list[Any], list[Any], list[int]]:
        weights = [numpy_helper.from_array(np.full(width, 1.0 + 1e-3 * i, np.float32), f"s{i}"),
                   numpy_helper.from_array(np.full(width, 0.01, np.float32), f"b{i}")]  # fmt: skip
        extra = {"axis": -1} if op == "LayerNormalization" else {}
        return [helper.make_node(op, [x, f"s{i}", f"b{i}"], [f"y{i}"], name=f"k{i}", **extra)], weights, shape

    return _chain(shape, step)


def _reorder(batch: int, channels: int, size: int) -> tuple[Any, dict[str, np.ndarray]]:
    """ONNX Runtime's NCHWc layout conversions (``ReorderInput`` / ``ReorderOutput``, domain com.microsoft.nchwc),
    alternating, 3 pairs: the data movement its optimised graphs are full of (around every convolution block that
    meets a node without an NCHWc kernel). A chain of Transposes cannot stand for them: ONNX Runtime merges and
    cancels a Transpose chain into one Identity, which left this kind with no measured point (the class prior)."""
    from onnx import TensorProto, helper

    shape, nodes, current = [batch, channels, size, size], [], "x"
    for i in range(CHAIN // 2):
        nodes.append(helper.make_node("ReorderInput", [current], [f"b{i}"], domain="com.microsoft.nchwc", name=f"in{i}"))
        nodes.append(helper.make_node("ReorderOutput", [f"b{i}"], [f"y{i}"], domain="com.microsoft.nchwc", channels=channels, name=f"out{i}"))
        current = f"y{i}"
    graph = helper.make_graph(nodes, "reorder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, shape)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft.nchwc", 1)])
    return model, {"x": np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}


#: node kind -> synthetic nodes, smallest first; the kinds :func:`edgekit.estimate.graph_cost.node_kind` names.
#: Generic shapes, chosen by the kernel ONNX Runtime runs (no model's layer copied); batch x channels x size.
KERNELS: dict[str, tuple[Callable[[], tuple[Any, dict[str, np.ndarray]]], ...]] = {
    "conv-dense": (lambda: _conv(16, 32, 32, 8, 3), lambda: _conv(4, 32, 32, 32, 3)),
    "conv-pointwise": (lambda: _conv(32, 64, 64, 8, 1), lambda: _conv(8, 64, 64, 32, 1)),
    "conv-depthwise": (lambda: _conv(32, 64, 64, 8, 3, group=64), lambda: _conv(8, 64, 64, 32, 3, group=64)),
    # 7x7 depthwise (group = channels): 5.4x the multiply-adds of a 3x3 on the same bytes
    "conv-depthwise-large": (lambda: _conv(8, 64, 64, 8, 7, group=64), lambda: _conv(2, 48, 48, 48, 7, group=48)),
    "conv-stem": (lambda: _conv(64, 3, 32, 8, 3), lambda: _conv(16, 3, 32, 32, 3)),
    # 1-D convolutions over [N, C, L]: ONNX Runtime has no NCHWc kernel for them (im2col and a GEMM per image)
    "conv-1d": (lambda: _conv(8, 64, 64, 64, 3, dims=1), lambda: _conv(2, 32, 32, 2048, 3, dims=1), lambda: _conv(8, 64, 64, 512, 3, dims=1)),
    # outputs shorter than CONV1D_SHORT_OUTPUT an image (2, 6, 12): GEMMs of that many columns, per-image setup dominates
    "conv-1d-short": (lambda: _conv(16, 64, 64, 2, 3, dims=1), lambda: _conv(4, 192, 192, 6, 3, dims=1), lambda: _conv(2, 256, 256, 12, 3, dims=1)),
    # a waveform's first layer: 1 input channel, a long signal, a kernel of 8 samples at a stride of 4
    "conv-1d-stem": (lambda: _conv(2, 1, 64, 4096, 8, dims=1, stride=4), lambda: _conv(2, 1, 64, 32768, 8, dims=1, stride=4)),
    "matmul": (lambda: _matmul(256, 64), lambda: _matmul(1024, 384)),
    # 256 K elements (3 MB moved by an Add): past the L2, within the L3, the size of PP-OCR's hard-swish nodes
    "elementwise-simple": (lambda: _elementwise("Add", 16384), lambda: _elementwise("Add", 1 << 18), lambda: _elementwise("Add", 1 << 20)),
    "elementwise-transcendental": (lambda: _elementwise("Tanh", 16384), lambda: _elementwise("Tanh", 1 << 18), lambda: _elementwise("Tanh", 1 << 20)),
    # ONNX Runtime's GELU kernel (com.microsoft Gelu; BiasGelu and FastGelu are the same loop with a bias)
    "gelu": (lambda: _elementwise("Gelu", 16384, "com.microsoft"), lambda: _elementwise("Gelu", 1 << 18, "com.microsoft"),
             lambda: _elementwise("Gelu", 1 << 20, "com.microsoft")),  # fmt: skip
    # rows of 128-384 features; rows of 16-32 (LAYERNORM_NARROW) are their own kind: the per-row work dominates
    "layernorm": (lambda: _normalization("LayerNormalization", [256, 384]), lambda: _normalization("LayerNormalization", [1024, 384]),
                  lambda: _normalization("LayerNormalization", [8192, 128])),  # fmt: skip
    "layernorm-narrow": (lambda: _normalization("LayerNormalization", [1024, 16]), lambda: _normalization("LayerNormalization", [8192, 32])),
    "instancenorm": (lambda: _normalization("InstanceNormalization", [8, 16, 1024]), lambda: _normalization("InstanceNormalization", [2, 64, 8192])),
    # 512 KB a tensor (within the L2) and 8 MB (past it); every data-movement node takes this kind's efficiency
    "data_movement": (lambda: _reorder(8, 64, 16), lambda: _reorder(8, 64, 64)),
}


def _wall_ms(model: Any, feeds: Mapping[str, np.ndarray], threads: int, optimized: Path) -> float:
    """Quiet wall time (ms, :func:`quiet_time`) of one run of ``model`` on ONNX Runtime (CPU, ORT_ENABLE_ALL, as the bench runs a model),
    past 3 warm-up runs; the optimized graph it ran is saved at ``optimized`` (the graph an estimate would cost)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, dict(feeds))
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        session.run(None, dict(feeds))
        times.append((time.perf_counter() - start) * 1e3)
    return quiet_time(times)


def kernel_efficiency(threads: int, roofline_s: Callable[[Any], float], node_overhead_us: float = 0.0,
                      sync_us: float = 0.0) -> dict[str, list[list[float]]]:
    """kind -> [[roofline seconds, efficiency], ...] of its synthetic nodes, smallest first. A synthetic graph is a
    chain of identical nodes of one kind timed as a whole (wall clock, the way a model's p50 is: what happens between
    kernels on a busy host counts too); a node's time is the chain's time (less the per-node dispatch overhead, and
    for a node split over the threads the split's ``sync_us``, both of which the estimate adds on its own) over the nodes of that kind, and its efficiency its roofline time over that.
    ``roofline_s(node_cost)`` is the measured host's roofline of one costed node (efficiency 1)."""
    from edgekit.estimate.graph_cost import graph_costs, node_kind

    points: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="edgekit-kernels-") as tmp:
        for kind, builders in KERNELS.items():
            for index, build in enumerate(builders):
                model, feeds = build()
                optimized = Path(tmp) / f"{kind}-{index}.onnx"
                wall_ms = _wall_ms(model, feeds, threads, optimized)
                cost = graph_costs(optimized, input_shapes={k: v.shape for k, v in feeds.items()}, fusion="runtime")
                nodes = [n for n in cost.nodes if node_kind(n) == kind and not n.fused]
                if not nodes or not math.isfinite(wall_ms) or wall_ms <= 0:
                    continue
                middle = nodes[len(nodes) // 2]
                split_us = sync_us if runs_parallel(middle) else 0.0
                per_node_s = max(wall_ms / 1e3 / len(nodes) - (node_overhead_us + split_us) * 1e-6, 1e-9)
                seconds = roofline_s(middle)
                if seconds > 0:
                    points.setdefault(kind, []).append([seconds, min(MAX_EFFICIENCY, seconds / per_node_s)])
    return {kind: sorted(p) for kind, p in points.items()}


def runs_parallel(node: Any) -> bool:
    """Whether ONNX Runtime splits ``node`` (a costed node) over its intra-op threads, by the measured thresholds:
    GEMMs and convolutions from :data:`PARALLEL_MACS` multiply-adds, other nodes from :data:`PARALLEL_ELEMENTS`
    output elements (its written bytes at its precision's width; LayerNorm and Softmax, split earlier by their
    higher per-element cost, are under-counted)."""
    from edgekit.estimate.graph_cost import node_kind

    if node.fused:
        return False
    if node_kind(node).startswith(("conv", "matmul")):
        return node.ops / 2 >= PARALLEL_MACS
    width = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "uint8": 1, "int4": 0.5}.get(node.precision, 4)
    return node.bytes_written / width >= PARALLEL_ELEMENTS


def efficiency_at(points: list[list[float]], roofline_s: float) -> float:
    """A kind's efficiency at a node's roofline time: log-linear between its measured points, clamped at the ends."""
    if len(points) == 1 or roofline_s <= points[0][0]:
        return points[0][1]
    if roofline_s >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= roofline_s <= x1:
            t = (math.log(roofline_s) - math.log(x0)) / (math.log(x1) - math.log(x0)) if x1 > x0 else 0.0
            return y0 + t * (y1 - y0)
    return points[-1][1]


def _if_chain(with_if: bool, branch_nodes: int = 1) -> Any:
    """x[1,16] -> IF_CHAIN links of ``branch_nodes`` Neg nodes each, inside an If (both branches alike) or not."""
    from onnx import TensorProto, helper

    def negs(first: str, tag: str, last: str) -> list[Any]:
        names = [f"{tag}_{j}" for j in range(branch_nodes - 1)] + [last]
        return [helper.make_node("Neg", [src], [dst]) for src, dst in zip([first, *names[:-1]], names)]

    nodes, current = [], "x"
    for i in range(IF_CHAIN):
        out = f"v{i}"
        if with_if:
            branch = lambda tag: helper.make_graph(negs(current, f"{tag}{i}", f"{tag}{i}"), f"{tag}{i}", [],  # noqa: E731
                                                   [helper.make_tensor_value_info(f"{tag}{i}", TensorProto.FLOAT, [1, 16])])  # fmt: skip
            nodes.append(helper.make_node("If", ["cond"], [out], then_branch=branch("t"), else_branch=branch("e"), name=f"if{i}"))
        else:
            nodes.extend(negs(current, f"n{i}", out))
        current = out
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if with_if:  # the condition is an input, so ONNX Runtime cannot fold the Ifs away at load
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return _model(nodes, inputs, [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, 16])], [])


def subgraph_costs_us(threads: int, runs: int = 40) -> tuple[float, float]:
    """(per If call, per node inside a subgraph), us: chains of Ifs whose branches hold 1 and :data:`SUBGRAPH_NODES`
    Neg nodes, each against the same Negs without the If (quiet times, :func:`quiet_time`, three rounds interleaved so
    the load hits both). An If of ``k`` nodes costs ``call + k x inside`` more than its nodes at top level: ``inside``
    is the slope between the two sizes (a subgraph's nodes run in a frame of their own, their outputs allocated per
    call), ``call`` the rest. Both at least 0."""
    def quiet_s(model: Any) -> float:
        session = cpu_session(model, threads, denormal_as_zero=False)
        feed = {"x": np.ones((1, 16), np.float32), "cond": np.array(True)}
        return quiet_run_s(session, {i.name: feed[i.name] for i in session.get_inputs()}, runs, warmup=5)

    pairs = {k: (_if_chain(True, k), _if_chain(False, k)) for k in (1, SUBGRAPH_NODES)}
    per_if: dict[int, list[float]] = {k: [] for k in pairs}
    for _ in range(3):
        for k, (branched, plain) in pairs.items():
            per_if[k].append((quiet_s(branched) - quiet_s(plain)) / IF_CHAIN * 1e6)
    small, large = (float(np.median(per_if[k])) for k in (1, SUBGRAPH_NODES))
    inside = max(0.0, (large - small) / (SUBGRAPH_NODES - 1))
    return max(0.0, small - inside), inside


def subgraph_overhead_us(threads: int, runs: int = 40) -> float:
    """Per If: what an If with a one-node branch costs beyond that node (:func:`subgraph_costs_us`'s call part)."""
    return subgraph_costs_us(threads, runs)[0]


def quiet_run_s(session: Any, feeds: Mapping[str, np.ndarray], runs: int, warmup: int = 3) -> float:
    """The quiet wall time (:func:`quiet_time`) of ``runs`` calls after ``warmup`` untimed ones, in seconds."""
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return quiet_time(times)


def parallel_sync_us(threads: int, runs: int = 20) -> float:
    """Per node split over ``threads``: the quiet time of a chain of :data:`SYNC_SHAPE` MatMuls on ``threads``
    minus its time on one thread divided by ``threads`` (the work, perfectly split), three times interleaved (the
    load hits both); 0 on one thread, where nothing is split."""
    if threads <= 1:
        return 0.0
    model, feeds = _matmul(*SYNC_SHAPE)
    split, single = (cpu_session(model, n, denormal_as_zero=False) for n in (threads, 1))
    samples = [(quiet_run_s(split, feeds, runs) - quiet_run_s(single, feeds, runs) / threads) / CHAIN for _ in range(3)]
    return max(0.0, float(np.median(samples)) * 1e6)
