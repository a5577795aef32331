"""Rollouts that end early or run long, found by reviewing the engine: a send loop that fails part way, Ctrl-C while
a wave waits for its answers, a ``stop`` event, a wave that takes minutes to publish, an error a switched device
sends before its wave's health watch starts, and a policy or command no device would take. The real Rollout engine
on a real SQLite store, with the simulated devices of test_rollout_answers.py."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.commands import CommandError
from edgekit.fleet.rollout import Rollout, RolloutPolicy
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.rollout_state import FINAL_STATES, StoreRolloutLog
from edgekit.fleet.store import FleetStore
from edgekit.fleet.store.base import DeviceEvent
from tests.fleet.rollout.test_rollout_answers import FLEET, NEW, Answer, Devices, _fleet, _healthy, _now, answer
from tests.fleet.rollout.test_rollout_answers import store  # noqa: F401 (pytest fixture)

FAST = {"health_window_s": 0.6, "deploy_timeout_s": 1.5, "poll_s": 0.05, "progress_s": 0.2}


def _artifact(**changes: Any) -> BundleArtifact:
    return BundleArtifact(**{"path": Path("/b.tar"), "bundle_id": NEW, "name": "new", "target": "x86-64-cpu", "url": "file:///b.tar",
                             "sha256": "0" * 64, "size_bytes": 1, "manifest_sha256": "0" * 64, "signature_b64": "",
                             "signed_by": None, **changes})  # fmt: skip


def _rollout(store: FleetStore, devices: Devices, stop: threading.Event | None = None, artifact: Any = None,
             **options: Any) -> Rollout:  # fmt: skip
    policy = RolloutPolicy(**{**FAST, **options})
    return Rollout(store, devices, StoreRolloutLog(store), artifact or _artifact(), store.device_summaries(FLEET), policy, stop=stop)


def _answering(devices: Devices, device: str, message: dict[str, Any]) -> Answer:
    return _healthy(devices, device, message) if message["command"] == "deploy" else [(0, answer(device, message, "succeeded"))]


def _error_event(device: str) -> DeviceEvent:
    return DeviceEvent(FLEET, device, uuid.uuid4().hex, "inference_error", "error", "model crashed: CUDA error", _now(),
                       command_id=None, payload={})  # fmt: skip


def test_an_error_sent_while_the_wave_waits_for_slower_devices_fails_its_gate(store: FleetStore) -> None:
    def script(device: str, message: dict[str, Any]) -> Answer:
        if message["command"] != "deploy":
            return [(0, answer(device, message, "succeeded"))]
        if device == "a":  # switches at once, then crashes while b still downloads
            return [*_healthy(devices, device, message), (0.3, lambda: _error_event("a"))]
        if device == "b":  # a slow download: answers after a second
            return [(1.0, answer(device, message, "succeeded")), (1.05, lambda: devices.window(device, NEW))]
        return _healthy(devices, device, message)

    devices = Devices(store, script)
    _fleet(store, ["a", "b", "c", "d"], devices=devices)
    store.add_events([_error_event("a"), _error_event("c")])  # before the rollout: the old bundle's, not counted

    record = _rollout(store, devices, waves=("2", "100%"), health_window_s=1.0, deploy_timeout_s=3.0).run()

    # before: every event in the store when the watch began was skipped, so the wave passed and all four switched
    assert record.state == "rolled_back", record.reason
    assert record.waves[0]["state"] == "failed"
    assert record.waves[0]["reason"] == "device a reported an error event (inference_error): model crashed: CUDA error"
    assert record.outcomes == {"a": "rolled_back", "b": "rolled_back", "c": "not_started", "d": "not_started"}


def test_errors_stored_before_a_devices_wave_went_out_do_not_fail_its_gate(store: FleetStore) -> None:
    def script(device: str, message: dict[str, Any]) -> Answer:
        if device == "a" and message["command"] == "deploy":  # on the old bundle, c crashes while a is deployed
            return [*_healthy(devices, device, message), (0, lambda: _error_event("c"))]
        return _answering(devices, device, message)

    devices = Devices(store, script)
    _fleet(store, ["a", "b", "c"], devices=devices)
    store.add_events([_error_event("a")])  # before the rollout

    record = _rollout(store, devices, waves=("1", "2", "100%")).run()

    assert record.state == "completed", record.reason  # c's error came before its wave (3): not the new bundle's
    assert [w["state"] for w in record.waves] == ["passed", "passed", "passed"]


class _FailsAtFourthSend(Devices):
    """A broker that stops acknowledging at the fourth deploy; the record as stored then is kept."""

    stored_then: Any = None

    def send(self, fleet: str, device: str, message: dict[str, Any], timeout_s: float = 10.0) -> None:
        if len(self.sent) == 3 and message["command"] == "deploy":
            self.stored_then = StoreRolloutLog(self.store).recent(1)[0]
            raise CommandError(f"broker did not acknowledge the deploy command to {device}")
        super().send(fleet, device, message, timeout_s)


def test_a_send_loop_that_fails_part_way_records_whom_it_sent_to(store: FleetStore) -> None:
    devices = _FailsAtFourthSend(store, lambda d, m: _healthy(devices, d, m))
    names = [f"d{i}" for i in range(6)]
    _fleet(store, names, devices=devices)

    with pytest.raises(CommandError, match="broker did not acknowledge"):
        _rollout(store, devices, waves=("100%",)).run()

    # every device was recorded deploying, with its command id, before its command went out (a kill -9 keeps that)
    assert set(devices.stored_then.outcomes.values()) == {"deploying"}
    assert all(devices.stored_then.device_results[d]["command_id"] for d in names)
    record = StoreRolloutLog(store).recent(1)[0]
    sent = {device: command_id for device, _, command_id in devices.sent}
    # before: all six not_started, no command ids: "never sent anything", though three had switched
    assert {d: record.outcomes[d] for d in names} == {"d0": "succeeded", "d1": "succeeded", "d2": "succeeded",
                                                       "d3": "deploying", "d4": "not_started", "d5": "not_started"}  # fmt: skip
    assert all(record.device_results[d]["command_id"] == sent[d] and record.device_results[d]["seconds"] is not None
               for d in ("d0", "d1", "d2"))  # fmt: skip
    assert record.device_results["d3"]["command_id"]  # its send failed unacknowledged: it may have arrived
    assert "d4" not in record.device_results and "d5" not in record.device_results
    assert record.state == "stopped" and record.reason == (
        "the deploy was ended by CommandError: broker did not acknowledge the deploy command to d3 during wave 1 (100%, "
        "deploying); no rollback was sent: 3 device(s) that took the bundle keep it (roll them back by deploying the "
        "previous bundle); 1 device(s) were sent the bundle and had not answered: they may still take it "
        "(`edgekit fleet status` shows the bundle each runs)")


def test_ctrl_c_while_a_wave_waits_keeps_the_answers_already_stored(store: FleetStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import edgekit.fleet.rollout as rollout_module

    def pressed(*args: Any, **kwargs: Any) -> Any:  # Ctrl-C just as the wave's answers are read
        raise KeyboardInterrupt

    devices = Devices(store, lambda d, m: _healthy(devices, d, m))
    _fleet(store, ["a", "b", "c", "d"], devices=devices)
    monkeypatch.setattr(rollout_module, "newest_answers", pressed)

    with pytest.raises(KeyboardInterrupt):
        _rollout(store, devices, waves=("100%",)).run()

    record = StoreRolloutLog(store).recent(1)[0]
    # before: all four kept "deploying" and the reason said "0 device(s) that took the bundle keep it"
    assert record.outcomes == {"a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "succeeded"}
    assert all(r["answered_at"] and r["seconds"] is not None for r in record.device_results.values())
    assert record.state == "stopped" and record.reason == (
        "the deploy was interrupted (Ctrl-C) during wave 1 (100%, deploying); no rollback was sent: 4 device(s) that "
        "took the bundle keep it (roll them back by deploying the previous bundle)")


def test_a_stop_event_set_during_a_watch_sends_no_further_wave(store: FleetStore) -> None:
    devices = Devices(store, lambda d, m: _answering(devices, d, m))
    names = [f"d{i}" for i in range(10)]
    _fleet(store, names, devices=devices)
    stop = threading.Event()
    rollout = _rollout(store, devices, stop=stop, waves=("1", "100%"), health_window_s=3.0)
    rollout._on_update = lambda record: record.state == "watching" and threading.Timer(0.3, stop.set).start()

    started = time.monotonic()
    record = rollout.run()

    # before: the cut-short gate passed, wave 2 was sent and, without waiting for answers, its 9 devices timed out
    assert [command for _, command, _ in devices.sent] == ["deploy"]
    assert time.monotonic() - started < 2.5
    assert record.state == "stopped" and record.outcomes == {"d0": "succeeded", **{d: "not_started" for d in names[1:]}}
    assert [(w["state"], w["reason"]) for w in record.waves] == [("failed", "stopped on request (its stop event was set)"),
                                                                 ("not_started", None)]  # fmt: skip
    assert record.reason == ("the deploy was stopped on request (its stop event was set) during wave 1 (1, watching); no "
                             "rollback was sent: 1 device(s) that took the bundle keep it (roll them back by deploying the "
                             "previous bundle)")  # fmt: skip


def test_a_stop_event_set_while_sending_stops_the_sends_and_reads_the_answers(store: FleetStore) -> None:
    stop = threading.Event()

    class StopAfterTwo(Devices):
        def send(self, fleet: str, device: str, message: dict[str, Any], timeout_s: float = 10.0) -> None:
            super().send(fleet, device, message, timeout_s)
            if len(self.sent) == 2:
                stop.set()

    devices = StopAfterTwo(store, lambda d, m: _healthy(devices, d, m))
    names = [f"d{i}" for i in range(6)]
    _fleet(store, names, devices=devices)

    record = _rollout(store, devices, stop=stop, waves=("100%",)).run()

    assert [device for device, _, _ in devices.sent] == ["d0", "d1"]  # before: all six, then every one a timeout
    assert record.outcomes == {"d0": "succeeded", "d1": "succeeded", **{d: "not_started" for d in names[2:]}}
    assert set(record.device_results) == {"d0", "d1"}
    assert record.state == "stopped" and "2 device(s) that took the bundle keep it" in record.reason


def test_a_stop_while_sending_a_wave_of_several_chunks_leaves_the_later_chunks_not_started(store: FleetStore,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A wave larger than SEND_CHUNK: before, each later chunk was still marked deploying after the stop, and only the last
    chunk's unsent devices went back to not_started (the record said five devices had been sent the bundle)."""
    import edgekit.fleet.rollout as rollout_module

    monkeypatch.setattr(rollout_module, "SEND_CHUNK", 3)
    stop = threading.Event()

    class StopAfterOne(Devices):
        def send(self, fleet: str, device: str, message: dict[str, Any], timeout_s: float = 10.0) -> None:
            super().send(fleet, device, message, timeout_s)
            stop.set()

    devices = StopAfterOne(store, lambda d, m: _healthy(devices, d, m))
    names = [f"d{i}" for i in range(9)]
    _fleet(store, names, devices=devices)

    record = _rollout(store, devices, stop=stop, waves=("100%",)).run()

    assert [device for device, _, _ in devices.sent] == ["d0"]
    assert record.outcomes == {"d0": "succeeded", **{d: "not_started" for d in names[1:]}}
    assert "were sent the bundle and had not answered" not in record.reason


