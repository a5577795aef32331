"""Energy per inference is per SAMPLE: a batch-64 call's energy is not labelled "mJ / inference" (issue 31 item 4)."""

from __future__ import annotations

import json

import onnx
import pytest

from edgekit.cli.main import main
from edgekit.estimate import estimate
from edgekit.report.estimate_section import estimate_section
from edgekit.target import get_target
from tests.estimate.graphs import cnn


def test_energy_per_inference_is_the_batch_call_energy_divided_by_its_samples() -> None:
    target = get_target("jetson-orin-nano-8gb")
    one = estimate(cnn(), target, dims={"batch": 1})
    sixty_four = estimate(cnn(), target, dims={"batch": 64})
    for e in sixty_four.energy:
        assert e.batch == 64
        assert e.energy_per_inference_mj == pytest.approx(e.energy_per_call_mj / 64)
    e15 = next(e for e in sixty_four.energy if e.power_mode == "15W")
    # power x time of one call / samples = watts / throughput: the energy a sample costs
    assert e15.energy_per_inference_mj == pytest.approx(e15.watts * sixty_four.calibration["power_fraction"] * 1e3 / sixty_four.throughput_per_s)
    # a batched call amortises the per-node overhead, so a sample costs no more than at batch 1
    assert e15.energy_per_inference_mj <= next(e for e in one.energy if e.power_mode == "15W").energy_per_inference_mj


def test_cli_json_and_table_say_per_sample_and_per_call(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per table row, so the labels are not wrapped
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), str(path))
    assert main(["estimate", str(path), "--target", "jetson-orin-nano-8gb", "--shape", "batch=64", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out.strip().splitlines()[-1])
    table = " ".join((captured.err + captured.out).split())  # with --json the human table goes to stderr
    row = next(e for e in doc["energy"] if e["power_mode"] == "15W")
    assert row["batch"] == 64
    assert row["energy_per_inference_mj"] == pytest.approx(row["energy_per_call_mj"] / 64)
    assert "mJ / call" in table and "mJ / inference" in table and "one call = batch 64" in table
    assert any("/ 64 samples" in f for f in doc["factors"])


def test_report_energy_cells_are_per_sample_and_name_the_call() -> None:
    result = estimate(cnn(), get_target("jetson-orin-nano-8gb"), dims={"batch": 64})
    cells = estimate_section(result)["energy"]
    e15 = next(e for e in result.energy if e.power_mode == "15W")
    mode, _, _, text = next(c for c in cells if c[0] == "15W")
    assert text.startswith(f"{e15.energy_per_inference_mj:.3g} mJ per sample")
    assert f"{e15.energy_per_call_mj:.3g} mJ per batch-64 call" in text
