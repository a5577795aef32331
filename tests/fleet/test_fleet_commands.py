"""``edgekit fleet collect|status|report``: JSON output, the rollout comparison, and errors users see."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from edgekit.cli import fleet as fleet_cli
from edgekit.cli import options
from edgekit.cli.main import build_parser, main
from edgekit.fleet.report import build_report, parse_since
from edgekit.fleet.errors import FleetError
from edgekit.fleet.store import open_store
from edgekit.fleet.store.base import DeviceStatus
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import BUNDLE_A, BUNDLE_B, T0, Publisher, status, telemetry, topic, window
from tests.fleet.prometheus_text import parse_exposition
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
SINCE = "2026-02-01T00:00:00Z"


@pytest.fixture
def seeded(tmp_path: Path) -> str:
    """Four devices: nano-1 and nano-2 roll from A to B after 10 windows (B is faster and leaner), agx-1 does
    too, nano-3 stays on A. All on fleet "lab"."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        for device in ("nano-1", "nano-2", "nano-3"):  # targets first, as agents report them on connecting
            store.set_device_target("lab", device, "jetson-orin-nano")
        store.set_device_target("lab", "agx-1", "jetson-agx-orin")
        windows = []
        for device, switch_at in (("nano-1", 11), ("nano-2", 11), ("agx-1", 11), ("nano-3", None)):
            for seq in range(1, 21):
                on_b = switch_at is not None and seq >= switch_at
                windows.append(window(seq, device=device, bundle=BUNDLE_B if on_b else BUNDLE_A,
                                      latencies_ms=[2.0] * 10 if on_b else [4.0] * 10,
                                      power_mw=4000.0 if on_b else 5000.0, temperature_c=45.0 if on_b else 50.0))  # fmt: skip
        store.add_windows(windows)
        store.upsert_status(DeviceStatus("lab", "nano-1", "online", BUNDLE_B.id, None, "0.1.0", T0 + dt.timedelta(hours=1)))
        store.upsert_status(DeviceStatus("lab", "nano-3", "offline", BUNDLE_A.id, None, "0.1.0", T0 + dt.timedelta(hours=1)))
    return url


