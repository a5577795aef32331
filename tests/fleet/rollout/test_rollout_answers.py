"""Rollouts whose devices answer in the ways real fleets do besides the happy path, found by reviewing the engine:
a second answer to one command, an answer after the timeout, an outcome the engine does not know, an answer from
another device, a canary already on the bundle, a second `fleet deploy` of the same fleet, a damaged record. The real
Rollout engine on a real SQLite store; the devices' answers are written as events the way the collector stores them,
by a publisher that plays each device (its answers scripted per test)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.errors import StoreError
from edgekit.fleet.report import build_report
from edgekit.fleet.rollout import Rollout, RolloutPolicy
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.rollout_state import StoreRolloutLog
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus, TelemetryWindow

FLEET, OLD, NEW = "lab", "old-bundle-1", "new-bundle-2"
Answer = list[tuple[float, Any]]  # (delay s, an event, a window, or a callable making one) the device sends


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Devices:
    """Plays the devices: ``script(device, command) -> Answer``; telemetry on NEW (p99 per device) once deployed."""

    def __init__(self, store: FleetStore, script: Callable[[str, dict[str, Any]], Answer]) -> None:
        self.store, self.script, self.sent = store, script, []
        self.seq: dict[str, int] = {}

    def window(self, device: str, bundle: str, p99: float = 5.0, end: dt.datetime | None = None) -> TelemetryWindow:
        self.seq[device] = self.seq.get(device, 0) + 1
        end = end or _now()
        return TelemetryWindow(FLEET, device, self.seq[device], end - dt.timedelta(seconds=1), end, _now(), bundle, None,
                               100, 0, p99 / 2, p99, p99, p99, p99 / 2, 100.0, None, None, None, None, None, None, None,
                               None, payload={})  # fmt: skip

    def send(self, fleet: str, device: str, message: dict[str, Any], timeout_s: float = 10.0) -> None:
        self.sent.append((device, message["command"], message["id"]))
        for delay, thing in self.script(device, message) or ():
            threading.Timer(delay, self._write, (thing,)).start() if delay > 0 else self._write(thing)

    def _write(self, thing: Any) -> None:
        thing = thing() if callable(thing) else thing
        try:
            if isinstance(thing, DeviceEvent):
                self.store.add_events([thing])
            elif thing is not None:
                self.store.add_windows([thing])
        except StoreError:  # a late answer after the test closed its store: the device's message goes nowhere
            pass


def answer(device: str, message: dict[str, Any], outcome: str, *, kind: str | None = None, at: dt.datetime | None = None,
           **details: Any) -> DeviceEvent:  # fmt: skip
    kind = kind or ("deploy_result" if message["command"] == "deploy" else "rollback_result")
    return DeviceEvent(FLEET, device, uuid.uuid4().hex, kind, "error" if outcome == "failed" else "info", f"{kind} {outcome}",
                       at or _now(), command_id=message["id"], payload={"details": {"outcome": outcome, **details}})  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> FleetStore:
    opened = open_store(f"sqlite:///{tmp_path / 'fleet.db'}")
    yield opened
    opened.close()


def _fleet(store: FleetStore, names: list[str], bundle: str = OLD, p99: float = 5.0, devices: Devices | None = None) -> None:
    store.upsert_statuses([DeviceStatus(FLEET, d, "online", bundle, "x86-64-cpu", "sim-1", _now()) for d in names])
    player = devices or Devices(store, lambda d, m: [])
    store.add_windows([player.window(d, bundle, p99, end=_now() - dt.timedelta(seconds=30)) for d in names])


def _run(store: FleetStore, devices: Devices, **options: Any) -> Any:
    policy = RolloutPolicy(**{"health_window_s": 0.6, "deploy_timeout_s": 1.5, "poll_s": 0.05, "progress_s": 0.2, **options})
    artifact = BundleArtifact(path=Path("/b.tar"), bundle_id=NEW, name="new", target="x86-64-cpu", url="file:///b.tar",
                              sha256="0" * 64, size_bytes=1, manifest_sha256="0" * 64, signature_b64="", signed_by=None)  # fmt: skip
    return Rollout(store, devices, StoreRolloutLog(store), artifact, store.device_summaries(FLEET), policy).run()


def _healthy(devices: Devices, device: str, message: dict[str, Any], outcome: str = "succeeded") -> Answer:
    return [(0, answer(device, message, outcome)), (0.05, lambda: devices.window(device, NEW))]


def test_the_newest_final_answer_counts_and_interrupted_waits_for_it(store: FleetStore) -> None:
    def script(device: str, message: dict[str, Any]) -> Answer:
        if message["command"] != "deploy":
            return [(0, answer(device, message, "succeeded"))]
        if device == "a":  # stopped during its watch, then started again: the watch ended well
            return [(0, answer(device, message, "interrupted")), (0.3, answer(device, message, "succeeded")),
                    (0.35, lambda: devices.window(device, NEW))]  # fmt: skip
        if device == "b":  # the agent's own watch rolled it back after it said succeeded
            return [(0, answer(device, message, "succeeded")), (0.05, lambda: devices.window(device, NEW)),
                    (0.4, answer(device, message, "rolled_back"))]  # fmt: skip
        return _healthy(devices, device, message)

    devices = Devices(store, script)
    _fleet(store, ["a", "b", "c"], devices=devices)
    record = _run(store, devices, waves=("2", "100%"))
    assert record.outcomes["a"] == "rolled_back"  # its final answer was read (before: "interrupted" was final) ...
    assert record.device_results["b"]["outcome"] == "rolled_back"  # ... and so was b's second one (before: the first won)
    assert record.waves[0]["state"] == "failed" and "answered again after their deploy" in record.waves[0]["reason"]
    assert record.outcomes["c"] == "not_started" and record.state == "rolled_back"


def test_an_interrupted_device_is_rolled_back_with_the_others(store: FleetStore) -> None:
    def script(device: str, message: dict[str, Any]) -> Answer:
        if message["command"] == "rollback":
            return [(0, answer(device, message, "succeeded"))]
        if device == "b":
            return [(0, answer(device, message, "interrupted"))]  # never comes back within the timeout
        if device == "c":
            return [(0, answer(device, message, "failed", step="self_check"))]
        return _healthy(devices, device, message)

    devices = Devices(store, script)
    _fleet(store, ["a", "b", "c", "d"], devices=devices)
    record = _run(store, devices, waves=("3", "100%"))
    rolled = {device for device, command, _ in devices.sent if command == "rollback"}
    assert rolled == {"a", "b"} and record.state == "rolled_back"  # before: b kept the new bundle, unnamed
    assert record.outcomes["d"] == "not_started"


def test_a_success_after_the_timeout_is_found_before_a_rollback(store: FleetStore) -> None:
    from edgekit.fleet.rollout_answers import late_switches

    devices = Devices(store, lambda d, m: [])
    _fleet(store, ["a", "b"], devices=devices)
    policy = RolloutPolicy(waves=("100%",))
    artifact = BundleArtifact(path=Path("/b.tar"), bundle_id=NEW, name="new", target="x86-64-cpu", url="file:///b.tar",
                              sha256="0" * 64, size_bytes=1, manifest_sha256="0" * 64, signature_b64="", signed_by=None)  # fmt: skip
    record = Rollout(store, devices, StoreRolloutLog(store), artifact, store.device_summaries(FLEET), policy).record
    record = record.with_state("deploying", outcomes={"a": "succeeded", "b": "timeout"},
                               device_results={"a": {"command_id": "cmd-a"}, "b": {"command_id": "cmd-b"}})  # fmt: skip
    late = {"command": "deploy", "id": "cmd-b"}
    store.add_events([answer("b", late, "succeeded"), answer("a", late, "succeeded")])  # b's answer, slow; a's is not its own
    found = late_switches(store, record, ["a"])
    assert list(found) == ["b"] and found["b"]["outcome"] == "succeeded"  # before: b stayed "timeout" and on the bundle
    assert found["b"]["reason"] == "answered after the deploy timeout"


@pytest.mark.parametrize("odd", ["deploying", "pending", "skipped_offline", "done!"])
def test_an_outcome_the_engine_does_not_know_is_a_failure(store: FleetStore, odd: str) -> None:
    devices = Devices(store, lambda d, m: [(0, answer(d, m, odd))] if d == "b" else _healthy(devices, d, m))
    _fleet(store, ["a", "b"], devices=devices)
    record = _run(store, devices, waves=("1", "100%"))
    assert record.outcomes["b"] == "failed" and record.device_results["b"]["reported_outcome"] == odd
    assert record.state == "completed_with_failures" and "b failed" in record.reason  # before: "completed", no reason


def test_an_answer_from_another_device_is_not_taken(store: FleetStore) -> None:
    ids: dict[str, dict[str, Any]] = {}

    def script(device: str, message: dict[str, Any]) -> Answer:
        ids[device] = message
        if device == "b":  # b answers a's command as well as its own; a says nothing
            return [(0, answer("b", ids["a"], "succeeded")), *_healthy(devices, "b", message)]
        return []

    devices = Devices(store, script)
    _fleet(store, ["a", "b"], devices=devices)
    record = _run(store, devices, waves=("2", "100%"), deploy_timeout_s=0.8)
    assert record.outcomes["a"] == "timeout" and record.outcomes["b"] == "succeeded"


def test_a_canary_already_on_the_bundle_is_still_watched(store: FleetStore) -> None:
    devices = Devices(store, lambda d, m: [(0, answer(d, m, "succeeded", unchanged=True)),
                                           (0.05, lambda: devices.window(d, NEW, p99=900.0))] if d == "a" else _healthy(devices, d, m))  # fmt: skip
    _fleet(store, ["a"], bundle=NEW, devices=devices)  # a retried rollout: the canary took the bundle last time
    _fleet(store, ["b", "c"], devices=devices)
    record = _run(store, devices, waves=("1", "100%"))
    assert record.waves[0]["state"] == "failed" and "p99 grew" in record.waves[0]["reason"]
    assert record.outcomes["b"] == record.outcomes["c"] == "not_started"  # before: the gate judged no device and passed


def test_one_rollout_at_a_time_per_fleet(store: FleetStore) -> None:
    started = threading.Event()

    def slow(device: str, message: dict[str, Any]) -> Answer:
        started.set()
        return _healthy(devices, device, message)

    devices = Devices(store, slow)
    _fleet(store, ["a", "b"], devices=devices)
    first = threading.Thread(target=_run, args=(store, devices), kwargs={"canary": "1", "waves": ("100%",), "health_window_s": 2.0})
    first.start()
    try:
        assert started.wait(5)
        with pytest.raises(RolloutError, match="one rollout at a time per fleet"):
            _run(store, Devices(store, lambda d, m: []), waves=("1", "100%"))
    finally:
        first.join(20)
    assert _run(store, devices, waves=("1", "100%")).state in ("completed", "completed_with_failures")  # then it may


def test_a_damaged_rollout_record_is_named_and_the_others_still_show(store: FleetStore) -> None:
    devices = Devices(store, lambda d, m: _healthy(devices, d, m))
    _fleet(store, ["a"], devices=devices)
    good = _run(store, devices, waves=("1", "100%"))
    with store._transaction("test") as cursor:  # type: ignore[attr-defined]  # a row cut short (a disk that failed mid-write)
        cursor.execute("INSERT INTO edgekit_rollouts (rollout_id, fleet, bundle_id, state, started_at, updated_at, record) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", ("broken-1", FLEET, NEW, "completed", store.time_in(_now()),
                                                        store.time_in(_now()), '{"rollout_id": "broken-1", "canary": '))  # fmt: skip
    log = StoreRolloutLog(store)
    assert [r.rollout_id for r in log.recent(fleet=FLEET)] == [good.rollout_id]  # before: JSONDecodeError for every listing
    with pytest.raises(StoreError, match="rollout record 'broken-1' is damaged"):
        log.get("broken-1")
    report = build_report(store, since=_now() - dt.timedelta(hours=1), fleet=FLEET)
    assert [r.rollout_id for r in report.rollout_records] == [good.rollout_id]


def test_a_store_unavailable_for_moments_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.fleet import store_patience
    from edgekit.fleet.errors import StoreUnavailableError

    calls = []

    def flaky(value: int) -> int:  # a PostgreSQL restart: two refusals, then it answers
        calls.append(value)
        if len(calls) < 3:
            raise StoreUnavailableError("the fleet store is restarting")
        return value * 2

    monkeypatch.setattr(store_patience.time, "sleep", lambda s: None)
    assert store_patience.patiently("saving rollout r1", flaky, 21) == 42 and len(calls) == 3
    monkeypatch.setattr(store_patience, "STORE_PATIENCE_S", 0.0)
    calls.clear()
    with pytest.raises(StoreUnavailableError):  # past its patience the error goes up (the record says stopped)
        store_patience.patiently("saving rollout r1", flaky, 21)


def test_a_device_named_twice_gets_one_deploy(store: FleetStore) -> None:
    devices = Devices(store, lambda d, m: _healthy(devices, d, m))
    _fleet(store, ["a", "b"], devices=devices)
    summaries = store.device_summaries(FLEET)
    policy = RolloutPolicy(waves=("1", "100%"), health_window_s=0.3, deploy_timeout_s=1.5, poll_s=0.05, progress_s=0.2)
    artifact = BundleArtifact(path=Path("/b.tar"), bundle_id=NEW, name="new", target="x86-64-cpu", url="file:///b.tar",
                              sha256="0" * 64, size_bytes=1, manifest_sha256="0" * 64, signature_b64="", signed_by=None)  # fmt: skip
    record = Rollout(store, devices, StoreRolloutLog(store), artifact, [*summaries, summaries[0]], policy).run()
    assert sorted(d for d, command, _ in devices.sent if command == "deploy") == ["a", "b"]  # before: a twice, a timeout
    assert record.state == "completed"


def test_a_device_clock_behind_the_hosts_gives_no_negative_deploy_seconds(store: FleetStore) -> None:
    lag = dt.timedelta(seconds=90)  # the device's answer is stamped 90 s before the host sent the command

    def script(device: str, message: dict[str, Any]) -> Answer:
        at = _now() - lag if device == "a" else None
        return [(0, answer(device, message, "succeeded", at=at)), (0.05, lambda: devices.window(device, NEW))]

    devices = Devices(store, script)
    _fleet(store, ["a", "b"], devices=devices)
    record = _run(store, devices, waves=("100%",))
    assert record.state == "completed" and record.outcomes == {"a": "succeeded", "b": "succeeded"}
    assert record.device_results["a"]["seconds"] is None  # before: -90 s, a deploy that ended before it began
    assert record.device_results["b"]["seconds"] is not None and record.device_results["b"]["seconds"] >= 0