def test_a_long_send_loop_and_wait_save_the_record_every_progress_interval(store: FleetStore) -> None:
    class SlowBroker(Devices):  # 50 ms a PUBACK: 40 devices take two seconds to publish
        def send(self, fleet: str, device: str, message: dict[str, Any], timeout_s: float = 10.0) -> None:
            time.sleep(0.05)
            super().send(fleet, device, message, timeout_s)

    devices = SlowBroker(store, lambda d, m: [] if d == "d39" else _healthy(devices, d, m))  # d39 never answers
    names = [f"d{i:02d}" for i in range(40)]
    _fleet(store, names, devices=devices)
    log, gaps, done = StoreRolloutLog(store), [], threading.Event()

    def watch() -> None:  # how long the stored record goes without an update while the rollout runs
        while not done.is_set():
            records = log.recent(1)
            if records and records[0].state not in FINAL_STATES:
                gaps.append((_now() - records[0].updated_at).total_seconds())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        record = _rollout(store, devices, waves=("100%",), progress_s=0.2, deploy_timeout_s=1.5).run()
    finally:
        done.set()
        watcher.join()

    assert record.state == "completed_with_failures" and record.outcomes["d39"] == "timeout"
    # before: nothing was saved for the 2 s of sending nor the 1.5 s of waiting, so a fleet of 1,000 over a slow broker
    # looked dead (silent_s) and a second `fleet deploy` of the fleet was let start
    assert gaps and max(gaps) < 0.2 + 0.5, max(gaps)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_error_rate", float("nan"), "--max-error-rate (max_error_rate) is nan: it must be a share of inferences from 0 to 1 (0.02 is 2 %)"),
    ("max_error_rate", 1.5, "--max-error-rate (max_error_rate) is 1.5: it must be a share of inferences from 0 to 1 (0.02 is 2 %)"),
    ("max_p99_ratio", float("nan"), "--max-p99-ratio (max_p99_ratio) is nan: it must be a finite ratio above 0 (1.5: p99 may grow by half)"),
    ("max_p99_ratio", 0.0, "--max-p99-ratio (max_p99_ratio) is 0.0: it must be a finite ratio above 0 (1.5: p99 may grow by half)"),
    ("health_window_s", float("inf"), "--health-window-s (health_window_s) is inf: it must be a finite number of seconds above 0"),
    ("health_window_s", float("nan"), "--health-window-s (health_window_s) is nan: it must be a finite number of seconds above 0"),
    ("deploy_timeout_s", -1.0, "--deploy-timeout-s (deploy_timeout_s) is -1.0: it must be a finite number of seconds above 0"),
    ("poll_s", 0, "RolloutPolicy.poll_s is 0: it must be a finite number of seconds above 0"),
])  # fmt: skip
def test_a_policy_value_that_disables_the_gate_or_breaks_the_rollout_is_refused(option: str, value: float, message: str) -> None:
    with pytest.raises(RolloutError) as caught:
        RolloutPolicy(**{option: value})
    # before: nan passed every gate (a wave with 50 % errors passed), inf/nan windows crashed after the canary was sent
    assert caught.value.message == message + "; nothing was sent"
    assert caught.value.hint.startswith("e.g. --" if message.startswith("--") else f"e.g. RolloutPolicy({option}=")


