"""Calibration against a simulated fleet whose devices follow known ground-truth factors, in a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from edgekit.cli.main import main
from edgekit.estimate import estimate, graph_costs
from edgekit.estimate.fleet_fit import KnownBundle, calibrate, find_bundles, observations_from_store
from edgekit.estimate.ground_truth import seed_ground_truth, true_latency_ms
from edgekit.estimate.graph_cost import EstimateError
from edgekit.estimate.roofline import Factors, default_factors
from edgekit.fleet.store import open_store
from edgekit.target import get_target
from tests.estimate.graphs import cnn, conv_net, mlp

TRUTH = Factors({"conv": 0.12, "matmul": 0.85, "attention": 0.3, "elementwise": 0.9, "normalization": 0.08, "pooling": 0.3,
                 "resize": 0.2, "data_movement": 0.4, "quantize": 0.4}, 25.0, 0.6, "ground truth")  # fmt: skip
GRAPHS = {"cnn16-b32": (cnn(16), 32), "conv64-b16": (conv_net(64, 56), 16), "conv128-b8": (conv_net(128, 28), 8), "mlp512-b64": (mlp(512, 2, 512), 64),
          "mlp2048-b128": (mlp(2048, 3, 2048), 128), "mlp1024-b16": (mlp(1024, 4, 256), 16)}  # fmt: skip


def write_bundles(root: Path) -> Path:
    """Bundle folders as `edgekit build` lays them out (manifest.json with name, model and benchmark shape; model.onnx)."""
    for name, (model, batch) in GRAPHS.items():
        folder = root / name
        folder.mkdir(parents=True)
        onnx.save(model, str(folder / "model.onnx"))
        manifest = {"schema_version": 1, "name": name, "precision": "fp32", "model": {"path": "model.onnx"},
                    "benchmark": {"batch": batch, "shape": {"batch": batch}, "p50_ms": 1.0}}  # fmt: skip
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture()
def fleet(tmp_path: Path) -> tuple[str, Path]:
    bundles_dir = write_bundles(tmp_path / "bundles")
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    bundles = find_bundles([bundles_dir])
    with open_store(url) as store:
        for target in ("jetson-orin-nano-8gb", "jetson-agx-orin-64gb"):
            seed_ground_truth(store, get_target(target), bundles, TRUTH, devices=3, hours=0.5)
    return url, bundles_dir


def test_calibration_halves_the_error_against_a_ground_truth_fleet(fleet: tuple[str, Path]) -> None:
    url, bundles_dir = fleet
    bundles = find_bundles([bundles_dir])
    with open_store(url, must_exist=True) as store:
        observations = observations_from_store(store, bundles)
    assert set(observations) == {("jetson-orin-nano-8gb", None), ("jetson-agx-orin-64gb", None)}
    assert all(len(rows) == len(GRAPHS) for rows in observations.values())
    for result in calibrate(observations):
        entry = result.entry
        assert entry.error_before_pct > 30.0  # the priors are far from this fleet's truth
        assert entry.error_after_pct <= entry.error_before_pct / 2
        assert "one efficiency per op class" in entry.factors.source  # leave-one-out picked the per-class fit
        assert result.loo_error_pct is not None and result.loo_error_pct <= entry.error_before_pct / 2
        # the classes these graphs spend their time in come back near the truth (the simulator's load slowdown,
        # about x1.17 on average, and per-unit speed spread are folded in, as a real fleet's would be)
        assert entry.factors.efficiency["conv"] == pytest.approx(TRUTH.efficiency["conv"] / 1.17, rel=0.25)
        assert entry.factors.efficiency["matmul"] == pytest.approx(TRUTH.efficiency["matmul"] / 1.17, rel=0.25)


def test_fleet_calibrate_cli_writes_the_file_later_estimates_use(fleet: tuple[str, Path], tmp_path: Path, capsys) -> None:
    url, bundles_dir = fleet
    out = tmp_path / "calibration.json"
    assert main(["fleet", "calibrate", "--store", url, "--bundles", str(bundles_dir), "--out", str(out), "--json", "--allow-synthetic"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert {t["target"] for t in report["targets"]} == {"jetson-orin-nano-8gb", "jetson-agx-orin-64gb"}
    assert all(t["error_after_pct"] <= t["error_before_pct"] / 2 for t in report["targets"])
    assert "reads it" in captured.err  # the human summary moves to stderr under --json
    target = get_target("jetson-orin-nano-8gb")
    held_out = conv_net(96, 40)  # a graph the fleet never ran
    truth = true_latency_ms(KnownBundle(("held-out",), None, graph_costs(held_out, {"batch": 8})), target, TRUTH)  # type: ignore[arg-type]
    truth *= 1.17  # the simulator's mean load slowdown, which the fleet's p50 includes
    before = estimate(held_out, target, dims={"batch": 8}, calibration={"kind": "none", "entries": []})
    after = estimate(held_out, target, dims={"batch": 8}, calibration=out)
    assert after.calibration["calibrated"] and not before.calibration["calibrated"]
    assert abs(after.p50_ms / truth - 1) < abs(before.p50_ms / truth - 1) / 2
    # a second run updates its entries in place
    assert main(["fleet", "calibrate", "--store", url, "--bundles", str(bundles_dir), "--out", str(out), "--allow-synthetic"]) == 0
    assert len(json.loads(out.read_text())["entries"]) == 2


def test_fleet_calibrate_without_matching_bundles_says_which_ids_it_knew(fleet: tuple[str, Path], tmp_path: Path, capsys) -> None:
    url, _ = fleet
    other = tmp_path / "other"
    (other / "unknown-bundle").mkdir(parents=True)
    onnx.save(cnn(), str(other / "unknown-bundle" / "model.onnx"))
    (other / "unknown-bundle" / "manifest.json").write_text(json.dumps({"name": "unknown-bundle", "model": {"path": "model.onnx"}}))
    assert main(["fleet", "calibrate", "--store", url, "--bundles", str(other), "--out", str(tmp_path / "c.json")]) == 2
    assert "no telemetry of the bundles given (unknown-bundle)" in capsys.readouterr().err
    assert main(["fleet", "calibrate", "--store", url, "--bundles", str(other), "--fleet", "typo"]) == 2  # no such fleet
    assert "--fleet 'typo': no device in" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(EstimateError, match="not a directory"):
        find_bundles([tmp_path / "missing"])


def test_calibration_of_the_host_target_from_its_measured_peak(tmp_path: Path) -> None:
    """x86-64-cpu has no vendor figures: its roofline uses this host's measured (cached) peak, in the ground truth too."""
    from edgekit.estimate.host_peak import measure_host_peak

    target = get_target("x86-64-cpu")
    peak = measure_host_peak(target.cpu.cores)
    bundles = find_bundles([write_bundles(tmp_path / "bundles")])
    url = f"sqlite:///{tmp_path / 'host.db'}"
    with open_store(url) as store:
        seed_ground_truth(store, target, bundles, TRUTH, devices=2, hours=0.5, measured_peak=peak)
        observations = observations_from_store(store, bundles)
    assert set(observations) == {("x86-64-cpu", None)}
    (result,) = calibrate(observations)
    assert result.entry.error_after_pct <= result.entry.error_before_pct / 2
    assert result.entry.factors.power_fraction <= 1.0


