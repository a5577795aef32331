"""Filter values no device ever reported (a typo, the wrong store) are errors that list what the store knows, in
``fleet report|status`` and the dashboard API; a known value with no telemetry in the time range is not."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from edgekit.cli import options
from edgekit.cli.main import main
from edgekit.fleet.errors import StoreError
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.report import UnknownFilterValueError, check_filter_values
from edgekit.fleet.rollout_state import RolloutRecord
from edgekit.fleet.store import FleetStore, TelemetryWindow, open_store
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import BUNDLE_A, BUNDLE_B, T0, window
from tests.fleet.model_messages import model_entry, model_telemetry

SINCE = "2026-02-01T00:00:00Z"


def _model_window(seq: int, device: str) -> TelemetryWindow:
    message = model_telemetry(seq, [model_entry("detector", "yolo-int8-1", [9.0] * 4)], device=device, fleet="cams")
    record = parse_message(f"edgekit/v1/cams/{device}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"]))  # fmt: skip
    assert isinstance(record, TelemetryWindow)
    return record


def _fill(store: FleetStore) -> None:
    """lab: nano-1 (A then B, jetson-orin-nano), agx-1 (status only, jetson-agx-orin); cams: cam-1 serving a model;
    edge: a device known only from an event; a rollout of a bundle no window ran."""
    store.set_device_target("lab", "nano-1", "jetson-orin-nano")  # first, as agents report it on connecting
    store.add_windows([window(seq, device="nano-1", bundle=BUNDLE_A if seq < 5 else BUNDLE_B) for seq in range(1, 9)])
    store.add_windows([_model_window(seq, "cam-1") for seq in range(1, 4)])
    store.upsert_status(DeviceStatus("lab", "agx-1", "online", "status-only-bundle", "jetson-agx-orin", "0.1.0", T0))
    store.add_events([DeviceEvent("edge", "pi-1", "e1", "boot", "info", "started", T0)])
    store.save_rollout(RolloutRecord("r1", "lab", "rolled-bundle", "file:///b.tar", "0" * 64, "completed", ("agx-1",),
                                     ("agx-1",), T0, T0).to_json())  # fmt: skip


def test_known_values_come_from_every_table_and_survive_retention(store: FleetStore) -> None:
    _fill(store)
    expected = {
        "fleet": ["cams", "edge", "lab"],
        "device": ["agx-1", "cam-1", "nano-1", "pi-1"],
        "bundle_id": sorted([BUNDLE_A.id, BUNDLE_B.id, "rolled-bundle", "status-only-bundle", "yolo-int8-1"]),
        "target": ["jetson-agx-orin", "jetson-orin-nano"],
        "model": ["detector"],
    }
    assert {key: store.known_values(key) for key in expected} == expected
    assert store.known_values("device", fleet="lab") == ["agx-1", "nano-1"]
    assert store.known_values("bundle_id", fleet="cams") == ["yolo-int8-1"]
    assert store.known_values("model", fleet="nowhere") == []
    store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=T0 + dt.timedelta(hours=2))
    assert list(store.windows()) == []  # all rolled up: the values stay known from the rollups
    assert store.known_values("bundle_id", fleet="lab")[:2] == [BUNDLE_A.id, BUNDLE_B.id]
    assert store.known_values("model") == ["detector"]
    with pytest.raises(StoreError, match="no known values of 'power'") as info:
        store.known_values("power")
    assert "fleet" in (info.value.hint or "")


def test_check_names_the_option_the_value_and_what_the_store_knows(store: FleetStore) -> None:
    _fill(store)
    check_filter_values(store, {"--fleet": ("fleet", "lab"), "--target": ("target", None)})
    with pytest.raises(UnknownFilterValueError, match=r"--target 'jetson-nano': no device in .* has ever reported this target") as info:
        check_filter_values(store, {"--fleet": ("fleet", "lab"), "--target": ("target", "jetson-nano")})
    assert info.value.hint == f"{store.url} knows jetson-agx-orin, jetson-orin-nano; check the spelling and the store"
    for number in range(12):
        store.set_device_target("many", f"d{number}", f"target-{number:02d}")
    with pytest.raises(UnknownFilterValueError) as info:
        check_filter_values(store, {"--target": ("target", "x")})
    assert "jetson-agx-orin, jetson-orin-nano, target-00, target-01, target-02, target-03, target-04, target-05 " \
           "(and 6 more)" in (info.value.hint or "")  # fmt: skip


@pytest.fixture
def filled(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        _fill(store)
    return url


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options.console, "width", 200)
    monkeypatch.setenv("COLUMNS", "200")


@pytest.mark.parametrize(("option", "value", "known"), [
    ("--target", "jetson-nano", "jetson-agx-orin, jetson-orin-nano"),
    ("--bundle", "minilm-int8-c", "minilm-int8-a, minilm-int8-b, rolled-bundle, status-only-bundle, yolo-int8-1"),
    ("--fleet", "labs", "cams, edge, lab"),
    ("--model", "detecter", "detector"),
])  # fmt: skip
def test_report_with_a_value_never_reported_exits_2(filled: str, option: str, value: str, known: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for output in ([], ["--json"], ["--csv"]):
        assert main(["fleet", "report", "--store", filled, "--since", SINCE, option, value, *output]) == 2
        captured = capsys.readouterr()
        error = " ".join(captured.err.split())
        assert f"error: {option} '{value}': no device in {filled} has ever reported" in error, error
        assert f"knows {known}; check the spelling" in error and captured.out == ""


def test_known_values_without_telemetry_in_the_range_are_not_errors(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the default --since 24h holds none of the 2026-03-01 windows; agx-1's target never had any
    for option, value in (("--target", "jetson-orin-nano"), ("--bundle", BUNDLE_A.id), ("--fleet", "edge"),
                          ("--target", "jetson-agx-orin")):  # fmt: skip
        assert main(["fleet", "report", "--store", filled, option, value]) == 0
        assert "no telemetry in" in capsys.readouterr().err
    assert main(["fleet", "report", "--store", filled, "--model", "detector", "--by-model"]) == 0
    assert "no telemetry in" in capsys.readouterr().err
    assert main(["fleet", "report", "--store", filled, "--since", SINCE, "--target", "jetson-orin-nano", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {g["bundle_id"] for g in report["groups"]} == {BUNDLE_A.id, BUNDLE_B.id}


def test_status_filters_never_reported_exit_2(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "status", "--store", filled, "--fleet", "labs", "--json"]) == 2
    assert "--fleet 'labs': no device in" in " ".join(capsys.readouterr().err.split())
    assert main(["fleet", "status", "--store", filled, "--by-model", "--model", "detecter"]) == 2
    assert "hint: " in capsys.readouterr().err
    assert main(["fleet", "status", "--store", filled, "--fleet", "edge", "--json"]) == 0  # known from an event only
    assert json.loads(capsys.readouterr().out)["devices"] == []
    assert main(["fleet", "status", "--store", filled, "--by-model", "--model", "detector"]) == 0  # known, too old
    assert "no telemetry in" in capsys.readouterr().err


@pytest.fixture
def dashboard(filled: str) -> Iterator[str]:
    from edgekit.fleet.dashboard.app import DashboardServer

    with DashboardServer(filled, port=0, cache_s=0) as server:
        yield server.url


def _get(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(("path", "message"), [
    ("api/overview?fleet=labs", "query fleet 'labs': no device in"),
    ("api/fleet-series?fleet=labs&by=target", "knows cams, edge, lab; check the spelling"),
    ("api/series?fleet=lab&device=nano-9", "query device 'nano-9': no device in"),
    ("api/series?fleet=lab&device=cam-1", "fleet 'lab' knows agx-1, nano-1"),
])  # fmt: skip
def test_dashboard_answers_404_for_values_never_reported(dashboard: str, path: str, message: str) -> None:
    status, body = _get(dashboard + path)
    assert status == 404 and message in body["error"], body


def test_dashboard_serves_known_values_without_data(dashboard: str) -> None:
    status, body = _get(dashboard + "api/overview?fleet=edge")
    assert status == 200 and body["counts"]["devices"] == 0  # edge: known from an event, no status or telemetry
    status, body = _get(dashboard + "api/devices?fleet=edge")
    assert status == 200 and body["devices"] == [] and body["total"] == 0
    status, body = _get(dashboard + "api/series?" + urllib.parse.urlencode({"fleet": "lab", "device": "agx-1"}))
    assert status == 200
