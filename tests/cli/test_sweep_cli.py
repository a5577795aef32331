"""``edgekit sweep``'s output: the table on stdout, ``--csv`` alone on stdout, the page titled with what was swept."""

from __future__ import annotations

import csv
import io
import re

from edgekit.cli.main import main
from tests.test_sweep import CALIBRATED


def test_sweep_csv_and_table(tiny_recipe, tmp_path, capsys):
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    out = tmp_path / "sweep"
    assert main(["sweep", str(recipe), "--target", "raspberry-pi-5", "--out", str(out), "--iterations", "3", "--csv"]) == 0
    captured = capsys.readouterr()
    rows = {row["variant"]: row for row in csv.DictReader(io.StringIO(captured.out))}  # stdout holds only the CSV
    assert {"fp32", "int8"} <= set(rows) and all(row["status"] == "built" for row in rows.values()), rows
    assert int(rows["int8"]["size_bytes"]) < int(rows["fp32"]["size_bytes"]) and float(rows["fp32"]["latency_vs_fp32"]) == 1.0
    assert rows["fp32"]["reason"] == "" and "n/a" not in captured.out
    err = " ".join(captured.err.split())  # the human table moved to stderr
    assert "sweep of tiny on Raspberry Pi 5 (8GB), batch 4" in err and "n/a" not in err
    assert re.search(r"fp32 │ built │ [0-9.]+ (B|KB) │", err), err
    page = (out / "sweep.html").read_text()
    assert "<h1>Sweep of tiny on Raspberry Pi 5 (8GB), batch 4</h1>" in page and "n/a" not in page
    capsys.readouterr()
    assert main(["sweep", str(recipe), "--target", "raspberry-pi-5", "--out", str(out), "--iterations", "3", "--force"]) == 0
    table = capsys.readouterr().out  # without --csv/--json the table is the result: stdout
    assert "sweep of tiny on Raspberry Pi 5 (8GB), batch 4" in table and "int8-dynamic" in table
    # another device's bundles: the latency measured here says so, beside the estimate on the device
    assert "p50 ms on this host" in table and "estimate p50 ms on raspberry-pi-5" in table
    assert f"report: {out / 'sweep.html'}" in table
