"""FleetStore.agent_versions on SQLite and PostgreSQL: what `fleet deploy` reads to tell simulated devices (``sim-*``)
from real agents before it sends a file:// URL (issue 32 item 6)."""

from __future__ import annotations

import datetime as dt

from edgekit.fleet.rollout_bundle import SIMULATED_AGENT_PREFIX
from edgekit.fleet.sim.device import SIM_AGENT_VERSION
from edgekit.fleet.store.base import DeviceStatus, FleetStore


def test_agent_versions_are_the_last_status_of_each_device(store: FleetStore) -> None:
    at = dt.datetime(2026, 11, 28, 3, 0, tzinfo=dt.timezone.utc)
    store.upsert_statuses([DeviceStatus("lab", "cam-1", "online", None, None, "0.1.0", at),
                           DeviceStatus("lab", "sim-0001", "online", None, None, SIM_AGENT_VERSION, at),
                           DeviceStatus("other", "cam-9", "online", None, None, None, at)])  # fmt: skip
    store.upsert_status(DeviceStatus("lab", "cam-1", "online", None, None, "0.2.0", at + dt.timedelta(minutes=1)))
    assert store.agent_versions("lab") == {("lab", "cam-1"): "0.2.0", ("lab", "sim-0001"): SIM_AGENT_VERSION}
    assert store.agent_versions() == {**store.agent_versions("lab"), ("other", "cam-9"): None}
    assert store.agent_versions("nowhere") == {}
    assert SIM_AGENT_VERSION.startswith(SIMULATED_AGENT_PREFIX)  # the simulator's version is what the check looks for


def test_simulated_devices_are_counted_in_the_store_per_fleet(store: FleetStore) -> None:
    """What `fleet status`, `fleet report` and the dashboard read to say a fleet's numbers are SYNTHETIC."""
    at = dt.datetime(2026, 11, 28, 3, 0, tzinfo=dt.timezone.utc)
    store.upsert_statuses([DeviceStatus("lab", "cam-1", "online", None, None, "0.1.0", at),
                           DeviceStatus("lab", "sim-0001", "online", None, None, SIM_AGENT_VERSION, at),
                           DeviceStatus("lab", "sim-0002", "online", None, None, SIM_AGENT_VERSION, at),
                           DeviceStatus("other", "sim-0003", "online", None, None, SIM_AGENT_VERSION, at),
                           DeviceStatus("other", "cam-9", "online", None, None, None, at)])  # fmt: skip
    assert (store.simulated_devices("lab"), store.simulated_devices("other"), store.simulated_devices()) == (2, 1, 3)
    assert store.simulated_devices("nowhere") == 0
    store.upsert_status(DeviceStatus("lab", "sim-0001", "online", None, None, "0.2.0", at + dt.timedelta(minutes=1)))
    assert store.simulated_devices("lab") == 1  # its last status is a real agent's
