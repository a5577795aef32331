"""What ``edgekit fleet deploy`` says while it runs and after (issue 32 item 1): a live line per watched wave on
stderr with the gate's figures and the seconds left, a dropped wave said at the start, the gate's numbers and
the devices per outcome in the summary and in ``fleet report``. Real Mosquitto, collector, SQLite store and
simulated devices (tests/fleet/rollout/conftest.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
import re

from edgekit.cli.fleet_deploy import gate_text, plural, watch_line
from tests.fleet.rollout.test_rollout_waves_live import _deploy_cli
from tests.fleet.simulate.test_fleet_cli import _parser


def test_deploy_prints_a_live_line_per_watched_wave_and_the_gate_figures(live_fleet, signed_bundle, fleet_keys, capsys) -> None:
    from edgekit.cli.main import main

    fleet = live_fleet(devices=5)
    bundle = signed_bundle("vision-progress")
    args = _parser().parse_args(_deploy_cli(fleet, bundle, "--target", "x86-64-cpu", "--waves", "1,10%,100%",
                                            "--key", str(fleet_keys[1])))  # fmt: skip

    assert args.func(args) == 0
    out, err = capsys.readouterr()
    # 10 % of 5 devices is 1: the wave adds none and is said to be dropped before anything goes out
    assert "wave 10% dropped: 10% of 5 device(s) is 1, which earlier waves already reach" in err
    assert "rollout " in err and "to 5 devices in 2 waves" in err
    live = [line.strip() for line in err.splitlines() if "watching: " in line]
    assert live, err
    first = live[0]
    assert re.fullmatch(r"wave 1/2 watching: 1 switched, [01] healthy, 0 failed; error rate (–|\d+\.\d%) \(limit 2\.0%\), "
                        r"p99 \S+ -> \S+ ms \((\d+\.\d\dx|no ratio), limit 1\.50x\), \d+ inferences; [01] s left", first), first
    # the summary (stdout): the gate's numbers under wave 1, the devices per outcome, the dropped wave
    assert "wave 1 (1, 1 device): passed" in out and "wave 2 (100%, 4 devices): passed" in out
    gate = next(line.strip() for line in out.splitlines() if line.strip().startswith("gate:"))
    assert re.fullmatch(r"gate: error rate \d+\.\d% \(limit 2\.0%\), p99 \d+\.\d\d -> \d+\.\d\d ms \(\d+\.\d\dx, limit 1\.50x\), "
                        r"[1-9]\d* inferences", gate), gate
    assert "devices: 5 succeeded" in out and "wave 10% dropped" in out

    assert main(["fleet", "report", "--store", fleet.store_url, "--since", "1h"]) == 0
    report = capsys.readouterr().out
    assert gate in report and "devices: 5 succeeded" in report and "wave 10% dropped" in report


def test_a_stopped_rollout_lists_later_devices_as_not_started(live_fleet, signed_bundle, fleet_keys, capsys) -> None:
    from edgekit.fleet.rollout_bundle import prepare_bundle
    from edgekit.fleet.simulate import BundleBehaviour

    bundle = signed_bundle("vision-refused")
    artifact = prepare_bundle(bundle, key=fleet_keys[1])
    fleet = live_fleet(devices=3, behaviours={artifact.bundle_id: BundleBehaviour(self_check_passes=False)})
    args = _parser().parse_args(_deploy_cli(fleet, bundle, "--target", "x86-64-cpu", "--waves", "1,100%", "--key", str(fleet_keys[1])))

    assert args.func(args) == 1
    out = capsys.readouterr().out
    later = sorted(fleet.simulator.agents)[1:]
    assert all(f"  {device}: not_started (wave" not in out and f"  {device}: not_started" in out for device in later), out
    assert "pending" not in out
    assert "devices: 2 not_started, 1 failed" in out


def test_watch_line_and_gate_text_show_missing_figures_as_dashes() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    wave = {"index": 2, "watch_ends_at": (now + dt.timedelta(seconds=41.4)).isoformat(),
            "health": {"devices": 3, "healthy": 2, "failed": 0, "error_rate": None, "p99_before_ms": 4.0, "p99_after_ms": None,
                       "p99_ratio": None, "inferences": 0, "max_error_rate": 0.02, "max_p99_ratio": 1.5}}  # fmt: skip
    assert watch_line(wave, 3, now) == ("wave 2/3 watching: 3 switched, 2 healthy, 0 failed; error rate – (limit 2.0%), "
                                        "p99 4.00 -> – ms (no ratio, limit 1.50x), 0 inferences; 41 s left")  # fmt: skip
    health = {**wave["health"], "error_rate": 0.031, "p99_after_ms": 9.0, "p99_ratio": 2.25, "inferences": 97}
    assert gate_text(health) == "error rate 3.1% (limit 2.0%), p99 4.00 -> 9.00 ms (2.25x, limit 1.50x), 97 inferences"
    assert (plural(1, "device"), plural(0, "device"), plural(2, "wave")) == ("1 device", "0 devices", "2 waves")


def test_on_a_terminal_the_live_line_is_rewritten_in_place(monkeypatch) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from edgekit.cli import fleet_deploy
    from edgekit.fleet.rollout_state import RolloutRecord

    screen = io.StringIO()
    monkeypatch.setattr(fleet_deploy, "console", Console(file=screen, force_terminal=True, width=200, highlight=False))
    show = fleet_deploy._progress_printer(SimpleNamespace(url="file:///b.tar", sha256="0" * 64, size_bytes=10))
    now = dt.datetime.now(dt.timezone.utc)
    health = {"devices": 1, "healthy": 0, "failed": 0, "error_rate": None, "p99_before_ms": 4.0, "p99_after_ms": None,
              "p99_ratio": None, "inferences": 0, "max_error_rate": 0.02, "max_p99_ratio": 1.5, "final": False}  # fmt: skip
    wave = {"index": 1, "spec": "1", "devices": ["a"], "state": "watching", "watch_ends_at": (now + dt.timedelta(seconds=30)).isoformat(),
            "health": health}  # fmt: skip
    later = {"index": 2, "spec": "100%", "devices": ["b"], "state": "pending"}
    record = RolloutRecord("r1", "lab", "b-1", "file:///b.tar", "0" * 64, "watching", ("a",), ("a", "b"), now, now, waves=(wave, later))
    show(record)
    show(replace(record, waves=({**wave, "health": {**health, "healthy": 1, "inferences": 12}}, later)))
    show(replace(record, state="completed", waves=({**wave, "state": "passed", "health": {**health, "final": True}}, later)))
    text = screen.getvalue()
    assert text.count("\r\x1b[K    wave 1/2 watching: 1 switched, ") == 2  # the same line, rewritten
    assert "0 healthy" in text and "1 healthy, 0 failed; error rate – (limit 2.0%)" in text and "12 inferences; " in text
    assert text.endswith("s left\n")  # the live line is ended before anything else is printed
