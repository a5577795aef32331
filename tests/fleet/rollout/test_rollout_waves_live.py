"""Waves, target checks and failure reasons against a live fleet: real Mosquitto, the real collector and SQLite
store, simulated devices; the CLI through its handler, the report through ``edgekit fleet report``."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from edgekit.fleet.rollout import RolloutPolicy, TargetMismatchError, run_rollout
from edgekit.fleet.rollout_bundle import prepare_bundle
from edgekit.fleet.simulate import BundleBehaviour
from tests.fleet.simulate.test_fleet_cli import _parser
from tests.runtime.agent.mosquitto import MessageRecorder

WAVES = RolloutPolicy(waves=("1", "50%", "100%"), health_window_s=1.0, deploy_timeout_s=10.0, poll_s=0.1)


def _deploy_cli(fleet, bundle, *extra: str) -> list[str]:
    return ["deploy", str(bundle), "--broker", fleet.broker.url, "--store", fleet.store_url, "--health-window-s", "1",
            "--deploy-timeout-s", "10", *extra]  # fmt: skip


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def test_waves_go_out_in_order_with_a_gate_after_each_but_the_last(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=4)
    artifact = prepare_bundle(signed_bundle("vision-waves"), key=fleet_keys[1])

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu", policy=WAVES)

    assert record.state == "completed", record.reason
    devices = sorted(fleet.simulator.agents)
    assert [w["devices"] for w in record.waves] == [devices[:1], devices[1:2], devices[2:]]  # 1, up to 2, up to 4
    assert [w["state"] for w in record.waves] == ["passed"] * 3
    assert [bool(w["health"]) for w in record.waves] == [True, True, False]  # no gate after the last wave
    assert record.waves[0]["health"]["devices"] == 1 and record.waves[1]["health"]["devices"] == 2  # switched so far
    assert all(w["health"]["errors"] == 0 and w["health"]["windows"] > 0 for w in record.waves[:2])
    for earlier, later in zip(record.waves, record.waves[1:]):
        assert _time(earlier["finished_at"]) <= _time(later["started_at"])
        last_answer = max(_time(record.device_results[d]["answered_at"]) for d in earlier["devices"])
        assert all(_time(record.device_results[d]["sent_at"]) >= last_answer - dt.timedelta(seconds=1) for d in later["devices"])
        assert earlier["seconds"] >= 1.0  # the gate watched for the whole window
    assert {d: r["wave"] for d, r in record.device_results.items()} == {devices[0]: 1, devices[1]: 2, devices[2]: 3, devices[3]: 3}
    assert all(r["outcome"] == "succeeded" and r["reason"] is None and r["seconds"] is not None for r in record.device_results.values())
    assert set(fleet.simulator.bundles().values()) == {artifact.bundle_id}
    assert record.finished_at is not None and record.to_json()["seconds"] >= 2.0


def test_a_failing_gate_stops_the_waves_and_rolls_back_every_switched_device(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=4)
    artifact = prepare_bundle(signed_bundle("vision-degrades"), key=fleet_keys[1])
    slowed: list[int] = []

    def slow_down_at_wave_2(record) -> None:  # the bundle degrades once more devices run it (simulated: 6x latency)
        if not slowed and record.waves[1]["state"] == "deploying":
            slowed.append(1)
            for agent in fleet.simulator.agents.values():
                agent.behaviours[artifact.bundle_id] = BundleBehaviour(latency_factor=6.0)

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu", policy=WAVES,
                         on_update=slow_down_at_wave_2)  # fmt: skip

    assert record.state == "rolled_back"
    assert record.reason.startswith("wave 2 (50%) gate: p99 grew from"), record.reason
    assert [w["state"] for w in record.waves] == ["passed", "failed", "not_started"]
    devices = sorted(fleet.simulator.agents)
    assert [record.outcomes[d] for d in devices] == ["rolled_back", "rolled_back", "not_started", "not_started"]
    assert all(record.device_results[d]["rollback"] == "succeeded" for d in devices[:2])
    assert set(fleet.simulator.bundles().values()) == {"demo-v1"}
    untouched = [e for d in devices[2:] for e in fleet.store.events(fleet="sim", device=d, limit=100) if e.kind.startswith("deploy")]
    assert untouched == []


def test_a_target_mismatch_is_refused_before_anything_is_sent_and_forced_on_request(live_fleet, signed_bundle, fleet_keys,
                                                                                     capsys) -> None:  # fmt: skip
    fleet = live_fleet(devices=2, targets=("jetson-orin-nano-8gb", "raspberry-pi-5"))
    bundle = signed_bundle("vision-x86")  # built for x86-64-cpu
    devices = ",".join(sorted(fleet.simulator.agents))
    args = _parser().parse_args(_deploy_cli(fleet, bundle, "--devices", devices, "--key", str(fleet_keys[1])))
    with MessageRecorder(fleet.broker, ["edgekit/v1/sim/+/cmd"]) as recorder:
        with pytest.raises(TargetMismatchError) as info:
            args.func(args)
        message = str(info.value)
        assert "is built for target 'x86-64-cpu', but 2 of the 2 selected device(s) do not report it" in message
        assert "jetson-orin-nano-8gb-000 reports target 'jetson-orin-nano-8gb'" in message
        assert "raspberry-pi-5-001 reports target 'raspberry-pi-5'; nothing was sent" in message and "--force" in info.value.hint
        assert not recorder.wait_for(lambda ms: len(ms) > 0, timeout_s=0.5)  # no command went out

        forced = _parser().parse_args(_deploy_cli(fleet, bundle, "--devices", devices, "--key", str(fleet_keys[1]), "--force",
                                                  "--canary", "1", "--json"))  # fmt: skip
        assert forced.func(forced) == 0
        assert recorder.wait_for(lambda ms: len(ms) == 2)
    out, err = capsys.readouterr()
    record = json.loads(out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["force"] is True
    assert record["forced"] == {"jetson-orin-nano-8gb-000": "reports target 'jetson-orin-nano-8gb'",
                                "raspberry-pi-5-001": "reports target 'raspberry-pi-5'"}  # fmt: skip
    assert "forced jetson-orin-nano-8gb-000: reports target 'jetson-orin-nano-8gb', bundle target x86-64-cpu" in err


def test_a_device_that_reports_no_target_needs_force(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=1, record_targets=False)  # like a real agent today: nothing in the store says its target
    artifact = prepare_bundle(signed_bundle("vision-unknown"), key=fleet_keys[1])
    device = next(iter(fleet.simulator.agents))
    with pytest.raises(TargetMismatchError, match=rf"{device} reports no target; nothing was sent"):
        run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, devices=[device], policy=WAVES)
    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, devices=[device],
                         policy=RolloutPolicy(canary="1", health_window_s=1.0, deploy_timeout_s=10.0, poll_s=0.1, force=True))  # fmt: skip
    assert record.state == "completed" and record.forced == {device: "reports no target"}
    assert {s.device: s.target for s in fleet.store.device_summaries("sim")} == {device: None}  # a deploy is not a report


def test_failed_devices_are_listed_with_their_agents_reason_in_deploy_and_in_report(live_fleet, signed_bundle, fleet_keys,
                                                                                     capsys) -> None:  # fmt: skip
    from edgekit.cli.main import main

    bundle = signed_bundle("vision-golden")
    artifact = prepare_bundle(bundle, key=fleet_keys[1])
    fleet = live_fleet(devices=3, behaviours={artifact.bundle_id: BundleBehaviour(self_check_passes=False)})
    args = _parser().parse_args(_deploy_cli(fleet, bundle, "--target", "x86-64-cpu", "--waves", "1,100%", "--key", str(fleet_keys[1])))

    assert args.func(args) == 1
    out, err = capsys.readouterr()
    err += out  # progress on stderr, the outcome on stdout
    canary = sorted(fleet.simulator.agents)[0]
    assert "deploying wave 1/2 (1: 1 device)" in err and "wave 2/2" not in err
    assert "stopped vision-golden" in err and "wave 1 (1): the deploy did not succeed on 1 of 1 device(s)" in err
    assert "wave 1 (1, 1 device): failed, " in err and "s: the deploy failed on 1 of 1 device(s)" in err
    assert "wave 2 (100%, 2 devices): not_started" in err
    assert f"{canary}: failed (wave 1): deploy of {artifact.url} failed at self_check: golden outputs differ" in err
    assert "hint: the bundle does not reproduce its golden outputs on this device" in err

    assert main(["fleet", "report", "--store", fleet.store_url, "--since", "1h"]) == 0
    report_err = "".join(capsys.readouterr())
    assert "fleet deploy rollouts since" in report_err and f"{canary}: failed (wave 1): deploy of" in report_err
    assert main(["fleet", "report", "--store", fleet.store_url, "--since", "1h", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (stored,) = report["rollout_records"]
    assert stored["state"] == "stopped" and stored["device_results"][canary]["step"] == "self_check"
    assert "golden outputs differ" in stored["device_results"][canary]["reason"]


def test_a_device_that_never_answers_times_out_with_what_to_check(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=2)
    artifact = prepare_bundle(signed_bundle("vision-silent"), key=fleet_keys[1])
    first = sorted(fleet.simulator.agents)[0]
    crashed: list[str] = []

    def crash_the_first_device(record) -> None:  # it drops off the network as the rollout starts
        if not crashed:
            crashed.append(first)
            fleet.simulator.crash(first)

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu",
                         policy=RolloutPolicy(waves=("1", "100%"), health_window_s=1.0, deploy_timeout_s=2.0, poll_s=0.1),
                         on_update=crash_the_first_device)  # fmt: skip

    assert record.state == "stopped" and record.outcomes == {first: "timeout", sorted(fleet.simulator.agents)[1]: "not_started"}
    result = record.device_results[first]
    assert result["reason"].startswith("no deploy_result from the device within 2 s") and "edgekit fleet status" in result["hint"]
    assert result["answered_at"] is None and result["seconds"] is None


def test_a_deploy_interrupted_while_it_watches_records_a_stopped_rollout(live_fleet, signed_bundle, fleet_keys) -> None:
    """Ctrl-C during wave 1's health gate: before, the record stayed "watching" for good (the dashboard and
    ``fleet report`` showed a rollout in progress that no process was running). Now it is stopped, says that no
    rollback was sent and which devices keep the bundle, and the later waves are not_started."""
    from edgekit.fleet.rollout_state import open_rollout_log

    fleet = live_fleet(devices=4)
    artifact = prepare_bundle(signed_bundle("vision-interrupted"), key=fleet_keys[1])

    def ctrl_c_while_watching(record) -> None:
        if record.state == "watching":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu", policy=WAVES,
                    on_update=ctrl_c_while_watching)  # fmt: skip
    log = open_rollout_log(fleet.store_url)
    try:
        (record,) = log.recent(10)
    finally:
        log.close()
    devices = sorted(fleet.simulator.agents)
    assert record.state == "stopped" and record.finished_at is not None
    assert record.reason == ("the deploy was interrupted (Ctrl-C) during wave 1 (1, watching); no rollback was sent: 1 device(s) "
                             "that took the bundle keep it (roll them back by deploying the previous bundle)")  # fmt: skip
    assert [w["state"] for w in record.waves] == ["failed", "not_started", "not_started"]
    assert record.outcomes[devices[0]] == "succeeded"
    assert {record.outcomes[d] for d in devices[1:]} == {"not_started"}
