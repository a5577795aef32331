"""A fleet store seeded with a simulated history, and the dashboard serving it on a free port."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from edgekit.fleet.dashboard import DashboardServer

DEVICES = 6
POWER_MODES = {"jetson-orin-nano-8gb": "15W", "jetson-orin-nx-16gb": "MAXN+clocks"}


@dataclass
class SeededDashboard:
    url: str
    store_url: str
    devices: list[str]


@pytest.fixture(scope="module")
def seeded_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededDashboard]:
    from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log
    from edgekit.fleet.sim.seed import device_names, seed_history
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.base import DeviceIdentityRecord, DeviceStatus, RejectedMessage

    store_url = f"sqlite:///{tmp_path_factory.mktemp('dashboard')}/fleet.db"
    with open_store(store_url) as store:
        now = dt.datetime.now(dt.timezone.utc)
        # the Jetsons report their power mode (as agents with nvpmodel do), before their telemetry (the store's fleet
        # aggregates group windows by the power mode known when they arrive); the Raspberry Pis report none
        for name, target in device_names(DEVICES):
            if target.startswith("jetson"):
                mode = POWER_MODES[target]
                identity = DeviceIdentityRecord("sim", name, board=target, soc=None, os="Ubuntu 22.04", l4t="36.4.0",
                                                jetpack="6.1", cuda="12.6", tensorrt="10.3", onnxruntime=None,
                                                power_mode=mode, clocks_locked=mode.endswith("+clocks"), updated_at=now)  # fmt: skip
                store.upsert_status(DeviceStatus(fleet="sim", device=name, state="online", bundle_id="demo-v2", target=target,
                                                 agent_version="sim-1", updated_at=now, identity=identity))  # fmt: skip
        seed_history(store, devices=DEVICES, hours=6, window_s=120.0, now=now)
        store.add_rejected([RejectedMessage("edgekit/v1/sim/x/telemetry", "malformed_json", 12, now),
                            RejectedMessage("edgekit/v1/sim/x/telemetry", "malformed_json", 9, now)])  # fmt: skip
    with open_rollout_log(store_url) as log:
        log.save(RolloutRecord("r1", "sim", "demo-v2", "file:///b.tar", "0" * 64, "completed", ("jetson-orin-nano-8gb-000",),
                               ("jetson-orin-nano-8gb-000", "jetson-orin-nx-16gb-001"), now, now,
                               outcomes={"jetson-orin-nano-8gb-000": "succeeded", "jetson-orin-nx-16gb-001": "succeeded"},
                               health={"error_rate": 0.0, "p99_before_ms": 8.0, "p99_after_ms": 7.5}))  # fmt: skip
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        yield SeededDashboard(server.url, store_url, [name for name, _ in device_names(DEVICES)])


@dataclass
class FleetsDashboard:
    """Four fleets whose devices are in each state: ``a`` online (one agent says ``updating``), ``b`` stale (silent
    for 5 one-minute intervals), ``c`` offline (silent for 2 h), ``d`` one device known only by its target."""

    url: str
    store_url: str


@pytest.fixture(scope="module")
def fleets_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetsDashboard]:
    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.base import DeviceEvent, DeviceStatus

    store_url = f"sqlite:///{tmp_path_factory.mktemp('fleets-dashboard')}/fleet.db"
    now = dt.datetime.now(dt.timezone.utc)
    with open_store(store_url) as store:
        seed_history(store, fleet="a", devices=12, hours=0.5, window_s=60.0, now=now)
        seed_history(store, fleet="b", devices=3, hours=0.5, window_s=60.0, now=now - dt.timedelta(minutes=5))
        seed_history(store, fleet="c", devices=2, hours=0.5, window_s=60.0, now=now - dt.timedelta(hours=2))
        store.set_device_target("d", "ghost-1", "raspberry-pi-5")
        store.upsert_status(DeviceStatus("a", "jetson-orin-nano-8gb-000", "updating", "demo-v2", "jetson-orin-nano-8gb", "sim-1", now))
        store.add_events([DeviceEvent("b", "jetson-orin-nx-16gb-001", "b-1", "self_check_failed", "error", "bad bundle", now),
                          DeviceEvent("a", "raspberry-pi-5-002", "a-1", "bundle_installed", "info", "ok", now)])  # fmt: skip
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        yield FleetsDashboard(server.url, store_url)
