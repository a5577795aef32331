"""Micro-benchmarks of the kernels a measured host runs, for the roofline of ``x86-64-cpu``: what share of the
measured roofline (:mod:`edgekit.estimate.host_peak`) each kind of node reaches, and what an ``If`` costs.

A GEMM peak does not say how fast a depthwise convolution, a 3-input-channel stem, a batch of 8x8 convolutions or a
tanh runs. Each kind (:func:`edgekit.estimate.graph_cost.node_kind`) is timed here on synthetic nodes at a small and a
larger size, by ONNX Runtime's own per-node profile at ``ORT_ENABLE_ALL`` (the kernel ONNX Runtime picks for it
here: NCHWc convolutions on x86, fused activations), and its efficiency is the roofline time of that node (costed
by the same graph cost) over its measured kernel time. An estimate interpolates a node's efficiency from its kind's
points by the node's roofline time (log scale, clamped to the measured range). Nothing here looks at a model.

:func:`subgraph_overhead_us`: a chain of ``If`` nodes with one tiny node per branch against the same chain without
the ``If``, per ``If``: what running a subgraph costs beyond its nodes.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

RUNS = 10
IF_CHAIN = 64
#: a kind may beat the roofline of its measured figures (an in-cache kernel against the copy bandwidth); bounded
MAX_EFFICIENCY = 4.0


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "kernel", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(batch: int, c_in: int, c_out: int, size: int, kernel: int, group: int = 1, dims: int = 2) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import TensorProto, helper, numpy_helper

    spatial = [size] * dims
    weight = numpy_helper.from_array(np.full((c_out, c_in // group, *[kernel] * dims), 0.01, np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(c_out, np.float32), "b")
    pads = [kernel // 2] * (2 * dims)
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, group=group, name="k")
    relu = helper.make_node("Relu", ["c"], ["y"], name="act")
    model = _model([node, relu], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c_in, *spatial])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, c_out, *spatial])], [weight, bias])  # fmt: skip
    return model, {"x": np.random.default_rng(0).standard_normal((batch, c_in, *spatial), dtype=np.float32)}


def _matmul(m: int, k: int, n: int) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((k, n), 0.01, np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="k")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [weight])  # fmt: skip
    return model, {"x": np.random.default_rng(0).standard_normal((m, k), dtype=np.float32)}


def _elementwise(op: str, elements: int) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import TensorProto, helper

    inputs = ["x", "z"] if op in ("Add", "Mul") else ["x"]
    model = _model([helper.make_node(op, inputs, ["y"], name="k")],
                   [helper.make_tensor_value_info(n, TensorProto.FLOAT, [elements]) for n in inputs],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])], [])  # fmt: skip
    rng = np.random.default_rng(0)
    return model, {n: rng.standard_normal(elements, dtype=np.float32) for n in inputs}


def _transpose(a: int, b: int, c: int) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import TensorProto, helper

    model = _model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1], name="k")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [a, b, c])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [a, c, b])], [])  # fmt: skip
    return model, {"x": np.random.default_rng(0).standard_normal((a, b, c), dtype=np.float32)}


#: node kind -> (small, larger) synthetic nodes; the kinds :func:`edgekit.estimate.graph_cost.node_kind` names.
KERNELS: dict[str, tuple[Callable[[], tuple[Any, dict[str, np.ndarray]]], ...]] = {
    "conv-dense": (lambda: _conv(16, 32, 32, 8, 3), lambda: _conv(4, 32, 32, 32, 3)),
    "conv-pointwise": (lambda: _conv(32, 64, 64, 8, 1), lambda: _conv(8, 64, 64, 32, 1)),
    "conv-depthwise": (lambda: _conv(32, 64, 64, 8, 3, group=64), lambda: _conv(8, 64, 64, 32, 3, group=64)),
    "conv-stem": (lambda: _conv(64, 3, 32, 8, 3), lambda: _conv(16, 3, 32, 32, 3)),
    "conv-other": (lambda: _conv(8, 64, 64, 64, 3, dims=1), lambda: _conv(8, 64, 64, 512, 3, dims=1)),
    "matmul": (lambda: _matmul(256, 64, 64), lambda: _matmul(1024, 384, 384)),
    "elementwise-simple": (lambda: _elementwise("Add", 16384), lambda: _elementwise("Add", 1 << 20)),
    "elementwise-transcendental": (lambda: _elementwise("Tanh", 16384), lambda: _elementwise("Tanh", 1 << 20)),
    "data_movement": (lambda: _transpose(8, 32, 64), lambda: _transpose(64, 64, 64)),
}


def _profiled_us(model: Any, feeds: Mapping[str, np.ndarray], threads: int, folder: Path) -> tuple[dict[str, float], Path]:
    """Median kernel time (us) of every node ONNX Runtime runs for ``model`` at ORT_ENABLE_ALL, by its per-node
    profile (past 3 warm-up runs), and the optimized graph it ran (the same graph an estimate costs)."""
    import onnxruntime as ort

    optimized = folder / "optimized.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "profile")
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(RUNS + 3):
        session.run(None, dict(feeds))
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            times.setdefault(event["name"][: -len("_kernel_time")], []).append(float(event["dur"]))
    return {name: float(np.median(t[3:])) for name, t in times.items() if len(t) > 3}, optimized


def kernel_efficiency(threads: int, roofline_s: Callable[[Any], float]) -> dict[str, list[list[float]]]:
    """kind -> [[roofline seconds, efficiency], ...] of the synthetic nodes of that kind, smallest first: every node
    ONNX Runtime runs in the benchmark graphs counts for its own kind (a conv graph's ReorderInput for data movement).
    ``roofline_s(node_cost)`` is the measured host's roofline of one costed node (efficiency 1)."""
    from edgekit.estimate.graph_cost import graph_costs, node_kind

    points: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="edgekit-kernels-") as tmp:
        for kind, builders in KERNELS.items():
            for index, build in enumerate(builders):
                folder = Path(tmp) / f"{kind}-{index}"
                folder.mkdir()
                model, feeds = build()
                measured, optimized = _profiled_us(model, feeds, threads, folder)
                cost = graph_costs(optimized, input_shapes={k: v.shape for k, v in feeds.items()}, fusion="runtime")
                for node in cost.nodes:
                    us, seconds = measured.get(node.name, 0.0), roofline_s(node)
                    if node.fused or us <= 0 or seconds <= 0:
                        continue
                    points.setdefault(node_kind(node), []).append([seconds, min(MAX_EFFICIENCY, seconds / (us * 1e-6))])
    return {kind: sorted(p) for kind, p in points.items()}


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


