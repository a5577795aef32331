"""``edgekit fleet calibrate`` observes the numbers the estimate uses (review: observations left out the roofline's
fixed, unscaled time, and on a measured host costed the exported graph while the estimate costs ONNX Runtime's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.estimate.calibration import median_error_pct
from edgekit.estimate.estimate import EstimateInput
from edgekit.estimate.fleet_fit import KnownBundle, cost_on, observation
from edgekit.estimate.graph_cost import graph_costs
from edgekit.estimate.hardware import hardware_for
from edgekit.estimate.host_peak import host_threads
from edgekit.estimate.roofline import apply_factors, host_factors, roofline
from edgekit.estimate.runtime_graph import runtime_graph_costs
from edgekit.target import get_target
from tests.estimate.graphs import cnn

MEASURED = {"peak_ops": {"fp32": 150e9, "int8": 1100e9}, "bandwidth_bytes_s": 21.4e9, "node_overhead_us": 0.55,
            "subgraph_overhead_us": 1.2, "subgraph_node_us": 0.04, "parallel_sync_us": 4.3}  # fmt: skip


def _chained_matmuls(n: int = 256, count: int = 8) -> onnx.ModelProto:
    nodes, inits, current = [], [], "x"
    for i in range(count):
        inits.append(numpy_helper.from_array(np.eye(n, dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        current = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [n, n])], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_prior_factors_score_zero_error_on_their_own_estimate() -> None:
    hardware = hardware_for(get_target("x86-64-cpu"), measured=MEASURED)
    cost = graph_costs(_chained_matmuls())
    line = roofline(cost, hardware)
    prior = host_factors(hardware)
    estimated_ms = apply_factors(line, prior)[1]
    obs = observation(KnownBundle(("m",), EstimateInput(None, {}, None, "m", None), cost), hardware, estimated_ms, "m@x86-64-cpu")
    assert line.fixed_ms == pytest.approx(8 * 4.3 / 1e3)  # each 256x256 MatMul is split over the intra-op pool
    assert obs.fixed_ms == line.fixed_ms
    assert median_error_pct([obs], prior) == pytest.approx(0.0, abs=1e-9)


def test_a_measured_host_observes_the_graph_onnx_runtime_runs(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(16), str(path))
    bundle = KnownBundle(("cnn",), EstimateInput(path, {"batch": 4}, 4, "cnn", None), graph_costs(path, {"batch": 4}))
    device = cost_on(bundle, get_target("raspberry-pi-5"), {})
    assert device is bundle  # a target with its own figures: the exported graph, as the estimate costs it
    cache: dict = {}
    host = get_target("x86-64-cpu")
    ran = cost_on(bundle, host, cache)
    expected = runtime_graph_costs(path, host_threads(host.cpu.cores), dims={"batch": 4})
    assert [n.op_type for n in ran.cost.nodes] == [n.op_type for n in expected.nodes]
    assert "Relu" in {n.op_type for n in bundle.cost.nodes} and "Relu" not in {n.op_type for n in ran.cost.nodes}
    assert cost_on(bundle, host, cache).cost is ran.cost  # costed once per graph and thread count
