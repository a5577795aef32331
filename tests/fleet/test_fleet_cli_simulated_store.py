"""``edgekit fleet status|report`` on a store seeded by the simulator (``seed_history``, the collector's write
path): the ``--by-model`` table is a page of the worst rows, fleet-wide latency is labelled as the mean of window
percentiles it is, simulated devices are named in every title and JSON document, an empty ``--state`` says which
state, and ``--csv`` cannot write control characters to the terminal."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.fleet.sim.seed import seed_history
from edgekit.fleet.store import open_store

DEVICES = 300  # x 2 bundles (every device upgrades 70% of the way through): 600 rows by device and model
ROWS = 2 * DEVICES
SYNTHETIC = f"; {DEVICES} simulated: their numbers are SYNTHETIC"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('seeded') / 'fleet.db'}"
    with open_store(url) as store:
        seed_history(store, devices=DEVICES, hours=0.5, window_s=300.0, seed=1)
    return url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["fleet", *argv]) == 0
    return capsys.readouterr().out


def _flat(text: str) -> str:
    return " ".join(text.split())


def _table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def test_status_by_model_table_is_the_limit_rows_of_highest_mean_p99(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    every = json.loads(_run(capsys, "status", "--store", seeded, "--by-model", "--json"))["models"]
    assert len(every) == ROWS  # --json lists every row
    worst = sorted(every, key=lambda row: -row["p99_ms"])[:5]
    text = _run(capsys, "status", "--store", seeded, "--by-model", "--limit", "5")
    assert f": {ROWS} rows; the 5 worst (highest mean p99) shown (--limit 0 for all){SYNTHETIC}" in _flat(text)
    rows = _table_rows(text)
    assert [(row[0], row[2], row[7]) for row in rows] == [(w["device"], w["bundle_id"], f"{w['p99_ms']:.2f}") for w in worst]
    assert _run(capsys, "status", "--store", seeded, "--by-model", "--limit", "5") == text  # the same page every run


def test_status_by_model_prints_plain_columns_above_the_rich_table_rows(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _run(capsys, "status", "--store", seeded, "--by-model", "--limit", "0").splitlines()
    assert lines[0].endswith(f": {ROWS} rows{SYNTHETIC}") and "worst" not in lines[0]
    assert lines[1].split() == ["device", "model", "bundle", "windows", "inferences", "errors", "mean", "p50", "ms", "mean",
                                "p99", "ms", "inf/s", "MB"]  # fmt: skip
    assert len(lines) == 2 + ROWS and not any("│" in line for line in lines)


def test_status_by_model_refuses_a_negative_limit(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "status", "--store", seeded, "--by-model", "--limit", "-5"]) == 2
    captured = capsys.readouterr()
    assert "error: --limit must be a whole number from 0 to 2**62, got -5" in captured.err and captured.out == ""


def test_fleet_wide_latency_is_labelled_as_the_mean_of_window_percentiles(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = _run(capsys, "report", "--store", seeded, "--since", "1h")
    header = next(line for line in report.splitlines() if "bundle" in line and "┃" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")][7:10] == ["mean p50 ms", "mean p99 ms", "max p99 ms"]
    by_model = _run(capsys, "report", "--store", seeded, "--since", "1h", "--by-model")
    header = next(line for line in by_model.splitlines() if "model" in line and "┃" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")][6:10] == ["mean p50 ms", "mean p99 ms", "max p99 ms",
                                                                             "inf/s per device"]  # fmt: skip
    with pytest.raises(SystemExit):
        main(["fleet", "report", "--help"])
    assert "the mean of the windows' p50 and p99 (weighted by inferences)" in _flat(capsys.readouterr().out)


def test_by_model_tables_and_json_say_the_devices_are_simulated(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert SYNTHETIC in _flat(_run(capsys, "status", "--store", seeded, "--by-model"))
    by_model = _flat(_run(capsys, "report", "--store", seeded, "--since", "1h", "--by-model"))
    assert "by model and bundle since" in by_model and SYNTHETIC in by_model
    assert json.loads(_run(capsys, "status", "--store", seeded, "--json"))["simulated_devices"] == DEVICES
    assert json.loads(_run(capsys, "report", "--store", seeded, "--json"))["simulated_devices"] == DEVICES
    assert json.loads(_run(capsys, "status", "--store", seeded, "--by-model", "--json"))["simulated_devices"] == DEVICES
    assert json.loads(_run(capsys, "status", "--store", seeded, "--json", "--fleet", "sim", "--state", "offline")) == {
        "devices": [], "simulated_devices": DEVICES}  # fmt: skip


def test_status_of_a_state_no_device_is_in_names_the_state(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "status", "--store", seeded, "--state", "offline"]) == 0
    assert _flat(capsys.readouterr().err) == f"no offline devices ({DEVICES} online, 0 stale, 0 offline)"
    assert main(["fleet", "status", "--store", seeded, "--state", "stale", "--fleet", "sim"]) == 0
    assert _flat(capsys.readouterr().err) == f"no stale devices ({DEVICES} online, 0 stale, 0 offline) in fleet sim"


def test_csv_writes_control_characters_as_escapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    with open_store(url) as store:
        seed_history(store, devices=2, hours=0.5, window_s=300.0, bundles=("red\x1b[31m", "plain-v2"))
    for argv in (("status", "--csv"), ("report", "--since", "1h", "--csv"), ("report", "--since", "1h", "--by-model", "--csv"),
                 ("status", "--by-model", "--csv")):  # fmt: skip
        out = _run(capsys, *argv, "--store", url)
        assert "\x1b" not in out, argv
        rows = list(csv.DictReader(io.StringIO(out)))
        bundles = {row["bundle_id"] for row in rows}
        assert bundles <= {"red\\x1b[31m", "plain-v2"} and "plain-v2" in bundles, (argv, bundles)  # ordinary text unchanged
        if argv[0] == "report" or "--by-model" in argv:
            assert "red\\x1b[31m" in bundles, argv