@pytest.mark.parametrize(("changes", "message", "hint"), [
    ({"url": "ftp://files.example/bundles/new.tar"}, "--url-base: devices would refuse the deploy command: args.url: "
     "'ftp://files.example/bundles/new.tar' does not match the pattern '^(https?|file)://'; nothing was sent",
     "devices download over https://, http:// or file://: give --url-base https://HOST/PATH, or --inbox DIR"),
    ({"bundle_id": "x" * 300}, "--bundle-id: devices would refuse the deploy command: args.bundle_id: string of 300 "
     "characters is longer than 128; nothing was sent",
     "give --bundle-id of 1 to 128 characters, or leave it out (default <name>-<12 hex of the manifest hash>)"),
])  # fmt: skip
def test_a_deploy_command_no_device_would_take_is_refused_before_anything_is_saved(store: FleetStore, changes: dict[str, str],
                                                                                    message: str, hint: str) -> None:  # fmt: skip
    devices = Devices(store, lambda d, m: _healthy(devices, d, m))
    _fleet(store, ["a", "b"], devices=devices)

    with pytest.raises(RolloutError) as caught:
        _rollout(store, devices, artifact=_artifact(**changes), waves=("1", "100%"))

    # before: the record was saved, then the first send failed the schema: "stopped after commands went out"
    assert (caught.value.message, caught.value.hint) == (message, hint)
    assert devices.sent == [] and StoreRolloutLog(store).recent(5) == []


