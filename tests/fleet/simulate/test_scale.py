"""A bigger simulated fleet on a real Mosquitto: paced connecting, progress-based start, shards in
processes, crashed devices' last wills. (The 10,000-device run is ``scripts/sim_scale.py``.)"""

from __future__ import annotations

import json
import time

import pytest

from edgekit.fleet.sim.limits import raise_open_files_limit
from edgekit.fleet.sim.shards import ShardedFleetSimulator, auto_processes
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig, SimulationError
from edgekit_runtime.agent.topics import TelemetryError
from tests.runtime.agent.mosquitto import MessageRecorder, mosquitto, mosquitto_factory  # noqa: F401 (fixtures)

BIG_BROKER = ["max_connections -1", "connection_messages false"]


def _offline_wills(recorder: MessageRecorder, devices: list[str]) -> set[str]:
    found = set()
    for device in devices:
        for message in recorder.on(f"/{device}/status"):
            body = message.json()
            if body["state"] == "offline" and body["reason"] == "connection lost":
                found.add(device)
    return found


def test_600_devices_connect_paced_and_a_crash_sends_the_will(mosquitto_factory) -> None:  # noqa: F811
    broker = mosquitto_factory(extra_config=BIG_BROKER)
    config = SimulationConfig(broker.url, devices=600, rate_per_s=1.0, load=0.6, max_connecting=16)
    simulator = FleetSimulator(config)
    peak = {"connecting": 0}
    original = simulator.mux._start_connects

    def watch() -> None:  # runs on the mux thread
        original()
        peak["connecting"] = max(peak["connecting"], simulator.mux.connecting)

    simulator.mux._start_connects = watch  # type: ignore[method-assign]
    with MessageRecorder(broker, ("edgekit/v1/sim/+/status",)) as recorder:
        simulator.start()
        try:
            assert simulator.counters().connected == 600 and simulator.connect_seconds is not None
            assert 1 <= peak["connecting"] <= 16  # never more than max_connecting waiting for a CONNACK
            assert len({d for d in simulator.agents}) == 600
            deadline = time.monotonic() + 20
            while simulator.counters().windows < 600 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert simulator.counters().windows >= 600  # about one window a device
            victims = sorted(simulator.agents)[:3]
            for device in victims:
                simulator.crash(device)
            assert recorder.wait_for(lambda ms: _offline_wills(recorder, victims) == set(victims), timeout_s=10)
        finally:
            stopping = time.monotonic()
            simulator.stop(flush_s=20.0)
        # the crashed devices' unacknowledged messages died with them: they hold up neither flush nor stop
        assert time.monotonic() - stopping < 15.0


def test_start_fails_on_stalled_progress_naming_the_count(tmp_path) -> None:
    from tests.runtime.agent.mosquitto import free_port

    config = SimulationConfig(f"mqtt://127.0.0.1:{free_port()}", devices=5, rate_per_s=1.0)  # nobody listens
    started = time.monotonic()
    with pytest.raises(SimulationError, match=r"only 0 of 5 simulated devices connected .*none more for 1\.5 s"):
        FleetSimulator(config).start(stall_s=1.5)
    assert time.monotonic() - started < 10


def test_shards_in_two_processes_are_one_fleet(mosquitto_factory) -> None:  # noqa: F811
    broker = mosquitto_factory(extra_config=BIG_BROKER)
    config = SimulationConfig(broker.url, devices=90, rate_per_s=2.0, load=0.6, fleet="shards")
    simulator = ShardedFleetSimulator(config, processes=2)
    assert [(s.first_device, s.devices) for s in simulator.shard_configs] == [(0, 45), (45, 45)]
    with MessageRecorder(broker, ("edgekit/v1/shards/#",)) as recorder:
        simulator.start()
        try:
            assert simulator.counters().connected == 90 and len(simulator.pids) == 2
            assert recorder.wait_for(lambda ms: len({m.topic for m in ms if m.topic.endswith("/telemetry")}) == 90, timeout_s=15)
            victim = sorted(simulator.devices)[-1]  # in the second shard
            simulator.crash(victim)
            assert recorder.wait_for(lambda ms: _offline_wills(recorder, [victim]) == {victim}, timeout_s=10)
        finally:
            simulator.stop()
    counters = simulator.counters()
    assert counters.connected == 0 and counters.windows >= 90 and counters.queued == 0
    devices = {json.loads(m.payload)["device"] for m in recorder.on("/telemetry")}
    assert devices == set(simulator.devices)  # the same names as one simulator of the whole fleet
    assert devices == {d for d in FleetSimulator(config).agents}
    with pytest.raises(SimulationError, match="no simulated device"):
        simulator.crash("nope")


def test_auto_processes_and_the_open_files_limit() -> None:
    import resource

    assert auto_processes(100, cpus=2) == 1 and auto_processes(10_000, cpus=2) == 2 and auto_processes(10_000, cpus=1) == 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_open_files_limit(min(soft, 64), what="a few devices") >= min(soft, 64)
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(TelemetryError, match=r"need \d+ open files.*hard RLIMIT_NOFILE"):
            raise_open_files_limit(hard + 1, what="too many devices")


def test_size_dependent_defaults_are_the_whole_fleets() -> None:
    small, big = SimulationConfig("mqtt://127.0.0.1:1", devices=500), SimulationConfig("mqtt://127.0.0.1:1", devices=1500)
    assert (small.resolved().validate_every, small.resolved().keepalive_s) == (1, 30)
    assert (big.resolved().validate_every, big.resolved().keepalive_s) == (100, 60)
    explicit = SimulationConfig("mqtt://127.0.0.1:1", devices=1500, validate_every=1, keepalive_s=30).resolved()
    assert (explicit.validate_every, explicit.keepalive_s) == (1, 30)
    shards = ShardedFleetSimulator(big, processes=2).shard_configs  # 750 devices each, but one fleet of 1,500
    assert [(s.devices, s.validate_every, s.keepalive_s) for s in shards] == [(750, 100, 60), (750, 100, 60)]
