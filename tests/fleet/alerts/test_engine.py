"""The alert engine against a real store (SQLite, and PostgreSQL where it runs): pending for ``for``, firing,
resolving, one bad window paging no one, every rule kind, worst-first ``active_alerts``, a restarted engine
taking back what was firing, and a failing webhook that never holds an evaluation."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from edgekit.fleet.alerts import AlertEngine, AlertRules, active_alerts
from edgekit.fleet.rollout_state import RolloutRecord
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceStatus
from tests.fleet.alerts.live_messages import alert_validator, live_window
from tests.runtime.agent.mosquitto import free_port

T0 = dt.datetime.now(dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def rules(**named: dict[str, Any]) -> AlertRules:
    return AlertRules.model_validate({"rules": named})


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[FleetStore]:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        yield store


def alert_events(store: FleetStore) -> list[tuple[str, str, str]]:
    return sorted((e.kind, e.device, e.payload["rule"]) for e in store.events(limit=1000) if e.kind.startswith("alert_"))


def test_p99_fires_after_for_and_resolves(store: FleetStore) -> None:
    engine = AlertEngine(rules(**{"p99-slow": {"kind": "p99_above", "threshold_ms": 50, "for": "30s",
                                               "severity": "critical", "labels": {"team": "vision"}}}), store)  # fmt: skip
    store.add_windows([live_window(1, p99_ms=200.0), live_window(1, device="dev-2", p99_ms=20.0)])
    assert engine.evaluate(at(0)) == []  # pending
    assert engine.evaluate(at(29)) == []
    [fired] = engine.evaluate(at(30))
    validator = alert_validator()
    validator.validate(fired)
    assert (fired["status"], fired["rule"], fired["device"], fired["value"], fired["threshold"]) == (
        "firing", "p99-slow", "dev-1", 200.0, 50.0)
    assert fired["labels"] == {"team": "vision"} and fired["severity"] == "critical"
    assert fired["pending_since"].startswith(at(0).strftime("%Y-%m-%dT%H:%M:%S"))
    assert engine.evaluate(at(40)) == []  # still firing: said once
    [active] = active_alerts(store)
    assert (active.rule, active.device, active.value, active.threshold, active.severity) == ("p99-slow", "dev-1", 200.0, 50.0, "critical")
    store.add_windows([live_window(2, p99_ms=10.0)])
    [resolved] = engine.evaluate(at(45))
    validator.validate(resolved)
    assert (resolved["status"], resolved["device"], resolved["event_id"] != fired["event_id"]) == ("resolved", "dev-1", True)
    assert active_alerts(store) == []
    assert alert_events(store) == [("alert_firing", "dev-1", "p99-slow"), ("alert_resolved", "dev-1", "p99-slow")]
    firing_event = next(e for e in store.events(limit=10) if e.kind == "alert_firing")
    assert firing_event.level == "error" and "p99 200.0 ms > 50 ms" in firing_event.message
    assert (engine.counters.fired, engine.counters.resolved) == (1, 1)


def test_one_bad_window_pages_no_one(sqlite_store: FleetStore) -> None:
    engine = AlertEngine(rules(slow={"kind": "p99_above", "threshold_ms": 50, "for": "30s"}), sqlite_store)
    sqlite_store.add_windows([live_window(1, p99_ms=200.0)])
    assert engine.evaluate(at(0)) == []
    sqlite_store.add_windows([live_window(2, p99_ms=10.0)])  # the next window is fine: the pending breach is forgotten
    assert engine.evaluate(at(10)) == []
    sqlite_store.add_windows([live_window(3, p99_ms=200.0)])  # bad again: pending starts over
    assert engine.evaluate(at(35)) == []
    assert engine.evaluate(at(64)) == []
    assert [n["status"] for n in engine.evaluate(at(65))] == ["firing"]
    assert alert_events(sqlite_store) == [("alert_firing", "dev-1", "slow")]


def test_device_states_temperature_and_fleet_median(sqlite_store: FleetStore) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    windows = [live_window(1, device=f"orin-{i}", p99_ms=p99) for i, p99 in enumerate((10.0, 11.0, 12.0, 60.0))]
    windows.append(live_window(1, device="hot-1", temperature_c=91.0))
    windows.append(live_window(1, device="quiet-1", end=now - dt.timedelta(seconds=5)))  # 1 s windows, silent 5 s: stale
    sqlite_store.add_windows(windows)
    for device in ("orin-0", "orin-1", "orin-2", "orin-3"):
        sqlite_store.set_device_target("lab", device, "jetson-orin-nano-8gb")
    sqlite_store.upsert_status(DeviceStatus("lab", "gone-1", "offline", None, None, "0.1", now))  # its last will
    engine = AlertEngine(rules(
        stale={"kind": "device_state", "states": ["stale"]},
        offline={"kind": "device_state", "states": ["offline"], "severity": "critical"},
        hot={"kind": "temperature_above", "threshold_c": 85},
        slower={"kind": "p99_above_fleet_median", "factor": 3, "min_devices": 4},
        slower5={"kind": "p99_above_fleet_median", "factor": 3, "min_devices": 5},
    ), sqlite_store)  # fmt: skip
    fired = {(n["rule"], n["device"]): n for n in engine.evaluate(at(0))}
    assert set(fired) == {("stale", "quiet-1"), ("offline", "gone-1"), ("hot", "hot-1"), ("slower", "orin-3")}
    assert fired[("slower", "orin-3")]["threshold"] == 34.5  # 3 x the median 11.5 of the four Orins
    assert fired[("slower", "orin-3")]["details"]["target"] == "jetson-orin-nano-8gb"
    assert fired[("hot", "hot-1")]["value"] == 91.0
    assert fired[("stale", "quiet-1")]["value"] == "stale"
    # worst first: critical, then warnings by how far past their threshold (60/34.5, 91/85, a state: 1)
    assert [a.rule for a in active_alerts(sqlite_store)] == ["offline", "slower", "hot", "stale"]
    assert [a.rule for a in active_alerts(sqlite_store, "other-fleet")] == []


def test_error_rate_and_disk_full_come_from_the_windows_the_collector_stored(sqlite_store: FleetStore) -> None:
    engine = AlertEngine(rules(errors={"kind": "error_rate_above", "share": 0.05, "min_inferences": 20},
                               disk={"kind": "spool_disk_full", "severity": "critical"}), sqlite_store)  # fmt: skip
    windows = [live_window(1, device="dev-1", inferences=90, failed=10), live_window(1, device="dev-2", inferences=5, failed=5),
               live_window(1, device="dev-3", problems=["spool.disk_full"]), live_window(1, device="dev-4", inferences=99, failed=1)]  # fmt: skip
    sqlite_store.add_windows(windows)
    assert engine.evaluate(at(0)) == []  # nothing observed yet: the engine judges what the collector fed it
    engine.observe_windows(windows)
    fired = {(n["rule"], n["device"]): n for n in engine.evaluate(at(1))}
    assert set(fired) == {("errors", "dev-1"), ("disk", "dev-3")}  # dev-2: 10 inferences < min 20; dev-4: 1 %
    assert fired[("errors", "dev-1")]["value"] == 0.1
    later = [live_window(2, device="dev-1", inferences=100, failed=0), live_window(2, device="dev-3")]
    sqlite_store.add_windows(later)
    engine.observe_windows(later)
    engine.observe_windows([windows[0]])  # an older window arriving late does not undo the newer one
    assert sorted((n["status"], n["device"]) for n in engine.evaluate(at(2))) == [("resolved", "dev-1"), ("resolved", "dev-3")]


def test_a_reflashed_device_whose_seqs_start_again_clears_its_window_alert(sqlite_store: FleetStore) -> None:
    engine = AlertEngine(rules(errors={"kind": "error_rate_above", "share": 0.05, "min_inferences": 20}), sqlite_store)
    now = dt.datetime.now(dt.timezone.utc)  # the store judges devices online by the wall clock

    def later(seconds: float) -> dt.datetime:
        return now + dt.timedelta(seconds=seconds)

    failing = live_window(5000, inferences=100, failed=50, end=now)
    sqlite_store.add_windows([failing])
    engine.observe_windows([failing])
    assert [(n["status"], n["device"]) for n in engine.evaluate(now)] == [("firing", "dev-1")]
    # reflashed: seqs start again at 1, healthy windows after the failing one ended
    healthy = [live_window(seq, inferences=100, end=later(1 + seq)) for seq in (1, 2)]
    sqlite_store.add_windows(healthy)
    engine.observe_windows(healthy)
    assert [(n["status"], n["device"]) for n in engine.evaluate(later(3))] == [("resolved", "dev-1")]
    engine.observe_windows([healthy[0]])  # a new window redelivered does not undo the newer one
    assert engine.evaluate(later(4)) == []


def test_rollout_failed(sqlite_store: FleetStore) -> None:
    now = dt.datetime.now(dt.timezone.utc)

    def record(rollout_id: str, state: str, finished: dt.datetime) -> dict[str, Any]:
        return RolloutRecord(rollout_id, "lab", "det-int8-v2", "https://x/b.tar", "e" * 64, state, ("dev-1",),
                             ("dev-1", "dev-2"), finished - dt.timedelta(minutes=5), finished, reason="p99 gate failed",
                             outcomes={"dev-1": "rolled_back", "dev-2": "succeeded"}, finished_at=finished).to_json()  # fmt: skip

    sqlite_store.save_rollout(record("r-new", "rolled_back", now))
    sqlite_store.save_rollout(record("r-old", "rolled_back", now - dt.timedelta(hours=3)))
    sqlite_store.save_rollout(record("r-ok", "completed", now))
    engine = AlertEngine(rules(rollout={"kind": "rollout_failed", "within": "1h"}), sqlite_store)
    [fired] = engine.evaluate(at(0))
    assert (fired["subject"], fired["device"], fired["details"]["failed_devices"]) == ("rollout/r-new", "dev-1", ["dev-1"])
    assert "p99 gate failed" in fired["summary"]
    [active] = active_alerts(sqlite_store, "lab")
    assert active.subject == "rollout/r-new"


def test_a_restarted_engine_takes_back_what_was_firing(sqlite_store: FleetStore) -> None:
    slow = rules(slow={"kind": "p99_above", "threshold_ms": 50})
    sqlite_store.add_windows([live_window(1, p99_ms=200.0)])
    assert [n["status"] for n in AlertEngine(slow, sqlite_store).evaluate(at(0))] == ["firing"]
    engine = AlertEngine(slow, sqlite_store, evaluate_every_s=3600).start()
    try:
        deadline = time.monotonic() + 10
        while engine.counters.evaluations < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.firing() == [("slow", "lab", "dev-1")]
        assert engine.counters.fired == 0  # not fired a second time
        sqlite_store.add_windows([live_window(2, p99_ms=5.0)])
        [resolved] = engine.evaluate()
        assert (resolved["status"], resolved["value"]) == ("resolved", 200.0)  # the value it fired with, from the store
    finally:
        engine.stop()
    assert alert_events(sqlite_store) == [("alert_firing", "dev-1", "slow"), ("alert_resolved", "dev-1", "slow")]


def test_a_dead_webhook_is_counted_and_never_holds_an_evaluation(sqlite_store: FleetStore) -> None:
    sqlite_store.add_windows([live_window(1, p99_ms=200.0)])
    engine = AlertEngine(rules(slow={"kind": "p99_above", "threshold_ms": 50}), sqlite_store,
                         webhook_url=f"http://127.0.0.1:{free_port()}/hook", webhook_timeout_s=2.0)  # fmt: skip
    began = time.monotonic()
    assert len(engine.evaluate(at(0))) == 1
    assert time.monotonic() - began < 1.0
    engine.stop()  # sends what is queued first
    assert (engine.webhook.sent, engine.webhook.failed) == (0, 1)  # type: ignore[union-attr]


def test_a_restarted_engine_keeps_window_alerts_firing_until_their_device_sends_a_window(sqlite_store: FleetStore) -> None:
    window_rules = rules(errors={"kind": "error_rate_above", "share": 0.05}, disk={"kind": "spool_disk_full"})
    failing = [live_window(1, device="dev-1", inferences=50, failed=50), live_window(1, device="dev-2", problems=["spool.disk_full"]),
               live_window(1, device="dev-3", problems=["spool.disk_full"])]  # fmt: skip
    sqlite_store.add_windows(failing)
    first = AlertEngine(window_rules, sqlite_store)
    first.observe_windows(failing)
    assert len(first.evaluate(at(0))) == 3
    sqlite_store.upsert_status(DeviceStatus(fleet="lab", device="dev-3", state="offline", bundle_id=None, target=None,
                                            agent_version="test", updated_at=dt.datetime.now(dt.timezone.utc)))  # its will  # fmt: skip
    engine = AlertEngine(window_rules, sqlite_store, evaluate_every_s=3600).start()  # the collector restarted
    try:
        deadline = time.monotonic() + 10
        while engine.counters.evaluations < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.firing() == [("disk", "lab", "dev-2"), ("errors", "lab", "dev-1")]  # no window yet: not judged
        assert (engine.counters.fired, engine.counters.resolved) == (0, 1)  # dev-3 fell silent: resolved
        later = [live_window(2, device="dev-1", inferences=50, failed=50), live_window(2, device="dev-2")]
        sqlite_store.add_windows(later)
        engine.observe_windows(later)
        assert [(n["status"], n["rule"], n["device"]) for n in engine.evaluate()] == [("resolved", "disk", "dev-2")]
        assert engine.firing() == [("errors", "lab", "dev-1")]  # still failing: still firing, never paged again
    finally:
        engine.stop()
    assert alert_events(sqlite_store) == [("alert_firing", "dev-1", "errors"), ("alert_firing", "dev-2", "disk"),
                                          ("alert_firing", "dev-3", "disk"), ("alert_resolved", "dev-2", "disk"),
                                          ("alert_resolved", "dev-3", "disk")]  # fmt: skip
