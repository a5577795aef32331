"""``edgekit fleet report|status`` per model (issue 20): table, --json and --csv from a store filled through the
collector's parser with windows of agents serving two models, and of one agent naming none."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path

import pytest
from edgekit_runtime.agent.telemetry import encode_message

from edgekit.cli.main import main
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import TelemetryWindow, open_store
from tests.fleet.messages import telemetry
from tests.fleet.model_messages import model_entry, model_telemetry


def _store(message: dict) -> TelemetryWindow:
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.now(dt.timezone.utc))  # fmt: skip
    assert isinstance(record, TelemetryWindow)
    return record


@pytest.fixture
def models_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=20)
    windows = []
    for device in ("cam-1", "cam-2"):
        for seq in range(1, 11):
            at = start + dt.timedelta(seconds=10 * seq)
            entries = [model_entry("detector", "yolo-int8-1", [9.0] * 4),
                       model_entry("classifier", "mobilenet-2" if device == "cam-1" else "mobilenet-1", [2.0] * 2, errors=1)]  # fmt: skip
            windows.append(_store(model_telemetry(seq, entries, device=device, start=at)))
    windows.append(_store(telemetry(1, device="old-1", start=start)))
    with open_store(url) as store:
        store.add_windows(windows)
    return url


def test_report_json_and_table_break_down_by_model(models_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "report", "--store", models_store, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(m["model"], m["bundle_id"]): m for m in report["models"]}
    assert set(rows) == {("classifier", "mobilenet-1"), ("classifier", "mobilenet-2"), ("detector", "yolo-int8-1"),
                         (None, "minilm-int8-a")}  # fmt: skip
    detector = rows[("detector", "yolo-int8-1")]
    assert (detector["devices"], detector["windows"], detector["inferences"], detector["p50_ms"]) == (2, 20, 80, 9.0)
    assert (rows[("classifier", "mobilenet-2")]["devices"], rows[("classifier", "mobilenet-2")]["errors"]) == (1, 10)
    # the default table shows the by-model table after the by-bundle one
    assert main(["fleet", "report", "--store", models_store]) == 0
    text = capsys.readouterr().out
    assert "by model and bundle" in text and "detector" in text and "mobilenet-2" in text
    # one model
    assert main(["fleet", "report", "--store", models_store, "--model", "classifier", "--by-model", "--csv"]) == 0
    found = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["model"], r["bundle_id"], r["devices"], r["inferences"], r["errors"]) for r in found] == [
        ("classifier", "mobilenet-1", "1", "20", "10"), ("classifier", "mobilenet-2", "1", "20", "10")]


def test_status_by_model_lists_each_device_and_model(models_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "status", "--store", models_store, "--by-model", "--csv"]) == 0
    found = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["device"], r["model"], r["bundle_id"], r["windows"]) for r in found] == [
        ("cam-1", "classifier", "mobilenet-2", "10"), ("cam-1", "detector", "yolo-int8-1", "10"),
        ("cam-2", "classifier", "mobilenet-1", "10"), ("cam-2", "detector", "yolo-int8-1", "10"),
        ("old-1", "", "minilm-int8-a", "1")]  # fmt: skip  (an agent naming no model: an empty model field)
    assert main(["fleet", "status", "--store", models_store, "--by-model", "--json", "--model", "detector"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [(m["device"], m["inferences"], m["throughput_per_s"]) for m in payload["models"]] == [
        ("cam-1", 40, pytest.approx(0.4)), ("cam-2", 40, pytest.approx(0.4))]  # fmt: skip
    assert main(["fleet", "status", "--store", models_store, "--by-model"]) == 0
    text = capsys.readouterr().out
    assert "by device and model" in text and "classifier" in text and "cam-2" in text


def test_report_model_table_says_when_devices_are_simulated(models_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    from edgekit.fleet.store.base import DeviceStatus

    with open_store(models_store) as store:  # cam-1's last status came from the simulator (agent version sim-*)
        store.upsert_status(DeviceStatus("lab", "cam-1", "online", "yolo-int8-1", None, "sim-1", dt.datetime.now(dt.timezone.utc)))
    assert main(["fleet", "report", "--store", models_store]) == 0
    text = capsys.readouterr().out
    model_title = " ".join(text[text.index("by model and bundle"):].split("┏")[0].split())
    assert model_title.endswith("; 1 simulated: their numbers are SYNTHETIC")  # the table after the by-bundle one
    header = next(line for line in text[text.index("by model and bundle"):].splitlines() if "┃" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")][6:10] == ["mean p50 ms", "mean p99 ms", "max p99 ms",
                                                                             "inf/s per device"]  # fmt: skip
