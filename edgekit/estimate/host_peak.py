"""Measure this host's peak for the roofline of a CPU target without vendor figures (``x86-64-cpu``):
a short ONNX Runtime GEMM (512x512: fits the caches, so it shows the arithmetic peak; fp32 MatMul, int8 MatMulInteger) at the target's thread count, and a NumPy
copy for memory bandwidth (a 256 MB copy for memory, one within half the L2 cache for the in-cache bandwidth), and the
per-node dispatch overhead (the quiet time of a chain of tiny Add/Mul nodes, per node), and the kernel
micro-benchmarks of :mod:`edgekit.estimate.host_kernels` (the share of that roofline each node kind reaches, the
cost of an If's subgraph, the cost of splitting a node over the threads). The result is cached per CPU model, threads and ONNX Runtime version in
``$EDGEKIT_CACHE_DIR/host-peak.json`` (default ``~/.cache/edgekit``); ``refresh=True`` measures again.

These are MEASURED peaks of this host's kernels (the 10th percentile of a few repeats: the uncontended runs,
:func:`edgekit.estimate.host_kernels.quiet_time`), not vendor figures.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.estimate.host_kernels import SUBGRAPH_NODES, kernel_efficiency, parallel_sync_us, quiet_run_s, quiet_time, subgraph_costs_us

GEMM_SIZE = 512
LARGE_GEMM_SIZE = 1024  # 12 MB of fp32 operands: past the L2, the rate a large layer sees
REPEATS = 10
COPY_MB = 256
CHAIN_NODES = 256  # tiny nodes whose quiet time, per node, is the dispatch overhead


def host_threads(cores: int) -> int:
    """The intra-op threads a benchmark here uses for a target of ``cores`` cores (as ``edgekit build`` picks them):
    the peak is measured at the same count, so the estimate and the bench it is compared with agree."""
    return max(1, min(os.cpu_count() or 1, cores))


def _cache_path() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "host-peak.json"


def _gemm_session(kind: str, threads: int, n: int = GEMM_SIZE) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if kind == "fp32":
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("a", "b")]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])
    else:
        node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
        inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [n, n]), helper.make_tensor_value_info("b", TensorProto.INT8, [n, n])]
        out = helper.make_tensor_value_info("y", TensorProto.INT32, [n, n])
    model = helper.make_model(helper.make_graph([node], "gemm", inputs, [out]), opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _chain_session(threads: int) -> Any:
    """x[1,16] -> (Add c, Mul d) x CHAIN_NODES/2: nodes with next to no work, so their time is dispatch overhead."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, current = [], [], "x"
    for i in range(CHAIN_NODES // 2):
        inits += [numpy_helper.from_array(np.full((1, 16), 1.0 + i * 1e-3, np.float32), f"c{i}"),
                  numpy_helper.from_array(np.full((1, 16), 0.999, np.float32), f"d{i}")]  # fmt: skip
        nodes += [helper.make_node("Add", [current, f"c{i}"], [f"a{i}"]), helper.make_node("Mul", [f"a{i}", f"d{i}"], [f"m{i}"])]
        current = f"m{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, 16])], inits)  # fmt: skip
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def node_overhead_us(threads: int, runs: int = 50) -> float:
    """The quiet time of the Add/Mul chain per node, in microseconds: ONNX Runtime's per-node dispatch overhead here."""
    session = _chain_session(threads)
    return quiet_run_s(session, {"x": np.ones((1, 16), np.float32)}, runs, warmup=5) / CHAIN_NODES * 1e6


def _best_seconds(run: Any, repeats: int = REPEATS) -> float:
    """The quiet time (10th percentile) of ``repeats`` timed runs (after one warm-up). Not the median: on a shared
    host a ~1 ms GEMM mostly runs between preemptions while a model of several ms does not, so the medians of the two
    describe different loads (measured 2026-11-28 at load 4-10 on 2 cores: resnet's median 3.68 ms, 2.2x its 10th
    percentile of 1.67 ms); the uncontended runs of both are what a quiet host's median is."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return quiet_time(times)


def l2_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of cpu0's level-2 cache as sysfs reports it (``2048K``), or None where it does not."""
    for index in sorted(root.glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024**2}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return None


def _gemm_peaks(threads: int, n: int, repeats: int = REPEATS) -> dict[str, float]:
    rng = np.random.default_rng(0)
    peaks = {}
    a32, b32 = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    session = _gemm_session("fp32", threads, n)
    peaks["fp32"] = 2.0 * n**3 / _best_seconds(lambda: session.run(None, {"a": a32, "b": b32}), repeats)
    a8, b8 = rng.integers(0, 255, (n, n), dtype=np.uint8), rng.integers(-127, 127, (n, n), dtype=np.int8)
    session8 = _gemm_session("int8", threads, n)
    peaks["int8"] = 2.0 * n**3 / _best_seconds(lambda: session8.run(None, {"a": a8, "b": b8}), repeats)
    return peaks


def _measure(threads: int) -> dict[str, Any]:
    n = GEMM_SIZE
    peaks = _gemm_peaks(threads, n)
    large_peaks = _gemm_peaks(threads, LARGE_GEMM_SIZE, repeats=3)
    source = np.ones(COPY_MB * 2**20 // 4, dtype=np.float32)
    target = np.empty_like(source)
    copy_s = _best_seconds(lambda: np.copyto(target, source), repeats=3)
    cache = l2_cache_bytes()
    cache_bandwidth = None
    if cache:  # a copy whose source and destination together fill half the L2: the in-cache bandwidth
        small = np.ones(cache // 16, dtype=np.float32)
        small_target = np.empty_like(small)
        cache_bandwidth = 2.0 * small.nbytes / _best_seconds(lambda: np.copyto(small_target, small), repeats=50)
    result = {"peak_ops": peaks, "bandwidth_bytes_s": 2.0 * source.nbytes / copy_s, "cache_bytes": cache,
            "cache_bandwidth_bytes_s": cache_bandwidth, "node_overhead_us": node_overhead_us(threads), "large_peak_ops": large_peaks,
            "method": f"ONNX Runtime {n}x{n} MatMul/MatMulInteger and a {COPY_MB} MB NumPy copy (read+write), 10th percentile of {REPEATS} "
                      f"({LARGE_GEMM_SIZE}x{LARGE_GEMM_SIZE}: past the L2, of 3), {threads} threads; per-node overhead: 10th percentile of a {CHAIN_NODES}-node Add/Mul chain"}  # fmt: skip
    result["parallel_sync_us"] = parallel_sync_us(threads)
    result["kernel_efficiency"] = kernel_efficiency(threads, _roofline_of(result), result["node_overhead_us"], result["parallel_sync_us"])
    result["subgraph_overhead_us"], result["subgraph_node_us"] = subgraph_costs_us(threads)
    result["method"] += (f"; per node kind: chains of synthetic nodes on ONNX Runtime (wall clock) against their roofline; If: chains of 64 "
                         f"with 1 and {SUBGRAPH_NODES} nodes a branch (per call, and per node inside a subgraph); split over the "
                         "threads: 256x64 MatMul chain on all threads against one")  # fmt: skip
    return result


def _roofline_of(measured: dict[str, Any]) -> Any:
    """node cost -> its roofline seconds on the host just measured (what the estimate computes for it)."""
    from edgekit.estimate.hardware import Hardware
    from edgekit.estimate.roofline import node_roofline_s

    cache, cache_bw = measured.get("cache_bytes"), measured.get("cache_bandwidth_bytes_s")
    host = Hardware("host", "cpu", None, dict(measured["peak_ops"]), float(measured["bandwidth_bytes_s"]), None, (),
                    float(cache) if cache and cache_bw else None, float(cache_bw) if cache and cache_bw else None,
                    large_peak_ops=dict(measured["large_peak_ops"]) if cache and cache_bw else None)  # fmt: skip
    return lambda node: node_roofline_s(node, host)[0]


def _key(threads: int) -> str:
    import onnxruntime

    from edgekit.bundle.manifest import host_description

    return f"{host_description()['cpu']}|threads={threads}|onnxruntime={onnxruntime.__version__}|gemm={GEMM_SIZE}|cache=1|overhead=1|large={LARGE_GEMM_SIZE}|kernels=10|quiet=p10|subgraph=2"


def measure_host_peak(threads: int, *, refresh: bool = False) -> dict[str, Any]:
    """This host's measured peak ops/s (fp32, int8) and bandwidth at ``threads``, from the cache when present."""
    path, key = _cache_path(), _key(threads)
    cache: dict[str, Any] = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except ValueError:
            cache = {}
    if not refresh and isinstance(cache.get(key), dict):
        return {**cache[key], "cached": True}
    result = {**_measure(threads), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    cache[key] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cache, indent=2) + "\n")
    return {**result, "cached": False}