def test_the_record_saves_fast_enough_for_ten_thousand_devices(tmp_path: Path) -> None:
    from edgekit.fleet.rollout_state import RolloutRecord

    now = _now()
    names = [f"dev-{i:05d}" for i in range(10_000)]
    result = {"wave": 1, "command_id": "c" * 32, "sent_at": now.isoformat(), "outcome": "succeeded", "reason": None,
              "step": None, "hint": None, "answered_at": now.isoformat(), "seconds": 0.5}  # fmt: skip
    record = RolloutRecord("r", FLEET, NEW, "file:///b.tar", "0" * 64, "deploying", tuple(names[:1]), tuple(names), now, now,
                           previous_bundles={d: "old-bundle-1" for d in names}, outcomes={d: "succeeded" for d in names},
                           device_results={d: dict(result) for d in names},
                           waves=({"index": 1, "spec": "100%", "devices": names, "state": "deploying", "health": {"silent": []}},))  # fmt: skip
    started = time.perf_counter()
    data = record.to_json()
    # the engine saves each SEND_CHUNK of devices before sending it, and every progress_s: dataclasses.asdict took
    # about 0.3 s here (1 s under a profiler), a copy of each device's dict takes a few ms
    assert time.perf_counter() - started < 0.1
    assert RolloutRecord.from_json(data) == record
    data["device_results"]["dev-00000"]["outcome"] = "changed"
    data["waves"][0]["devices"].append("x")
    assert record.device_results["dev-00000"]["outcome"] == "succeeded" and len(record.waves[0]["devices"]) == 10_000
