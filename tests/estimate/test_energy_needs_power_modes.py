"""``edgekit estimate`` and the report's estimate section say why there is no energy for a target without
``power_modes`` (review: x86-64-cpu, raspberry-pi-5, arm64-cpu and qualcomm-qcs6490 printed no energy and no reason)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.cli.main import main
from edgekit.estimate.estimate import estimate
from edgekit.report.estimate_section import estimate_section
from edgekit.target import default_registry, get_target

NO_ENERGY = "not estimated: energy needs power_modes (mode name: watts) in the target profile, and {} has none"
WITHOUT_POWER_MODES = ["arm64-cpu", "qualcomm-qcs6490", "raspberry-pi-5", "x86-64-cpu"]


def _model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_targets_without_power_modes_are_the_ones_the_review_named() -> None:
    assert [t.name for t in default_registry().all() if not t.power_modes] == WITHOUT_POWER_MODES


@pytest.mark.parametrize("name", ["raspberry-pi-5", "qualcomm-qcs6490"])
def test_the_cli_says_energy_needs_power_modes(name: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["estimate", str(_model(tmp_path / "relu.onnx")), "--target", name]) == 0
    out = capsys.readouterr().out
    assert f"  energy          {NO_ENERGY.format(name)}\n" in out
    assert "energy per inference (one sample)" not in out


def test_the_cli_prints_the_energy_table_and_no_excuse_with_power_modes(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["estimate", str(_model(tmp_path / "relu.onnx")), "--target", "jetson-orin-nano-8gb"]) == 0
    out = capsys.readouterr().out
    assert "energy per inference (one sample)" in out and "not estimated" not in out


def test_the_report_section_says_so_too(tmp_path: Path) -> None:
    model = onnx.load(str(_model(tmp_path / "relu.onnx")))
    section = estimate_section(estimate(model, get_target("raspberry-pi-5")))
    assert section["energy"] == []
    assert ("energy (estimate)", NO_ENERGY.format("raspberry-pi-5")) in section["facts"]
    section = estimate_section(estimate(model, get_target("jetson-orin-nano-8gb")))
    assert section["energy"] and not [fact for fact in section["facts"] if fact[0] == "energy (estimate)"]


def test_the_json_says_so_too(tmp_path: Path, capsys) -> None:
    import json

    assert main(["estimate", str(_model(tmp_path / "relu.onnx")), "--target", "x86-64-cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["energy"] == [] and doc["energy_note"] == NO_ENERGY.format("x86-64-cpu")
    assert main(["estimate", str(_model(tmp_path / "relu.onnx")), "--target", "jetson-orin-nano-8gb", "--json"]) == 0
    assert "energy_note" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
