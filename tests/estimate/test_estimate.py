from __future__ import annotations

import json

import onnx
import pytest

from edgekit.cli.main import main
from edgekit.estimate import EstimateError, estimate, graph_costs, hardware_for, write_calibration
from edgekit.estimate.calibration import CalibrationEntry
from edgekit.estimate.roofline import DEFAULT_POWER_FRACTION, Factors, default_factors
from edgekit.target import get_target
from tests.estimate.graphs import cnn, mlp


def test_orin_nano_hardware_halves_sparse_figures_and_derives_fp16_fp32() -> None:
    hw = hardware_for(get_target("jetson-orin-nano-8gb"))
    assert hw.engine == "gpu" and hw.power_mode == "15W" and hw.watts == 15
    assert hw.peak_ops["int8"] == pytest.approx(20e12)  # 40 sparse = 20 dense TOPS
    assert hw.peak_ops["fp16"] == pytest.approx(10e12)
    assert hw.peak_ops["fp32"] == pytest.approx(1024 * 2 * 625e6)  # CUDA cores x FMA x gpu.max_clock_mhz
    assert hw.bandwidth_bytes_s == pytest.approx(68e9)
    assert any("1024 CUDA cores x 2 x 625 MHz" in s for s in hw.sources) and any("sparse, counted half" in s for s in hw.sources)
    agx = hardware_for(get_target("jetson-agx-orin-64gb"))  # no clock, no FP16 figure: the Ampere ratio
    assert agx.engine == "gpu" and agx.peak_ops["fp16"] == pytest.approx(agx.peak_ops["int8"] / 2)
    assert any("fp16 derived: Ampere tensor cores" in s for s in agx.sources)


def test_orin_nx_is_timed_on_its_gpu_alone_not_the_gpu_plus_dla_total() -> None:
    target = get_target("jetson-orin-nx-16gb")
    assert target.gpu is not None and target.gpu.max_clock_mhz == 918  # the clock the published tables name
    nx = hardware_for(target, "25W")
    assert nx.engine == "gpu"  # the GPU's own figure wins over the GPU + 2 DLA total (100 sparse TOPS)
    assert nx.peak_ops["int8"] == pytest.approx(30e12)  # 60 sparse GPU TOPS counted half
    assert nx.peak_ops["fp16"] == pytest.approx(15e12)
    assert nx.peak_ops["fp32"] == pytest.approx(1024 * 2 * 918e6)  # CUDA cores x FMA x clock
    assert any("less the 2 DLAs" in s for s in nx.sources)  # the derivation is named in every estimate
    # the GPU figure agrees with the per-clock rate of the AGX Orin's GPU (170 sparse TOPS, 64 tensor cores, 1.3 GHz)
    agx_per_core_clock = 170 / 64 / 1300
    assert 60 == pytest.approx(agx_per_core_clock * 32 * 918, rel=0.01)
    dla = [p for p in target.peak_throughput if p.engine == "dla"]
    gpu = [p for p in target.peak_throughput if p.engine == "gpu"]
    total = [p for p in target.peak_throughput if p.engine == "total" and p.power_mode == "25W"]
    assert dla[0].value + gpu[0].value == total[0].value  # GPU + DLAs = the datasheet's 100 TOPS


def test_another_power_mode_scales_the_peak_by_its_watts() -> None:
    hw = hardware_for(get_target("jetson-orin-nano-8gb"), "7W")
    assert hw.peak_ops["int8"] == pytest.approx(20e12 * 7 / 15)
    assert hw.peak_ops["fp32"] == pytest.approx(1024 * 2 * 625e6 * 7 / 15)
    assert any("scaled by the watts ratio 0.47 to 7W" in s for s in hw.sources)


def test_unknown_power_mode_and_a_target_without_figures_say_how_to_fix() -> None:
    with pytest.raises(EstimateError, match="no power mode 'turbo'") as caught:
        hardware_for(get_target("jetson-orin-nano-8gb"), "turbo")
    assert "15W" in caught.value.hint
    with pytest.raises(EstimateError, match="no peak_throughput figures") as caught:
        hardware_for(get_target("x86-64-cpu"))  # described by the host it runs on: measured, never quoted
    assert "--measure-host" in caught.value.hint


