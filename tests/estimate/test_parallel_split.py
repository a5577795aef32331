"""A node ONNX Runtime splits over its intra-op threads pays the measured cost of that split: which nodes are split
(checked against ONNX Runtime's own profiler) and what the estimate adds for them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate import graph_costs
from edgekit.estimate.hardware import Hardware
from edgekit.estimate.host_kernels import PARALLEL_ELEMENTS, PARALLEL_MACS, kernel_efficiency, parallel_sync_us, runs_parallel
from edgekit.estimate.roofline import apply_factors, host_factors, roofline


def _add(elements: int) -> onnx.ModelProto:
    other = numpy_helper.from_array(np.full(elements, 0.5, np.float32), "z")
    graph = helper.make_graph([helper.make_node("Add", ["x", "z"], ["y"], name="add")], "add",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [elements])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])], [other])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmul(m: int, k: int) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.full((k, k), 0.01, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, k])], [weight])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _split_by_onnxruntime(model: onnx.ModelProto, tmp_path: Path) -> bool:
    """Whether ONNX Runtime's profiler shows the graph's one node split over a 2-thread pool (a block size)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {i.name: np.ones([d for d in i.shape], np.float32) for i in session.get_inputs()}
    session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    stats = [e["args"].get("thread_scheduling_stats") for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    if not stats or stats[0] is None:
        pytest.skip("this ONNX Runtime's profiler records no thread_scheduling_stats")
    return bool(stats[0]["main_thread"].get("block_size"))


@pytest.mark.parametrize(("model", "split"), [(_add(PARALLEL_ELEMENTS // 4), False), (_add(PARALLEL_ELEMENTS * 2), True),
                                              (_matmul(16, 16), False), (_matmul(256, 64), True)])  # fmt: skip
def test_the_nodes_said_to_run_split_are_those_onnx_runtime_splits(model: onnx.ModelProto, split: bool, tmp_path: Path) -> None:
    (node,) = graph_costs(model).nodes
    assert runs_parallel(node) is split
    assert _split_by_onnxruntime(model, tmp_path) is split


def test_a_split_node_adds_the_measured_sync_cost_and_a_small_one_does_not() -> None:
    assert 64**3 >= PARALLEL_MACS > 16**3
    big, small = graph_costs(_matmul(256, 64)), graph_costs(_matmul(16, 16))
    plain = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0)
    synced = Hardware("host", "cpu", None, {"fp32": 100e9}, 10e9, None, node_overhead_us=1.0, parallel_sync_us=40.0)
    assert roofline(big, synced).fixed_ms == pytest.approx(0.040)
    assert apply_factors(roofline(big, synced), host_factors(synced))[1] == pytest.approx(
        apply_factors(roofline(big, plain), host_factors(plain))[1] + 0.040)
    assert roofline(small, synced).fixed_ms == 0.0


def test_the_sync_cost_is_measured_on_two_threads_and_zero_on_one() -> None:
    assert parallel_sync_us(1) == 0.0
    measured = parallel_sync_us(2, runs=3)
    assert math.isfinite(measured) and 0 <= measured < 100_000


def test_the_micro_benchmark_takes_the_sync_cost_out_of_split_nodes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.estimate import host_kernels

    monkeypatch.setattr(host_kernels, "KERNELS", {"matmul": host_kernels.KERNELS["matmul"][:1]})
    monkeypatch.setattr(host_kernels, "RUNS", 3)
    # A roof of 10 TFLOP/s: no single core reaches it, so the measured efficiency without the sync cost stays under
    # the cap on any host (at 50 GFLOP/s an AVX-512 core ran the 256x64 MatMul past 4x the roof and hit the cap too).
    roof = lambda node: node.ops / 10e12  # noqa: E731
    (with_sync,) = kernel_efficiency(1, roof, 0.0, sync_us=1e6)["matmul"]  # a sync cost larger than the node: floored
    (without,) = kernel_efficiency(1, roof, 0.0, sync_us=0.0)["matmul"]
    assert with_sync[1] == host_kernels.MAX_EFFICIENCY and without[1] < host_kernels.MAX_EFFICIENCY
