"""``edgekit sweep`` for a device other than this host adds the estimate on the device to each built variant."""

from __future__ import annotations

import json

from edgekit.cli.main import main
from edgekit.cli.sweep import CSV_COLUMNS
from tests.test_sweep import CALIBRATED


def test_sweep_for_a_jetson_has_estimated_columns(tiny_recipe, tmp_path, capsys) -> None:
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    out = tmp_path / "nano"
    assert main(["sweep", str(recipe), "--target", "jetson-orin-nano-8gb", "--out", str(out), "--iterations", "3"]) == 0
    table = capsys.readouterr().out
    rows = {row["variant"]: row for row in json.loads((out / "sweep.json").read_text())["variants"]}
    built = [row for row in rows.values() if row["status"] == "built"]
    assert {"fp32", "int8"} <= {row["variant"] for row in built}
    for row in built:
        assert row["estimate_p50_ms"] > 0 and row["estimate_throughput_per_s"] > 0
        assert row["estimate_power_mode"] == "15W" and row["estimate_energy_mj"] > 0
    # int8 is timed at the int8 peak: not slower than fp32 on the device (the host's timing says nothing about that)
    assert rows["int8"]["estimate_p50_ms"] <= rows["fp32"]["estimate_p50_ms"]
    assert "estimate p50 ms on jetson-orin-nano-8gb" in table
    fp32_line = next(line for line in table.splitlines() if line.strip("│┃ ").startswith("fp32 "))
    assert f"{rows['fp32']['estimate_p50_ms']:.2f}" in fp32_line
    assert {"estimate_p50_ms", "estimate_throughput_per_s", "estimate_energy_mj", "estimate_power_mode"} <= set(CSV_COLUMNS)
