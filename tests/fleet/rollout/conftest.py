"""A small live fleet for rollout tests: a real Mosquitto, the real collector writing a real SQLite
store, and simulated devices (real MQTT clients) that answer deploy and rollback commands."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.simulate import DeployTiming, FleetSimulator, SimulationConfig
from tests.runtime.agent.mosquitto import MosquittoBroker, mosquitto, mosquitto_factory  # noqa: F401 (fixtures)
from tests.runtime.agent_service.bundles import make_bundle


@dataclass
class LiveFleet:
    broker: MosquittoBroker
    store_url: str
    store: Any
    collector: Any
    simulator: FleetSimulator

    def wait_windows(self, per_device: int, timeout_s: float = 10.0) -> None:
        """Wait until the store holds at least ``per_device`` windows of every simulated device."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            summaries = {s.device: s.windows for s in self.store.device_summaries("sim")}
            if len(summaries) == len(self.simulator.agents) and min(summaries.values()) >= per_device:
                return
            time.sleep(0.05)
        raise AssertionError(f"the store did not get {per_device} windows per device in {timeout_s} s: {summaries}")


@pytest.fixture
def live_fleet(mosquitto: MosquittoBroker, tmp_path: Path) -> Iterator[Callable[..., LiveFleet]]:  # noqa: F811
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.store import open_store

    started: list[LiveFleet] = []

    def start(devices: int = 4, targets: tuple[str, ...] = ("x86-64-cpu",), record_targets: bool = True, **simulation: Any) -> LiveFleet:
        store_url = f"sqlite:///{tmp_path}/fleet.db"
        store = open_store(store_url)
        collector = Collector(mosquitto.url, store, client_id="test-collector", flush_interval_s=0.05).start()
        simulation.setdefault("deploy_timing", DeployTiming(step_s=0.01, watch_s=0.3))
        # Full load at every hour: a simulated x86 device runs about 4 inferences a second, so a 0.1 s window holds
        # 0.4 on average; in the daily cycle's low hours (00:00-01:00 UTC for seed 0) the baseline before a rollout
        # had none, hence no p99, and the health gates judged nothing.
        simulation.setdefault("load", 1.0)
        config = SimulationConfig(mosquitto.url, devices=devices, rate_per_s=10.0, targets=targets, verify_downloads=True,
                                  **simulation)  # fmt: skip
        simulator = FleetSimulator(config)
        if record_targets:  # the simulator's devices report their target; real agents do not yet
            simulator.record_targets(store)
        simulator.start()
        fleet = LiveFleet(mosquitto, store_url, store, collector, simulator)
        started.append(fleet)
        fleet.wait_windows(20)  # a baseline of about 8 inferences per device (P(none) ~ 0.02 %)
        return fleet

    yield start
    for fleet in started:
        fleet.simulator.stop()
        fleet.collector.stop()
        fleet.store.close()


@pytest.fixture(scope="session")
def fleet_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from edgekit.bundle.signing import generate_keypair

    directory = tmp_path_factory.mktemp("keys")
    generate_keypair(directory / "fleet.key.pem", directory / "fleet.pub.pem")
    return directory / "fleet.key.pem", directory / "fleet.pub.pem"


@pytest.fixture
def signed_bundle(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Callable[[str], Path]:
    """``signed_bundle(name, **make_bundle_options)``: a real bundle directory (target x86-64-cpu), signed with
    the test fleet key."""
    from edgekit.bundle.signing import sign_bundle

    def build(name: str, **options: Any) -> Path:
        root = make_bundle(tmp_path / name, name=name, **options)
        sign_bundle(root, fleet_keys[0])
        return root

    return build
