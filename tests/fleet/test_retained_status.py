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
                _stored_after_one_status(collector)
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


def test_statuses_heard_after_the_collector_clock_was_set_back_are_applied(store: FleetStore) -> None:
    """The collector's clock ran an hour ahead, then NTP set it back: the statuses heard after (the device's last
    will included) are applied, and so is the identity they carry: a stored time ahead of the writer's clock is
    not trusted. A status older than a trusted stored one is still not applied (a lagging collector)."""
    from tests.fleet.test_device_identity import board_status

    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    ahead = now + dt.timedelta(hours=1)

    def heard(message: dict, at: dt.datetime, *, retained: bool = False) -> DeviceStatus:  # type: ignore[type-arg]
        record = parse_message(topic("status"), encode_message(message), received_at=at, retained=retained)
        assert isinstance(record, DeviceStatus), record
        return record

    assert store.upsert_statuses([heard(board_status("dev-1", "jetson_orin_nano_jp61", at=ahead), ahead)]) == 1
    will = heard(board_status("dev-1", "jetson_orin_nano_super_jp62", at=now, state="offline"), now)
    assert store.upsert_statuses([will]) == 1
    [summary] = store.device_summaries("lab")
    assert (summary.state, summary.last_seen) == ("offline", now)
    assert [i.jetpack for i in store.device_identities("lab")] == ["6.2"]
    # a lagging collector still cannot undo the newer status (nor its identity)
    late = now - dt.timedelta(seconds=10)
    assert store.upsert_statuses([heard(board_status("dev-1", "jetson_orin_nano_jp61", at=late), late)]) == 0
    [summary] = store.device_summaries("lab")
    assert (summary.state, summary.last_seen) == ("offline", now)
    assert [i.jetpack for i in store.device_identities("lab")] == ["6.2"]
    # a retained status keeps a later stored heard-from time only when that time is not from a clock set back since
    store.upsert_status(_stored_status("online", ahead, retained=False))
    store.upsert_status(_stored_status("offline", now, retained=True))
    [summary] = store.device_summaries("lab")
    assert (summary.state, summary.last_seen) == ("offline", now)


def test_a_status_older_than_the_stored_one_is_counted_not_stored(fleet_broker: MosquittoBroker, tmp_path: Path) -> None:
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)  # another collector's clock, a little ahead
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        store.upsert_status(DeviceStatus(fleet="older", device="dev-1", state="online", bundle_id=None, target=None,
                                         agent_version="test", updated_at=soon))  # fmt: skip
        collector = Collector(fleet_broker.url, store, client_id="status-older", fleet="older", flush_interval_s=0.05).start()
        try:
            with Publisher(fleet_broker) as device:
                device.publish(topic("status", fleet="older"), status("offline", fleet="older"))
            _stored_after_one_status(collector)
        finally:
            collector.stop()
        snapshot = collector.metrics.snapshot()
        assert (snapshot["stored"].get("status", 0), snapshot["duplicates"].get("status", 0)) == (0, 1)
        assert [s.state for s in store.device_summaries("older")] == ["online"]


def _stored_after_one_status(collector: Collector) -> None:
    """Wait (at most 10 s) until ``collector`` received a status message, then until it stored what it took in."""
    deadline = time.monotonic() + 10
    while collector.metrics.snapshot()["received"].get("status", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert collector.flush()
