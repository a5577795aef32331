"""Seeded synthetic history (``edgekit fleet simulate --history``): the collector's write path on SQLite
and a real PostgreSQL, time step by time step in bounded batches, reproducible from ``--seed``."""

from __future__ import annotations

import argparse
import datetime as dt
import json

import pytest

from edgekit.fleet.sim.seed import SeedError, history_batches, seed_history
from edgekit.fleet.store import open_store
from edgekit.progress import StageReporter

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)


class _Notes(StageReporter):
    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


def _fleet_parser() -> argparse.ArgumentParser:
    from edgekit.cli import fleet_simulate

    parser = argparse.ArgumentParser(prog="edgekit fleet")
    subparsers = parser.add_subparsers(dest="fleet_command", required=True)
    fleet_simulate.register(subparsers)
    return parser


def test_history_is_written_time_step_by_time_step_in_bounded_batches(store) -> None:  # noqa: F811 (fixture)
    summary = seed_history(store, devices=7, hours=0.5, window_s=60.0, now=NOW, batch_windows=4)
    assert summary.windows == 7 * 30 and summary.first_window_start == NOW - dt.timedelta(minutes=30)
    windows = list(store.windows(since=NOW - dt.timedelta(hours=1)))
    assert len(windows) == 7 * 30
    by_device: dict[str, list] = {}
    for window in windows:
        by_device.setdefault(window.device, []).append(window)
    assert len(by_device) == 7
    for device_windows in by_device.values():
        device_windows.sort(key=lambda w: w.seq)
        assert [w.seq for w in device_windows] == list(range(1, 31))
        assert device_windows[-1].window_end == NOW
        assert {w.bundle_id for w in device_windows[:21]} == {"demo-v1"} and {w.bundle_id for w in device_windows[21:]} == {"demo-v2"}
    summaries = store.device_summaries()
    assert {s.device for s in summaries} == set(by_device)
    assert {s.bundle_id for s in summaries} == {"demo-v2"} and all(s.target for s in summaries)
    # batches: never more than asked, and window i of every device before window i + 1 of any
    from edgekit.fleet.sim.device import VirtualAgent
    from edgekit.fleet.sim.profiles import profiles_for

    profile = profiles_for(["raspberry-pi-5"])[0]
    agents = [VirtualAgent("f", f"d{i}", profile, send=print, schedule=print, seed=i) for i in range(5)]
    batches = list(history_batches(agents, count=3, start=NOW, window_s=10.0, switch_index=3, upgrade=None, batch_windows=4))
    assert [len(b) for b in batches] == [4, 4, 4, 3]
    flat = [w for b in batches for w in b]
    assert [w.seq for w in flat] == sorted(w.seq for w in flat)


def test_the_same_seed_gives_the_same_windows_and_another_seed_does_not(tmp_path) -> None:
    def seeded(name: str, seed: int) -> list[tuple]:
        with open_store(f"sqlite:///{tmp_path / name}") as store:
            seed_history(store, devices=3, hours=0.25, window_s=60.0, now=NOW, seed=seed)
            return sorted((w.device, w.seq, w.count, w.p50_ms, w.power_mean_mw) for w in store.windows(since=NOW - dt.timedelta(hours=1)))

    first, again, other = seeded("a.db", 4), seeded("b.db", 4), seeded("c.db", 5)
    assert first == again and len(first) == 45
    assert first != other


def test_progress_notes_say_how_far_and_how_fast(tmp_path, monkeypatch) -> None:
    import edgekit.fleet.sim.seed as seed_module

    monkeypatch.setattr(seed_module, "PROGRESS_EVERY_S", 0.0)
    notes = _Notes()
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        summary = seed_history(store, devices=4, hours=1.0, window_s=60.0, now=NOW, progress=notes, batch_windows=60)
    assert summary.windows == 240 and summary.seconds > 0 and summary.windows_per_s > 0
    assert len(notes.notes) == 4
    assert notes.notes[0].startswith("60 of 240 windows (25.0%)") and "windows/s" in notes.notes[0]


@pytest.mark.parametrize(("devices", "hours", "window_s", "message"), [
    (0, 1.0, 10.0, "devices must be an integer from 1"),
    (10, 1.0, 0.5, "window length must be a finite number of seconds, at least 1, got 0.5"),
    (10, 1.0, float("inf"), "window length must be a finite number of seconds, at least 1, got inf"),
    (10, -1.0, 10.0, "history must be a finite number of hours, zero or more, got -1.0"),
    (10, float("inf"), 10.0, "history must be a finite number of hours, zero or more, got inf"),
])  # fmt: skip
def test_bad_requests_name_the_value(tmp_path, devices, hours, window_s, message) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store, pytest.raises(SeedError, match=message):
        seed_history(store, devices=devices, hours=hours, window_s=window_s)


def test_cli_history_seeds_the_store_and_reports_json(store_url, capsys) -> None:
    args = _fleet_parser().parse_args(["simulate", "--history", "30m", "--devices", "12", "--window-s", "300",
                                       "--store", store_url, "--seed", "3", "--json"])  # fmt: skip
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["windows"] == 12 * 6 and report["devices"] == 12 and report["window_s"] == 300 and report["synthetic"]
    with open_store(store_url) as store:
        summaries = store.device_summaries()
    assert len(summaries) == 12 and {s.windows for s in summaries} == {6}