def _json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_status_json_lists_every_device(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    devices = {d["device"]: d for d in _json_out(capsys, ["fleet", "status", "--store", seeded, "--json"])["devices"]}
    assert sorted(devices) == ["agx-1", "nano-1", "nano-2", "nano-3"]
    nano_1 = devices["nano-1"]
    # its agent said online, but its newest window is from 2026-03-01: silent for far more than 10 intervals
    assert (nano_1["state"], nano_1["bundle_id"], nano_1["target"]) == ("offline", BUNDLE_B.id, "jetson-orin-nano")
    assert nano_1["interval_s"] == 10.0
    assert (nano_1["p50_ms"], nano_1["p99_ms"], nano_1["temperature_max_c"]) == (2.0, 2.0, 45.0)
    assert nano_1["power_mean_mw"] == pytest.approx(4000.0)
    assert nano_1["energy_per_inference_mj"] == pytest.approx(4000.0)  # 4 W x 10 s / 10 inferences
    assert nano_1["last_seen"] == "2026-03-01T13:00:00Z" and nano_1["windows"] == 20 and nano_1["missing_seqs"] == 0
    assert (devices["nano-3"]["state"], devices["nano-2"]["state"]) == ("offline", "offline")  # its will; silence


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as a 200-column terminal shows them (not wrapped at 80)."""
    monkeypatch.setattr(options.console, "width", 200)
    monkeypatch.setenv("COLUMNS", "200")


def test_status_table_and_fleet_filter(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_store(seeded) as store:  # nano-1 reports again, nano-2's last window is 35 s old (3.5 intervals)
        now = dt.datetime.now(dt.timezone.utc)
        store.add_windows([window(21, device="nano-1", bundle=BUNDLE_B, latencies_ms=[2.0] * 10, power_mw=4000.0,
                                  temperature_c=45.0, start=now - dt.timedelta(seconds=12)),
                           window(21, device="nano-2", bundle=BUNDLE_B, start=now - dt.timedelta(seconds=45))])  # fmt: skip
    assert main(["fleet", "status", "--store", seeded]) == 0
    table = capsys.readouterr().out
    assert "fleet lab: 4 devices" in table
    assert re.search(r"nano-1 +│ online +│ minilm-int8-b +│ jetson-orin-nano +│ +2\.00 +│ +2\.00 +│ +4\.00 ", table), table
    assert re.search(r"nano-2 +│ stale +│", table) and re.search(r"nano-3 +│ offline +│", table), table
    assert main(["fleet", "status", "--store", seeded, "--fleet", "other", "--json"]) == 2  # no such fleet (a typo?)
    assert "--fleet 'other': no device in" in " ".join(capsys.readouterr().err.split())


def _fresh_windows(url: str) -> None:
    """nano-1 reports again (online), nano-2's last window is 45 s old (stale: over 3 intervals of 10 s)."""
    with open_store(url) as store:
        now = dt.datetime.now(dt.timezone.utc)
        store.add_windows([window(22, device="nano-1", bundle=BUNDLE_B, start=now - dt.timedelta(seconds=12)),
                           window(22, device="nano-2", bundle=BUNDLE_B, start=now - dt.timedelta(seconds=55))])  # fmt: skip


def test_status_shows_the_worst_first_and_filters_by_state(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    _fresh_windows(seeded)
    assert main(["fleet", "status", "--store", seeded, "--limit", "2"]) == 0
    table = capsys.readouterr().out
    assert "fleet lab: 4 devices (1 online, 1 stale, 2 offline); the 2 worst shown (--limit 0 for all)" in table, table
    rows = [line for line in table.splitlines() if "│ offline" in line or "│ stale" in line or "│ online" in line]
    assert [row.split("│")[1].strip() for row in rows] == ["nano-3", "agx-1"]  # offline; nano-3's p99 is higher
    stale = _json_out(capsys, ["fleet", "status", "--store", seeded, "--state", "stale", "--json"])["devices"]
    assert [(d["device"], d["state"]) for d in stale] == [("nano-2", "stale")]
    assert main(["fleet", "status", "--store", seeded, "--limit", "-1"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "--limit must be a whole number from 0 to 2**62, got -1" in error and "0 shows every device" in error


def test_status_says_idle_for_an_online_device_whose_newest_window_had_no_inference(seeded: str,
                                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with open_store(seeded) as store:  # nano-1 reports again, a window without inferences (issue 32 item 3)
        start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=12)
        store.add_windows([window(22, device="nano-1", bundle=BUNDLE_B, latencies_ms=[], start=start)])
    assert main(["fleet", "status", "--store", seeded, "--limit", "0"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "nano-1" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[2] == "online" and cells[5:7] == ["idle", "idle"], row
    assert cells[7] == "5.00", row  # power in W, as on the dashboard (the window's default 5,000 mW)
    offline = next(line for line in table.splitlines() if "nano-3" in line)
    assert "idle" not in offline  # an offline device's missing latency is not called idle


def test_status_prints_plain_columns_for_a_long_table(seeded: str, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from edgekit.cli import fleet as fleet_cli

    monkeypatch.setattr(fleet_cli, "RICH_TABLE_ROWS", 2)
    _fresh_windows(seeded)
    assert main(["fleet", "status", "--store", seeded, "--limit", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fleet lab: 4 devices (1 online, 1 stale, 2 offline)"
    assert lines[1].split() == ["device", "state", "bundle", "target", "p50", "ms", "p99", "ms", "power", "W", "mJ/inf",
                                "temp", "°C", "last", "seen", "windows", "gaps"]  # fmt: skip
    assert [line.split()[:2] for line in lines[2:]] == [["nano-3", "offline"], ["agx-1", "offline"], ["nano-2", "stale"],
                                                        ["nano-1", "online"]]  # fmt: skip


def test_report_counts_devices_by_state_as_status_does(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    _fresh_windows(seeded)
    report = _json_out(capsys, ["fleet", "report", "--store", seeded, "--since", SINCE, "--json"])
    assert report["device_states"] == {"online": 1, "stale": 1, "offline": 2, "unknown": 0}
    assert main(["fleet", "report", "--store", seeded, "--since", SINCE]) == 0
    assert "devices now: 1 online, 1 stale, 2 offline" in " ".join(capsys.readouterr().out.split())


def test_report_json_compares_a_rollout_before_and_after(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_out(capsys, ["fleet", "report", "--store", seeded, "--since", SINCE, "--json"])
    groups = {(g["bundle_id"], g["target"]): g for g in report["groups"]}
    assert groups[(BUNDLE_A.id, "jetson-orin-nano")]["devices"] == 3
    assert groups[(BUNDLE_A.id, "jetson-orin-nano")]["windows"] == 10 + 10 + 20
    assert groups[(BUNDLE_B.id, "jetson-agx-orin")]["p50_ms"] == 2.0
    rollouts = {(r["from_bundle"], r["to_bundle"], r["target"]): r for r in report["rollouts"]}
    assert sorted(rollouts) == [(BUNDLE_A.id, BUNDLE_B.id, "jetson-agx-orin"), (BUNDLE_A.id, BUNDLE_B.id, "jetson-orin-nano")]
    nano = rollouts[(BUNDLE_A.id, BUNDLE_B.id, "jetson-orin-nano")]
    assert nano["devices"] == ["lab/nano-1", "lab/nano-2"]  # nano-3 never switched: not in the comparison
    assert nano["first_switch"] == "2026-03-01T12:01:40Z"
    assert (nano["before"]["windows"], nano["after"]["windows"]) == (20, 20)
    assert (nano["before"]["p50_ms"], nano["after"]["p50_ms"]) == (4.0, 2.0)
    assert nano["change"]["p50_ms"] == {"delta": -2.0, "relative": -0.5}
    assert nano["change"]["power_mean_mw"]["relative"] == pytest.approx(-0.2)
    assert nano["change"]["energy_per_inference_mj"]["relative"] == pytest.approx(-0.2)
    assert nano["change"]["temperature_max_c"]["delta"] == -5.0


def test_report_filters_by_bundle_target_and_time(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    only_agx = _json_out(capsys, ["fleet", "report", "--store", seeded, "--since", SINCE, "--target", "jetson-agx-orin",
                                  "--json"])  # fmt: skip
    assert {(g["bundle_id"], g["target"]) for g in only_agx["groups"]} == {(BUNDLE_A.id, "jetson-agx-orin"),
                                                                          (BUNDLE_B.id, "jetson-agx-orin")}  # fmt: skip
    assert [r["devices"] for r in only_agx["rollouts"]] == [["lab/agx-1"]]
    only_b = _json_out(capsys, ["fleet", "report", "--store", seeded, "--since", SINCE, "--bundle", BUNDLE_B.id, "--json"])
    assert {g["bundle_id"] for g in only_b["groups"]} == {BUNDLE_B.id} and len(only_b["rollouts"]) == 2
    recent = _json_out(capsys, ["fleet", "report", "--store", seeded, "--json"])  # default: the last 24 h (none)
    assert recent["groups"] == [] and recent["rollouts"] == []
    assert main(["fleet", "report", "--store", seeded, "--since", SINCE]) == 0
    assert "rollout minilm-int8-a -> minilm-int8-b on jetson-orin-nano: 2 devices" in capsys.readouterr().out


def test_report_after_retention_still_compares(seeded: str) -> None:
    with open_store(seeded) as store:
        before = build_report(store, since=parse_since(SINCE)).to_json()
        store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=T0 + dt.timedelta(hours=2))
        assert list(store.windows()) == []
        after = build_report(store, since=parse_since(SINCE)).to_json()
    for old, new in zip(before["rollouts"], after["rollouts"]):
        assert new["devices"] == old["devices"]
        for side in ("before", "after"):
            assert new[side]["windows"] == old[side]["windows"]
            assert new[side]["p50_ms"] == pytest.approx(old[side]["p50_ms"])
            assert new[side]["energy_per_inference_mj"] == pytest.approx(old[side]["energy_per_inference_mj"])


def test_parse_since_reads_durations_and_times() -> None:
    now = dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)
    assert parse_since("24h", now) == now - dt.timedelta(hours=24)
    assert parse_since("90s", now) == now - dt.timedelta(seconds=90)
    assert parse_since("1.5d", now) == now - dt.timedelta(hours=36)
    assert parse_since("2026-04-30T10:00:00", now) == dt.datetime(2026, 4, 30, 10, tzinfo=dt.timezone.utc)
    with pytest.raises(FleetError, match="--since 'yesterday' is neither a duration nor a time") as info:
        parse_since("yesterday", now)
    assert "24h" in (info.value.hint or "")


def test_user_errors_exit_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["fleet", "status", "--store", missing]) == 2
    assert "fleet store " + missing + " does not exist" in capsys.readouterr().err.replace("\n", "")
    assert main(["fleet", "report", "--store", "oracle://db", "--json"]) == 2
    assert "scheme 'oracle' is not one of" in capsys.readouterr().err
    assert main(["fleet", "report", "--store", missing, "--since", "soon"]) == 2
    assert "--since 'soon' is neither a duration nor a time" in capsys.readouterr().err


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_fleet_module_and_hook_adds_its_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    def add_hello(fleet_subparsers: argparse._SubParsersAction) -> None:
        fleet_subparsers.add_parser("hello").set_defaults(func=lambda args: 0)

    monkeypatch.setattr(fleet_cli, "_EXTRA_SUBCOMMANDS", {})
    fleet_cli.register_subcommand("hello", add_hello)
    fleet_commands = _subcommands(_subcommands(build_parser())["fleet"])
    assert set(fleet_commands) == {"collect", "status", "report", "up", "simulate", "dashboard", "deploy", "calibrate",
                                   "hello"}  # fmt: skip
    # each of FLEET_SUBCOMMAND_MODULES adds its own (fleet_calibrate: calibrate), in --help order after the built-in ones
    modules = [name.removeprefix("edgekit.cli.fleet_") for name in fleet_cli.FLEET_SUBCOMMAND_MODULES]
    assert list(fleet_commands)[-len(modules) - 1 : -1] == modules
    assert build_parser().parse_args(["fleet", "hello"]).fleet_command == "hello"


def test_collect_command_stores_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", store_url,
             "--fleet", "cli", "--metrics-port", "0", "--metrics-per-device", "--json"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert started["event"] == "started" and started["store"] == store_url
        with Publisher(broker) as device:
            device.publish(topic("status", fleet="cli"), status("online", fleet="cli"), retain=True)
            device.publish_many([(topic("telemetry", fleet="cli"), encode_message(telemetry(s, fleet="cli")))
                                 for s in (1, 2, 2, 4)])  # fmt: skip
            device.publish(topic("telemetry", fleet="cli"), b"{oops")
        deadline = dt.datetime.now() + dt.timedelta(seconds=3)
        families = {}
        while dt.datetime.now() < deadline:
            with urllib.request.urlopen(started["metrics_url"], timeout=5) as response:
                families = parse_exposition(response.read().decode())
            if families["edgekit_collector_records_stored_total"].value({"kind": "telemetry"}) == 3:
                break
        assert families["edgekit_device_online"].value({"fleet": "cli", "device": "dev-1"}) == 1
        process.terminate()  # SIGTERM, as systemd sends: the collector stores what it holds and exits 0
        out, err = process.communicate(timeout=20)
        assert process.returncode == 0, err
        stopped = json.loads(out.strip().splitlines()[-1])
        assert stopped["stored"] == {"status": 1, "telemetry": 3} and stopped["duplicates"]["telemetry"] == 1
        assert stopped["rejected"] == {"malformed_json": 1}
        assert "rejected a message on edgekit/v1/cli/dev-1/telemetry" in err
    finally:
        broker.stop()
    with open_store(store_url) as store:
        assert [w.seq for w in store.windows()] == [1, 2, 4]
        assert store.missing_seqs("cli", "dev-1") == [(3, 3)]
