"""How the collector's writer meets a failing store (edgekit/fleet/collector_writes.py and the retention pass):
a store that is only unavailable while a refused batch is written one by one loses no window, and a retention
pass that keeps failing is tried less and less often and never stops the writer. Real Mosquitto, real SQLite;
the failures are injected into the store's methods, as test_ingest_hostile does."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.store import FleetStore, open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[FleetStore]:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        yield store


def test_a_store_outage_while_writing_one_by_one_loses_no_window(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """One poison window fails its batch, which is written one by one; the store is briefly unavailable (a
    PostgreSQL restart, SQLite busy) while good-2 is written: good-2 is waited for and stored, not refused."""
    real_add = sqlite_store.add_windows
    blips = [StoreUnavailableError("connection lost (PostgreSQL restarting)")]

    def add_windows(windows: Any) -> int:
        if any(w.device == "bug" for w in windows):
            raise StoreError("a value the store cannot take")
        if windows[0].device == "good-2" and blips:
            raise blips.pop()
        return int(real_add(windows))

    monkeypatch.setattr(sqlite_store, "add_windows", add_windows)
    # acknowledged on arrival: the four windows make one batch (flush_interval_s), whatever the broker's pace
    collector = Collector(fleet_broker.url, sqlite_store, client_id="writes-blip", fleet="wb", flush_interval_s=0.5,
                          ack_after_store=False).start()  # fmt: skip
    try:
        with Publisher(fleet_broker) as device:
            device.publish_many([(topic("telemetry", device=name, fleet="wb"),
                                  encode_message(telemetry(1, device=name, fleet="wb")))
                                 for name in ("good-1", "bug", "good-2", "good-3")])  # fmt: skip
        assert collector.flush(10)
    finally:
        collector.stop()
    assert not blips  # the outage happened while writing one by one
    assert sorted(w.device for w in sqlite_store.windows(fleet="wb")) == ["good-1", "good-2", "good-3"]
    assert sqlite_store.rejected_counts() == {"store_refused": 1}
    assert collector.metrics.snapshot()["rejected"] == {"store_refused": 1}


def test_a_failing_retention_pass_is_tried_less_often_and_never_stops_the_writer(
        fleet_broker: MosquittoBroker, sqlite_store: FleetStore, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    passes: list[float] = []

    def apply_retention(*args: Any, **kwargs: Any) -> int:
        passes.append(time.monotonic())
        if len(passes) == 1:
            raise ValueError("a retention bug")  # not a StoreError: the writer thread must live on
        raise StoreError("out of shared memory")

    monkeypatch.setattr(sqlite_store, "apply_retention", apply_retention)
    collector = Collector(fleet_broker.url, sqlite_store, client_id="writes-retention", fleet="wr", flush_interval_s=0.05,
                          retention=dt.timedelta(hours=1), retention_interval_s=0.05).start()  # fmt: skip
    try:
        time.sleep(1.6)  # every 0.05 s without backing off: some 30 passes, each holding the writer
        with Publisher(fleet_broker) as device:
            device.publish(topic("telemetry", fleet="wr"), encode_message(telemetry(1, fleet="wr")))
        assert collector.flush(10)
    finally:
        collector.stop()
    assert [w.seq for w in sqlite_store.windows(fleet="wr")] == [1]  # the writer lives
    assert 2 <= len(passes) <= 7, [round(at - passes[0], 2) for at in passes]  # 0.05 s, then 0.1, 0.2, 0.4, 0.8 s apart