def _if_chain(with_if: bool) -> Any:
    from onnx import TensorProto, helper

    nodes, current = [], "x"
    for i in range(IF_CHAIN):
        out = f"v{i}"
        if with_if:
            branch = lambda tag: helper.make_graph([helper.make_node("Neg", [current], [f"{tag}{i}"])], f"{tag}{i}", [],  # noqa: E731
                                                   [helper.make_tensor_value_info(f"{tag}{i}", TensorProto.FLOAT, [1, 16])])  # fmt: skip
            nodes.append(helper.make_node("If", ["cond"], [out], then_branch=branch("t"), else_branch=branch("e"), name=f"if{i}"))
        else:
            nodes.append(helper.make_node("Neg", [current], [out], name=f"n{i}"))
        current = out
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if with_if:  # the condition is an input, so ONNX Runtime cannot fold the Ifs away at load
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return _model(nodes, inputs, [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, 16])], [])


def subgraph_overhead_us(threads: int, runs: int = 40) -> float:
    """Per If: the median time of a chain of Ifs (one Neg a branch) minus that of the same Negs without them."""
    import onnxruntime as ort

    def median_s(model: Any) -> float:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed = {"x": np.ones((1, 16), np.float32), "cond": np.array(True)}
        feed = {i.name: feed[i.name] for i in session.get_inputs()}
        for _ in range(5):
            session.run(None, feed)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    plain, branched = _if_chain(False), _if_chain(True)
    samples = [(median_s(branched) - median_s(plain)) / IF_CHAIN for _ in range(3)]  # interleaved: the load hits both
    return max(0.0, float(np.median(samples)) * 1e6)