def test_calibration_is_per_power_mode_when_devices_report_their_mode(tmp_path: Path) -> None:
    bundles = find_bundles([write_bundles(tmp_path / "bundles")])
    target = get_target("jetson-orin-nano-8gb")
    slower = Factors({k: v * 0.6 for k, v in TRUTH.efficiency.items()}, 40.0, 0.6, "ground truth at 7W")
    url = f"sqlite:///{tmp_path / 'modes.db'}"
    with open_store(url) as store:
        seed_ground_truth(store, target, bundles, TRUTH, devices=2, hours=0.5, fleet="fast", power_mode="15W")
        seed_ground_truth(store, target, bundles, slower, devices=2, hours=0.5, fleet="slow", power_mode="7W")
        observations = observations_from_store(store, bundles)
    assert set(observations) == {("jetson-orin-nano-8gb", "15W"), ("jetson-orin-nano-8gb", "7W")}
    results = {r.entry.power_mode: r.entry for r in calibrate(observations)}
    assert all(e.error_after_pct <= e.error_before_pct / 2 for e in results.values())
    assert results["7W"].factors.efficiency["matmul"] < results["15W"].factors.efficiency["matmul"]
    out = tmp_path / "cal.json"
    from edgekit.estimate.calibration import write_calibration

    write_calibration(out, list(results.values()))
    held_out = conv_net(96, 40)
    for mode, truth in (("15W", TRUTH), ("7W", slower)):
        expected = true_latency_ms(KnownBundle(("h",), None, graph_costs(held_out, {"batch": 8})), target, truth, power_mode=mode) * 1.17  # type: ignore[arg-type]
        got = estimate(held_out, target, dims={"batch": 8}, power_mode=mode, calibration=out)
        assert got.calibration["calibrated"] and got.p50_ms == pytest.approx(expected, rel=0.25)
