"""Rollouts against a live fleet: real Mosquitto, real collector and SQLite store, simulated devices."""

from __future__ import annotations

import pytest

from edgekit.fleet.rollout import RolloutPolicy, run_rollout
from edgekit.fleet.rollout_bundle import prepare_bundle
from edgekit.fleet.rollout_state import open_rollout_log
from edgekit.fleet.simulate import BundleBehaviour, DeployTiming

FAST = RolloutPolicy(canary="25%", health_window_s=1.0, deploy_timeout_s=10.0, poll_s=0.1)


def _deploy_events(fleet, device: str) -> list:
    return [e for e in fleet.store.events(fleet="sim", device=device, limit=1000) if e.kind.startswith("deploy")]


def test_healthy_canary_widens_to_every_device(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=4)
    artifact = prepare_bundle(signed_bundle("vision-v2"), key=fleet_keys[1])
    states: list[str] = []

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu",
                         policy=FAST, on_update=lambda r: states.append(r.state))  # fmt: skip

    assert record.state == "completed", record.reason
    assert len(record.canary) == 1 and len(record.devices) == 4
    assert set(record.outcomes.values()) == {"succeeded"}
    assert states.index("watching") < len(states) - 1 - states[::-1].index("deploying")
    assert set(fleet.simulator.bundles().values()) == {artifact.bundle_id}
    assert record.health["errors"] == 0 and record.health["windows"] > 0
    assert record.health["p99_ratio"] is not None and record.health["p99_ratio"] < FAST.max_p99_ratio
    with open_rollout_log(fleet.store_url) as log:
        stored = log.get(record.rollout_id)
    assert stored is not None and stored.state == "completed" and stored.outcomes == record.outcomes
    steps = [e.payload["details"].get("step") for e in _deploy_events(fleet, record.canary[0])]
    assert {"started", "downloaded", "signature_verified", "switched", "watching"} <= set(steps)


def test_slow_canary_is_rolled_back_and_the_rest_untouched(live_fleet, signed_bundle, fleet_keys) -> None:
    # 4x slower: the device's own health watch (errors only) passes; the rollout's p99 check does not
    bundle = signed_bundle("vision-slow")
    artifact = prepare_bundle(bundle, key=fleet_keys[1])
    fleet = live_fleet(devices=4, behaviours={artifact.bundle_id: BundleBehaviour(latency_factor=4.0)})

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu",
                         policy=FAST)  # fmt: skip

    assert record.state == "rolled_back"
    assert "p99 grew" in record.reason
    canary = record.canary[0]
    assert record.outcomes[canary] == "rolled_back"
    bundles = fleet.simulator.bundles()
    assert set(bundles.values()) == {"demo-v1"}, bundles
    untouched = [d for d in record.devices if d != canary]
    assert all(record.outcomes[d] == "not_started" for d in untouched)
    assert all(not _deploy_events(fleet, d) for d in untouched)
    rollbacks = [e for e in fleet.store.events(fleet="sim", device=canary, limit=1000) if e.kind == "rollback_result"]
    assert rollbacks and rollbacks[0].payload["details"]["outcome"] == "succeeded"


def test_failing_inferences_on_canary_stop_the_rollout(live_fleet, signed_bundle, fleet_keys) -> None:
    # the device's own watch tolerates every error (so it keeps the bundle: its 0.3 s watch may see a single request,
    # which fails 30% of the time); the rollout allows 5%
    artifact = prepare_bundle(signed_bundle("vision-flaky"), key=fleet_keys[1])
    fleet = live_fleet(devices=4, behaviours={artifact.bundle_id: BundleBehaviour(error_rate=0.3)},
                       deploy_timing=DeployTiming(step_s=0.01, watch_s=0.3, max_error_rate=1.0))  # fmt: skip

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url,
                         devices=sorted(fleet.simulator.agents)[:2], policy=RolloutPolicy(canary="1", health_window_s=1.0,
                         deploy_timeout_s=10.0, poll_s=0.1, max_error_rate=0.05))  # fmt: skip

    assert record.state == "rolled_back", record.reason
    assert "error rate" in record.reason and record.health["errors"] > 0
    assert fleet.simulator.bundles()[record.canary[0]] == "demo-v1"


def test_canary_that_rolls_itself_back_stops_the_rollout(live_fleet, signed_bundle, fleet_keys) -> None:
    # the agent's own health watch (5% errors) rolls back: the rollout sees deploy_result rolled_back
    artifact = prepare_bundle(signed_bundle("vision-crashy"), key=fleet_keys[1])
    fleet = live_fleet(devices=3, behaviours={artifact.bundle_id: BundleBehaviour(error_rate=0.6)})

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu",
                         policy=RolloutPolicy(canary="1", health_window_s=1.0, deploy_timeout_s=10.0, poll_s=0.1))  # fmt: skip

    assert record.state == "stopped"
    assert record.outcomes[record.canary[0]] == "rolled_back"
    assert f"{record.canary[0]} rolled_back" in record.reason
    assert set(fleet.simulator.bundles().values()) == {"demo-v1"}


def test_golden_check_failure_on_canary_stops_before_anyone_switches(live_fleet, signed_bundle, fleet_keys) -> None:
    artifact = prepare_bundle(signed_bundle("vision-broken"), key=fleet_keys[1])
    fleet = live_fleet(devices=4, behaviours={artifact.bundle_id: BundleBehaviour(self_check_passes=False)})

    record = run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="x86-64-cpu",
                         policy=FAST)  # fmt: skip

    assert record.state == "stopped"
    assert "wave 1 (25%): the deploy did not succeed on 1 of 1 device(s)" in record.reason and "failed" in record.reason
    assert set(fleet.simulator.bundles().values()) == {"demo-v1"}
    result = [e for e in _deploy_events(fleet, record.canary[0]) if e.kind == "deploy_result"][0]
    assert result.level == "error" and "self_check" in result.message


def test_unknown_device_names_the_device_and_suggests_one(live_fleet, signed_bundle, fleet_keys) -> None:
    from edgekit.fleet.rollout import UnknownDeviceError

    fleet = live_fleet(devices=2)
    artifact = prepare_bundle(signed_bundle("vision-v3"), key=fleet_keys[1])
    with pytest.raises(UnknownDeviceError, match=r"unknown device 'x86-64-cpu-00'.*did you mean"):
        run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, devices=["x86-64-cpu-00"])


def test_no_device_of_the_target(live_fleet, signed_bundle, fleet_keys) -> None:
    from edgekit.fleet.rollout import NoDevicesMatchError

    fleet = live_fleet(devices=2)
    artifact = prepare_bundle(signed_bundle("vision-v4"), key=fleet_keys[1])
    with pytest.raises(NoDevicesMatchError, match=r"no devices match target 'raspberry-pi-5'.*x86-64-cpu"):
        run_rollout(artifact, broker_url=fleet.broker.url, store_url=fleet.store_url, target="raspberry-pi-5")
