"""A retained status is what a device said when it said it: the broker sends it again to every collector that
subscribes (a restart, a reconnect), and that must not make a device silent for an hour look heard from now."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Iterator

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceStatus
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.alerts.live_messages import live_window
from tests.fleet.messages import Publisher, status, topic
from tests.runtime.agent.mosquitto import MosquittoBroker

RECEIVED = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


def _status_at(at: dt.datetime, *, retained: bool) -> DeviceStatus:
    record = parse_message(topic("status"), encode_message(status("online", at=at)), received_at=RECEIVED, retained=retained)
    assert isinstance(record, DeviceStatus), record
    return record


def test_a_retained_status_was_heard_at_its_own_time_never_later_than_received() -> None:
    an_hour_before = RECEIVED - dt.timedelta(hours=1)
    assert (_status_at(an_hour_before, retained=True).updated_at, _status_at(an_hour_before, retained=True).retained) == (
        an_hour_before, True)
    assert _status_at(RECEIVED + dt.timedelta(hours=1), retained=True).updated_at == RECEIVED  # a clock running ahead
    assert _status_at(an_hour_before, retained=False).updated_at == RECEIVED  # live: heard from now


@pytest.fixture
def silent_store(tmp_path: Path) -> Iterator[FleetStore]:
    """A store whose device dev-1 (fleet 'restart', 10 s windows) last sent a window and its status an hour ago."""
    an_hour_ago = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(hours=1)
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        store.add_windows([live_window(1, fleet="restart", window_s=10, end=an_hour_ago)])
        store.upsert_status(DeviceStatus(fleet="restart", device="dev-1", state="online", bundle_id=None, target=None,
                                         agent_version="test", updated_at=an_hour_ago))  # fmt: skip
        yield store


def test_a_restarted_collector_keeps_a_long_silent_device_offline(fleet_broker: MosquittoBroker,
                                                                  silent_store: FleetStore) -> None:  # fmt: skip
    (before,) = silent_store.device_summaries("restart")
    assert before.state == "offline"
    status_topic = topic("status", fleet="restart")
    with Publisher(fleet_broker) as device:
        device.publish(status_topic, status("online", fleet="restart", at=before.last_seen), retain=True)
        try:
            collector = Collector(fleet_broker.url, silent_store, client_id="retained-restart", fleet="restart",
                                  flush_interval_s=0.05).start()  # fmt: skip
            try:
                deadline = time.monotonic() + 10
                while collector.metrics.snapshot()["received"].get("status", 0) < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert collector.flush()
            finally:
                collector.stop()
        finally:
            device.publish(status_topic, b"", retain=True)  # clear it for the module's other tests
    (after,) = silent_store.device_summaries("restart")
    assert collector.metrics.snapshot()["received"]["status"] == 1
    assert (after.state, after.last_seen) == ("offline", before.last_seen)


def _stored_status(state: str, at: dt.datetime, *, retained: bool) -> DeviceStatus:
    return DeviceStatus(fleet="lab", device="dev-1", state=state, bundle_id=None, target=None, agent_version="test",
                        updated_at=at, retained=retained)  # fmt: skip


def test_a_retained_status_takes_the_state_but_never_moves_the_heard_from_time_back(store: FleetStore) -> None:
    connected = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(hours=2)
    online_at = connected + dt.timedelta(seconds=1)
    store.upsert_status(_stored_status("online", online_at, retained=False))
    # the device died while no collector ran: its last will (said when it connected) is the retained status now
    store.upsert_status(_stored_status("offline", connected, retained=True))
    [summary] = store.device_summaries("lab")
    assert (summary.state, summary.last_seen) == ("offline", online_at)
    later = online_at + dt.timedelta(minutes=5)
    store.upsert_status(_stored_status("online", later, retained=True))  # a newer one moves the time forward
    [summary] = store.device_summaries("lab")
    assert (summary.state, summary.last_seen) == ("online", later)
