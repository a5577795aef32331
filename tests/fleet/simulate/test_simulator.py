"""Simulated devices on a real Mosquitto: schema-valid messages, status and will, commands, deploys."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from edgekit.fleet.commands import build_command
from edgekit.fleet.sim.profiles import synthetic_profile
from edgekit.fleet.simulate import BundleBehaviour, DeployTiming, FleetSimulator, SimulationConfig, SimulationError
from edgekit.target import default_registry
from edgekit_runtime.schemas import schema_problems
from tests.runtime.agent.mosquitto import MessageRecorder, mosquitto, mosquitto_factory  # noqa: F401 (fixtures)

SCHEMA_BY_KIND = {"telemetry": "telemetry.v1", "status": "status.v1", "events": "event.v1"}


def _publish(broker, topic: str, payload: bytes) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect(broker.host, broker.port)
    client.loop_start()
    client.publish(topic, payload, qos=1).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


def _events(recorder: MessageRecorder, device: str, kind: str | None = None) -> list[dict]:
    found = [m.json() for m in recorder.on(f"{device}/events")]
    return [e for e in found if kind is None or e["kind"] == kind]


def test_every_target_has_a_plausible_synthetic_profile() -> None:
    for target in default_registry().all():
        profile = synthetic_profile(target)
        assert 0.3 <= profile.latency_p50_ms <= 100, target.name
        assert 0 < profile.idle_power_mw < profile.active_power_mw, target.name
        assert profile.inferences_per_s > 0
    nano = synthetic_profile(default_registry().get("jetson-orin-nano-8gb"))
    assert nano.latency_p50_ms == pytest.approx(4.0)  # 4 GOP on 5% of 20 dense INT8 TOPS
    assert nano.active_power_mw == pytest.approx(10_500)  # 70% of the 15 W mode the peak is quoted at
    pi = synthetic_profile(default_registry().get("raspberry-pi-5"))
    assert not pi.has_gpu and pi.latency_p50_ms > nano.latency_p50_ms


def test_messages_are_schema_valid_with_status_and_will(mosquitto) -> None:  # noqa: F811
    with MessageRecorder(mosquitto) as recorder:
        simulator = FleetSimulator(SimulationConfig(mosquitto.url, devices=3, rate_per_s=20.0))
        simulator.start()
        recorder.wait_for(lambda ms: sum(m.topic.endswith("/telemetry") for m in ms) >= 15, timeout_s=10)
        victim = sorted(simulator.agents)[0]
        simulator.crash(victim)
        assert recorder.wait_for(lambda ms: any(m.topic.endswith(f"{victim}/status") and m.json()["state"] == "offline"
                                                for m in ms), timeout_s=10)  # fmt: skip
        simulator.stop()
    assert recorder.messages
    for message in recorder.messages:
        kind = message.topic.rsplit("/", 1)[1]
        assert schema_problems(message.json(), SCHEMA_BY_KIND[kind]) == [], message.topic
    telemetry = [m.json() for m in recorder.on("/telemetry")]
    assert {t["power"]["source"] for t in telemetry} == {"synthetic"}
    for device in simulator.agents:
        seqs = [t["seq"] for t in telemetry if t["device"] == device]
        assert seqs == sorted(seqs) and seqs[0] == 1
    will = [m.json() for m in recorder.on(f"{victim}/status")][-1]
    assert will["reason"] == "connection lost"  # published by the broker: the simulator never sent it
    other = sorted(simulator.agents)[1]
    assert [m.json() for m in recorder.on(f"{other}/status")][-1]["reason"] == "agent stopped"
    started = [e for e in _events(recorder, other) if e["kind"] == "serving"]
    assert started and started[0]["details"]["target"] == other.rsplit("-", 1)[0] and started[0]["details"]["synthetic"]


def test_commands_are_answered_like_the_agent_does(mosquitto) -> None:  # noqa: F811
    config = SimulationConfig(mosquitto.url, devices=1, rate_per_s=1.0)
    with MessageRecorder(mosquitto) as recorder, FleetSimulator(config) as simulator:
        device = next(iter(simulator.agents))
        cmd = simulator.agents[device].topics.cmd
        ping = build_command("ping")
        _publish(mosquitto, cmd, json.dumps(ping).encode())
        _publish(mosquitto, cmd, json.dumps(ping).encode())  # a redelivery: ignored
        _publish(mosquitto, cmd, b"{not json")
        _publish(mosquitto, cmd, json.dumps({"schema": "edgekit.command/1", "id": "x1", "command": "explode"}).encode())
        _publish(mosquitto, cmd, json.dumps(build_command("set_interval", {"interval_s": 5})).encode())
        assert recorder.wait_for(lambda ms: len([m for m in ms if m.topic.endswith("/events")]) >= 5, timeout_s=10)
        time.sleep(0.2)
        assert simulator.agent_state(device)["interval_s"] == 5.0
    pongs = _events(recorder, device, "pong")
    assert len(pongs) == 1 and pongs[0]["command_id"] == ping["id"]
    rejected = _events(recorder, device, "command_rejected")
    assert len(rejected) == 2
    assert "not valid UTF-8 JSON" in rejected[0]["message"]
    assert "does not match schema command.v1" in rejected[1]["message"] and rejected[1]["command_id"] == "x1"
    assert _events(recorder, device, "interval_changed")[0]["details"]["interval_s"] == 5.0


def test_deploy_switches_bundle_and_rollback_goes_back(mosquitto) -> None:  # noqa: F811
    timing = DeployTiming(step_s=0.01, watch_s=0.2)
    config = SimulationConfig(mosquitto.url, devices=1, rate_per_s=10.0, deploy_timing=timing,
                              behaviours={"broken": BundleBehaviour(self_check_passes=False)})  # fmt: skip
    with MessageRecorder(mosquitto) as recorder, FleetSimulator(config) as simulator:
        device = next(iter(simulator.agents))
        cmd = simulator.agents[device].topics.cmd
        deploy = build_command("deploy", {"bundle_id": "v2", "url": "https://example.invalid/v2.tar", "sha256": "a" * 64})
        _publish(mosquitto, cmd, json.dumps(deploy).encode())
        assert recorder.wait_for(lambda ms: any(m.topic.endswith("/events") and m.json()["kind"] == "deploy_result" for m in ms))
        time.sleep(0.3)
        assert simulator.agent_state(device) | {"interval_s": 0, "seq": 0} == {"bundle": "v2", "previous_bundle": "demo-v1",
                                                                               "interval_s": 0, "seq": 0}  # fmt: skip
        broken = build_command("deploy", {"bundle_id": "broken", "url": "https://example.invalid/b.tar", "sha256": "b" * 64})
        _publish(mosquitto, cmd, json.dumps(broken).encode())
        assert recorder.wait_for(lambda ms: len([m for m in ms if m.topic.endswith("/events") and m.json()["kind"] == "deploy_result"]) == 2)
        rollback = build_command("rollback", {"bundle_id": "demo-v1"})
        _publish(mosquitto, cmd, json.dumps(rollback).encode())
        assert recorder.wait_for(lambda ms: any(m.topic.endswith("/events") and m.json()["kind"] == "rollback_result" for m in ms))
        time.sleep(0.3)
        assert simulator.agent_state(device)["bundle"] == "demo-v1"
    steps = [e["details"]["step"] for e in _events(recorder, device, "deploy_progress") if e["command_id"] == deploy["id"]]
    assert steps == ["started", "downloaded", "signature_verified", "files_verified", "self_check_passed", "switched", "watching"]
    results = _events(recorder, device, "deploy_result")
    assert results[0]["details"]["outcome"] == "succeeded" and results[0]["command_id"] == deploy["id"]
    assert results[1]["details"]["outcome"] == "failed" and results[1]["details"]["step"] == "self_check"
    assert _events(recorder, device, "rollback_result")[0]["details"]["outcome"] == "succeeded"
    statuses = [m.json()["bundle"]["id"] for m in recorder.on(f"{device}/status") if m.json()["state"] == "online"]
    assert "v2" in statuses and statuses[-1] == "demo-v1"  # the retained status follows the bundle
    telemetry_bundles = [m.json()["bundle"]["id"] for m in recorder.on(f"{device}/telemetry")]
    assert "v2" in telemetry_bundles and telemetry_bundles[0] == "demo-v1"


def test_backlog_of_many_devices_is_all_acknowledged(mosquitto) -> None:  # noqa: F811
    config = SimulationConfig(mosquitto.url, devices=30, rate_per_s=0.01, fleet=f"load-{uuid.uuid4().hex[:6]}")
    with FleetSimulator(config).start(telemetry=False) as simulator:
        sent = simulator.publish_backlog(10, window_s=10.0)
        assert simulator.flush(30)
        counters = simulator.counters()
    assert sent == 300 and counters.connected == 30
    assert counters.acked == counters.published >= 300 + 30  # windows, plus a status and an event per device


@pytest.mark.parametrize(("options", "message"), [
    ({"devices": 0}, "devices must be an integer from 1 to 100000"),
    ({"rate_per_s": 0.0}, "rate must be > 0"),
    ({"targets": ("jetson-nano-9000",)}, "unknown target 'jetson-nano-9000'"),
    ({"fleet": "a/b"}, "fleet id 'a/b' contains '/'"),
    ({"load": 0.0}, "load must be from 0.05 to 1"),
])  # fmt: skip
def test_bad_configuration_is_refused_with_a_clear_message(options: dict, message: str) -> None:
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError, match=message):
        FleetSimulator(SimulationConfig("mqtt://127.0.0.1:1", **options))


def test_unreachable_broker_names_the_url() -> None:
    from tests.runtime.agent.mosquitto import free_port

    url = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(SimulationError, match=rf"only 0 of 2 simulated devices connected to {url}"):
        FleetSimulator(SimulationConfig(url, devices=2)).start(wait_s=1.0)


def test_bundle_behaviour_option_is_parsed_and_checked() -> None:
    from edgekit.cli.fleet_simulate import parse_behaviour

    assert parse_behaviour("v2:error_rate=0.3,self_check=fail") == ("v2", BundleBehaviour(error_rate=0.3, self_check_passes=False))
    with pytest.raises(SimulationError, match="cannot read 'speed=2'"):
        parse_behaviour("v2:speed=2")
    with pytest.raises(SimulationError, match="has no ID:settings"):
        parse_behaviour("v2")


def test_a_fixed_load_replaces_the_daily_cycle_at_every_hour() -> None:
    import datetime as dt

    from edgekit.fleet.sim.device import VirtualAgent
    from edgekit.fleet.sim.profiles import profiles_for

    def agent(load: float | None) -> VirtualAgent:
        return VirtualAgent("sim", "d0", profiles_for(["x86-64-cpu"])[0], send=lambda *a: None, schedule=lambda *a: None, seed=1, load=load)

    midnight = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    hours = [midnight + dt.timedelta(hours=h) for h in range(24)]
    cycled, fixed = agent(None), agent(0.6)
    assert max(cycled.utilisation(t) for t in hours) - min(cycled.utilisation(t) for t in hours) > 0.3
    assert all(0.4 < fixed.utilisation(t) < 0.8 for t in hours)  # 0.6 plus the per-window noise (sigma 0.05)