def test_estimate_sums_the_roofline_and_lists_its_factors() -> None:
    target = get_target("jetson-orin-nano-8gb")
    result = estimate(cnn(), target, dims={"batch": 4}, layer_model="per-node")
    hw, factors = hardware_for(target), default_factors("gpu")
    expected = 0.0
    for node in graph_costs(cnn(), {"batch": 4}).nodes:
        if node.fused:
            continue
        roof = max(node.ops / hw.peak_for(node.precision)[0], node.bytes / hw.bandwidth_bytes_s) * 1e3
        expected += roof / factors.efficiency[node.op_class] + factors.node_overhead_us / 1e3
    assert result.p50_ms == pytest.approx(expected)
    assert result.throughput_per_s == pytest.approx(4 * 1000 / expected)
    assert result.to_json()["kind"] == "estimate" and result.factors[0].startswith("ESTIMATE")
    assert sum(row["share"] for row in result.by_class.values()) == pytest.approx(1.0)
    assert {e.power_mode for e in result.energy} == {"15W", "7W"}
    e15 = next(e for e in result.energy if e.power_mode == "15W")
    assert e15.energy_per_call_mj == pytest.approx(15 * DEFAULT_POWER_FRACTION * result.p50_ms)
    assert e15.energy_per_inference_mj == pytest.approx(e15.energy_per_call_mj / 4)  # per sample of the batch-4 call
    assert result.peak_memory_mb == pytest.approx(result.weights_mb + result.activations_mb + 400.0)


def test_a_compute_bound_graph_is_slower_in_a_lower_power_mode() -> None:
    target = get_target("jetson-orin-nano-8gb")
    big = mlp(2048, layers=3, width=2048)
    fast = estimate(big, target, dims={"batch": 256}, power_mode="15W")
    slow = estimate(big, target, dims={"batch": 256}, power_mode="7W")
    assert slow.p50_ms > 1.5 * fast.p50_ms


def test_timing_an_fp32_graph_as_int8_uses_the_int8_peak_and_quarter_bytes() -> None:
    target = get_target("jetson-orin-nano-8gb")
    fp32 = estimate(mlp(2048, 3, 2048), target, dims={"batch": 256}, layer_model="per-node")
    int8 = estimate(mlp(2048, 3, 2048), target, dims={"batch": 256}, assume_precision="int8", layer_model="per-node")
    assert int8.p50_ms < fp32.p50_ms / 4
    assert int8.weights_mb == pytest.approx(fp32.weights_mb / 4)
    assert any("timed as int8" in f for f in int8.factors)


def test_a_calibration_file_replaces_the_default_factors(tmp_path) -> None:
    target = get_target("jetson-orin-nano-8gb")
    slow = Factors({k: v / 2 for k, v in default_factors("gpu").efficiency.items()}, 16.0, 0.5, "test fit")
    path = write_calibration(tmp_path / "cal.json", [CalibrationEntry(target.name, "15W", slow, 3, 40.0, 5.0)])
    base = estimate(cnn(), target, dims={"batch": 4}, layer_model="per-node")
    fitted = estimate(cnn(), target, dims={"batch": 4}, calibration=path, layer_model="per-node")
    assert fitted.p50_ms == pytest.approx(2 * base.p50_ms)
    assert fitted.calibration["calibrated"] and fitted.calibration["file"] == str(path)
    assert any("test fit" in f for f in fitted.factors)
    other_mode = estimate(cnn(), target, dims={"batch": 4}, calibration=path, power_mode="7W")
    assert not other_mode.calibration["calibrated"]  # the entry is for 15W only


def test_a_broken_calibration_file_is_named(tmp_path) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"kind": "edgekit-estimate-calibration", "schema_version": 1,
                               "entries": [{"target": "x", "efficiency": {"conv": 3.0}}]}))  # fmt: skip
    with pytest.raises(EstimateError, match=r"entries\[0\].efficiency must map op classes to numbers in \(0, 1\]"):
        estimate(cnn(), get_target("jetson-orin-nano-8gb"), calibration=bad)