def test_cli_history_needs_a_store_and_live_needs_a_broker(capsys) -> None:
    from edgekit.fleet.simulate import SimulationError

    parser = _fleet_parser()
    args = parser.parse_args(["simulate", "--history", "1h"])
    with pytest.raises(SeedError, match="--history needs --store"):
        args.func(args)
    args = parser.parse_args(["simulate", "--devices", "2"])
    with pytest.raises(SimulationError, match="needs --broker URL"):
        args.func(args)


def test_cli_history_applies_bundle_behaviour(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    args = _fleet_parser().parse_args(["simulate", "--history", "2h", "--window-s", "60", "--devices", "3", "--targets",
                                       "raspberry-pi-5", "--store", url,
                                       "--bundle-behaviour", "demo-v2:latency_factor=3,error_rate=0.5"])  # fmt: skip
    assert args.func(args) == 0
    with open_store(url) as store:
        windows = list(store.windows(since=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=3)))
    by_bundle: dict[str, list] = {"demo-v1": [], "demo-v2": []}
    for window in windows:
        by_bundle[window.bundle_id].append(window)
    v1, v2 = by_bundle["demo-v1"], by_bundle["demo-v2"]
    assert sum(w.errors for w in v1) == 0
    v2_errors, v2_tries = sum(w.errors for w in v2), sum(w.errors + w.count for w in v2)
    assert 0.4 < v2_errors / v2_tries < 0.6  # error_rate=0.5
    p50 = lambda ws: sorted(w.p50_ms for w in ws)[len(ws) // 2]  # noqa: E731
    assert p50(v2) > 2 * p50(v1)  # latency_factor=3


@pytest.mark.parametrize(("history", "window_s", "message"), [
    ("1m", "300", "--history of 60 s is shorter than one --window-s 300 s window: no window would be seeded"),
    ("0s", "10", "--history of 0 s is shorter than one --window-s 10 s window"),
])  # fmt: skip
def test_cli_history_shorter_than_a_window_is_refused(tmp_path, history, window_s, message) -> None:
    store = tmp_path / "fleet.db"
    args = _fleet_parser().parse_args(["simulate", "--history", history, "--window-s", window_s, "--devices", "3",
                                       "--store", f"sqlite:///{store}"])  # fmt: skip
    with pytest.raises(SeedError) as raised:
        args.func(args)
    assert message in str(raised.value) and "give a --history of at least" in raised.value.hint
    assert not store.exists()  # no device stored online with no window


def test_cli_history_errors_name_history(tmp_path) -> None:
    from edgekit.fleet.errors import FleetError

    args = _fleet_parser().parse_args(["simulate", "--history", "1x", "--devices", "2", "--store", f"sqlite:///{tmp_path / 'x.db'}"])
    with pytest.raises(FleetError, match=r"^--history '1x' is neither a duration nor a time"):
        args.func(args)


def test_cli_history_json_times_are_iso_8601_with_z(store_url, capsys) -> None:
    args = _fleet_parser().parse_args(["simulate", "--history", "10m", "--window-s", "300", "--devices", "1", "--store",
                                       store_url, "--json"])  # fmt: skip
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("first_window_start", "last_window_end"):
        text = report[key]
        assert text.endswith("Z") and "T" in text and " " not in text, text
        assert dt.datetime.fromisoformat(text.replace("Z", "+00:00")).tzinfo == dt.timezone.utc
    first, last = (dt.datetime.fromisoformat(report[key][:-1]) for key in ("first_window_start", "last_window_end"))
    assert last - first == dt.timedelta(minutes=10)


@pytest.mark.parametrize(("behaviour", "message"), [
    ("v2:error_rate=nan", "--bundle-behaviour 'v2:error_rate=nan': error_rate 'nan' is not a finite number: give a share from 0 to 1"),
    ("v2:error_rate=1.5", "--bundle-behaviour 'v2:error_rate=1.5': error_rate '1.5' is not from 0 to 1"),
    ("v2:latency_factor=0", "--bundle-behaviour 'v2:latency_factor=0': latency_factor '0' is not above 0"),
    ("v2:power_factor=inf", "--bundle-behaviour 'v2:power_factor=inf': power_factor 'inf' is not a finite number"),
    ("v2:latency_factor=-2", "latency_factor '-2' is not above 0: give a factor above 0"),
])  # fmt: skip
def test_cli_bundle_behaviour_values_are_checked_before_anything_is_written(tmp_path, behaviour, message) -> None:
    from edgekit.fleet.simulate import SimulationError

    store = tmp_path / "fleet.db"
    args = _fleet_parser().parse_args(["simulate", "--history", "1h", "--window-s", "300", "--devices", "2",
                                       "--store", f"sqlite:///{store}", "--bundle-behaviour", behaviour])  # fmt: skip
    with pytest.raises(SimulationError) as raised:
        args.func(args)
    assert message in str(raised.value)
    assert not store.exists()