def test_cli_estimate_of_an_onnx_file(tmp_path, capsys) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), str(path))
    assert main(["estimate", str(path), "--target", "jetson-orin-nano-8gb", "--shape", "batch=8", "--json", "--nodes"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["kind"] == "estimate" and doc["batch"] == 8 and doc["dims"] == {"batch": 8}
    assert {n["name"] for n in doc["nodes"]} == {"conv", "fc"}  # the Relu is fused into the conv, the Reshape a view
    assert [e["power_mode"] for e in doc["energy"]] == ["15W", "7W"]


def test_cli_estimate_errors_name_the_problem(tmp_path, capsys) -> None:
    assert main(["estimate", str(tmp_path), "--target", "jetson-orin-nano-8gb"]) == 2
    assert "neither a bundle directory" in capsys.readouterr().err
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), str(path))
    assert main(["estimate", str(path), "--target", "no-such-target"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_host_target_is_timed_from_a_measured_peak(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path))
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), str(path))
    assert main(["estimate", str(path), "--target", "x86-64-cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["engine"] == "cpu" and doc["hardware"]["peak_ops_per_s"]["fp32"] > 1e9
    assert any("measured on this host" in f for f in doc["factors"])
    cache = json.loads((tmp_path / "host-peak.json").read_text())
    assert len(cache) == 1  # the second estimate reuses it
    assert main(["estimate", str(path), "--target", "x86-64-cpu", "--json"]) == 0
    assert len(json.loads((tmp_path / "host-peak.json").read_text())) == 1


def test_a_measured_host_times_nodes_that_fit_its_cache_at_the_cache_bandwidth() -> None:
    measured = {"peak_ops": {"fp32": 100e9, "int8": 1e12}, "bandwidth_bytes_s": 10e9, "cache_bytes": 2**20,
                "cache_bandwidth_bytes_s": 100e9, "method": "test figures"}  # fmt: skip
    target = get_target("x86-64-cpu")
    hw = hardware_for(target, measured=measured)
    assert hw.engine == "cpu" and hw.cache_bytes == 2**20 and any("in-cache bandwidth 100 GB/s" in s for s in hw.sources)
    from edgekit.estimate.roofline import roofline

    small = {n.name: n for n in roofline(graph_costs(mlp(32, 1, 32), {"batch": 4}), hw).nodes}["softmax"]
    big_cost = graph_costs(mlp(2048, 1, 2048), {"batch": 256})
    big = {n.name: n for n in roofline(big_cost, hw).nodes}["softmax"]
    softmax_bytes = {n.name: n for n in big_cost.nodes}["softmax"].bytes
    assert big.bound == "memory" and big.roofline_ms == pytest.approx(softmax_bytes / 10e9 * 1e3)  # 4 MiB: past the cache
    assert small.roofline_ms == pytest.approx(2 * 4 * 32 * 4 / 100e9 * 1e3)  # 1 KiB in, 1 KiB out, at cache speed


@pytest.mark.parametrize("name", [n for n in __import__("edgekit.target", fromlist=["default_registry"]).default_registry().names() if n != "x86-64-cpu"])
def test_every_shipped_target_gives_figures_with_their_sources(name: str) -> None:
    target = get_target(name)
    hw = hardware_for(target)
    result = estimate(cnn(), target, dims={"batch": 2})  # an FP32 graph
    assert hw.peak_ops and hw.sources and (hw.bandwidth_bytes_s or any("LOWER BOUND" in s for s in hw.sources))
    assert result.p50_ms > 0 and len(result.energy) == len(target.power_modes)


def test_a_precision_the_npu_cannot_run_goes_to_the_cpu_fallback_and_says_so() -> None:
    qcs = get_target("qualcomm-qcs6490")  # HTP v68: int8 only; no bandwidth figure
    fp32 = estimate(cnn(), qcs, dims={"batch": 2})
    assert fp32.engine == "cpu" and fp32.runtime_overhead_mb == 60.0  # every node on the CPU: its factors and memory
    assert any("run on the cpu instead (the CPU execution provider fallback)" in f for f in fp32.factors)
    assert any("Cortex-A78" in f and "derived" in f for f in fp32.factors)
    assert any("LOWER BOUND" in f for f in fp32.factors)
    int8 = estimate(cnn(), qcs, dims={"batch": 2}, assume_precision="int8")
    assert int8.engine == "total"
    intel = estimate(cnn(), get_target("intel-core-ultra-npu"), dims={"batch": 2})  # FP32 compiled to FP16 on the NPU
    assert intel.engine == "npu" and any("fp32 layers run as fp16" in f for f in intel.factors)
    assert intel.hardware["peak_ops_per_s"]["fp16"] == pytest.approx(5.5e12)


def test_thor_times_fp32_as_tf32_on_its_tensor_cores() -> None:
    hw = hardware_for(get_target("jetson-agx-thor"))
    assert hw.peak_ops["fp16"] == pytest.approx(1035e12 / 2 / 2)  # sparse FP8 counted half, FP16 at half FP8
    assert hw.peak_ops["fp32"] == pytest.approx(hw.peak_ops["fp16"] / 2)
    assert any("TF32" in s for s in hw.sources)


def test_a_derived_cpu_figure_names_its_derivation() -> None:
    hw = hardware_for(get_target("raspberry-pi-5"))
    assert hw.engine == "cpu" and hw.peak_ops["fp32"] == pytest.approx(4 * 2.4e9 * 16)
    assert hw.bandwidth_bytes_s == pytest.approx(17.1e9)
    assert any("derived: 4 Cortex-A76 cores x 2.4 GHz" in s for s in hw.sources)


def test_default_factors_cover_every_op_class() -> None:
    from edgekit.estimate.graph_cost import ALL_CLASSES
    from edgekit.estimate.roofline import DEFAULT_EFFICIENCY

    for kind, table in DEFAULT_EFFICIENCY.items():
        assert set(table) == set(ALL_CLASSES), kind
        assert all(0 < v <= 1 for v in table.values())


def test_cli_estimate_of_a_recipe_exports_it_and_uses_its_benchmark_shape(tiny_recipe, capsys) -> None:
    assert main(["estimate", str(tiny_recipe()), "--target", "jetson-orin-nano-8gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["kind"] == "estimate" and doc["source"]["name"] == "tiny"
    assert doc["dims"] == {"batch": 4} and doc["batch"] == 4  # the recipe's dims: batch opt 4
    assert doc["total_ops"] > 0 and doc["by_class"]
    assert main(["estimate", str(tiny_recipe()), "--target", "jetson-orin-nano-8gb", "--precision", "int8", "--json"]) == 0
    int8 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert int8["memory_mb"]["weights"] == pytest.approx(doc["memory_mb"]["weights"] / 4)
    assert any("timed as int8" in f for f in int8["factors"])


def test_a_measured_host_uses_its_own_per_node_overhead() -> None:
    from edgekit.estimate.host_peak import host_threads, node_overhead_us

    measured = {"peak_ops": {"fp32": 100e9, "int8": 1e12}, "bandwidth_bytes_s": 10e9, "node_overhead_us": 0.5, "method": "test figures"}
    result = estimate(cnn(), get_target("x86-64-cpu"), dims={"batch": 2}, measured_peak=measured)
    assert result.calibration["node_overhead_us"] == 0.5 and not result.calibration["calibrated"]
    assert any("per-node overhead measured on this host" in f for f in result.factors)
    overhead = node_overhead_us(1, runs=5)
    assert 0 < overhead < 1000  # microseconds per tiny node
    assert host_threads(4096) >= 1 and host_threads(1) == 1


def test_a_measured_host_computes_nodes_past_its_cache_at_the_out_of_cache_peak() -> None:
    from edgekit.estimate.roofline import roofline

    measured = {"peak_ops": {"fp32": 400e9, "int8": 1e12}, "large_peak_ops": {"fp32": 100e9, "int8": 0.5e12}, "bandwidth_bytes_s": 1e12,
                "cache_bytes": 2**20, "cache_bandwidth_bytes_s": 1e12, "method": "test figures"}  # fmt: skip
    hw = hardware_for(get_target("x86-64-cpu"), measured=measured)
    assert any("out-of-cache GEMM peak" in s for s in hw.sources)
    big_cost = graph_costs(mlp(2048, 1, 2048), {"batch": 256})  # a 16 MiB weight: past the 1 MiB "cache"
    big = {n.name: n for n in roofline(big_cost, hw).nodes}["mm0"]
    ops = {n.name: n for n in big_cost.nodes}["mm0"].ops
    assert big.bound == "compute" and big.roofline_ms == pytest.approx(ops / 100e9 * 1e3)
    small_cost = graph_costs(mlp(64, 1, 64), {"batch": 4})
    small = {n.name: n for n in roofline(small_cost, hw).nodes}["mm0"]
    assert small.roofline_ms == pytest.approx(max({n.name: n for n in small_cost.nodes}["mm0"].ops / 400e9,
                                                  {n.name: n for n in small_cost.nodes}["mm0"].bytes / 1e12) * 1e3)  # fmt: skip


def test_a_graph_without_nodes_has_no_throughput_figure_not_zero(tmp_path, capsys) -> None:
    """A passthrough graph (its input is its output, no nodes) does no work: 0 ms, and no throughput (it printed 0.0/s)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([], "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["estimate", str(path), "--target", "jetson-orin-nano-8gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "throughput no figure (the graph has no nodes to time" in out and "0.0 /s" not in out
    assert main(["estimate", str(path), "--target", "jetson-orin-nano-8gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["p50_ms"] == 0.0 and doc["throughput_per_s"] is None
