"""Values that validate against the schema but would break the store, found by reviewing the collector with
hostile devices in mind: each is now a rejection with a reason, and the good messages around it are stored.
Real parse_message, real SQLite and PostgreSQL stores, a real collector on Mosquitto."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet import ingest
from edgekit.fleet.collector import Collector
from edgekit.fleet.ingest import MAX_COUNT, Rejection, parse_message
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceEvent, TelemetryWindow
from edgekit.fleet.store.buckets import MAX_MODEL_MARKS
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, event, telemetry, topic, window
from tests.runtime.agent.mosquitto import MosquittoBroker

AT = dt.datetime(2026, 3, 1, 13, 0, tzinfo=dt.timezone.utc)
FAR_FUTURE = "9999-12-31T23:59:59.999999Z"


def _parsed(message: dict[str, Any], kind: str = "telemetry") -> TelemetryWindow | DeviceEvent | Rejection:
    return parse_message(topic(kind), encode_message(message), received_at=AT)  # type: ignore[return-value]


def _rejected(record: Any, reason: str, *words: str) -> None:
    assert isinstance(record, Rejection), record
    assert record.reason == reason, record.detail
    for word in words:
        assert word in record.detail, record.detail


def _telemetry_with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    message = telemetry(1)
    change(message)
    return message


@pytest.mark.parametrize(("where", "change", "words"), [
    ("window.end", lambda m: m["window"].update(end=FAR_FUTURE), ("window.end", "1970-01-01 to 2999-12-31")),
    ("window.start", lambda m: m["window"].update(start="1969-12-31T23:59:59Z"), ("window.start",)),
    ("window length", lambda m: m["window"].update(start="2026-02-27T12:00:00Z"), ("longer than a day",)),
    ("latency.count", lambda m: m["latency"].update(count=2**63 - 1), ("latency.count", "2**40")),
    ("latency.errors", lambda m: m["latency"].update(errors=MAX_COUNT + 1), ("latency.errors",)),
    ("latency.p99_ms", lambda m: m["latency"].update(p99_ms=1e308), ("latency.p99_ms", "beyond")),
    ("power.mean_mw", lambda m: m["power"].update(mean_mw=1e13), ("power.mean_mw",)),
    ("an integer of 400 digits", lambda m: m["latency"].update(p50_ms=10**400), ("latency.p50_ms", "too large")),
    ("temperatures_c", lambda m: m["temperatures_c"].update(soc=10**400), ("temperatures_c.soc",)),
])  # fmt: skip
def test_values_the_store_cannot_sum_or_keep_are_bad_values(where: str, change: Callable[[dict[str, Any]], None],
                                                            words: tuple[str, ...]) -> None:  # fmt: skip
    _rejected(_parsed(_telemetry_with(change)), "bad_value", *words)


def test_the_limits_themselves_are_taken() -> None:
    def at_limits(message: dict[str, Any]) -> None:
        message["latency"].update(count=MAX_COUNT, p99_ms=1e12)
        message["window"].update(start="2026-02-28T12:00:10Z")  # exactly a day

    record = _parsed(_telemetry_with(at_limits))
    assert isinstance(record, TelemetryWindow) and record.count == MAX_COUNT and record.p99_ms == 1e12


def test_an_event_from_the_far_future_is_refused() -> None:
    message = event()
    message["at"] = FAR_FUTURE
    _rejected(_parsed(message, "events"), "bad_value", "at ", "1970-01-01 to 2999-12-31")


def test_a_key_twice_in_one_object_is_malformed() -> None:
    # SQL's JSON functions read the first "cpu_load_pct", Python the last: the stored text and the record would differ
    doubled = '{"cpu_load_pct": 99.0, ' + encode_message(telemetry(1)).decode()[1:]
    record = parse_message(topic("telemetry"), doubled.encode(), received_at=AT)
    _rejected(record, "malformed_json", "key 'cpu_load_pct' appears twice in one object")


def test_a_model_named_twice_is_refused() -> None:
    def two_of_one(message: dict[str, Any]) -> None:
        entry = {"model": "m", "bundle": None, "count": 1, "errors": 0, "p50_ms": 1.0, "p99_ms": 2.0, "throughput_per_s": 1.0}
        message["models"] = [entry, {**entry, "count": 5}]

    _rejected(_parsed(_telemetry_with(two_of_one)), "bad_value", "names model 'm' more than once")


def test_a_rejection_quoting_an_unpaired_surrogate_is_stored(store: FleetStore) -> None:
    text = encode_message(telemetry(1)).decode().replace('"soc"', '"\\ud800soc"', 1)
    record = parse_message(topic("telemetry"), text.encode(), received_at=AT)
    _rejected(record, "bad_value", "\\ud800soc", "unpaired UTF-16 surrogate")
    store.add_rejected([record.to_record()])  # type: ignore[union-attr]  # before: UnicodeEncodeError, the row lost
    assert store.rejected_counts() == {"bad_value": 1}


def test_long_topics_are_not_kept_in_the_topic_cache() -> None:
    ingest._topic_parts.cache_clear()
    huge = f"edgekit/v1/{'f' * 65_000}/dev-1/telemetry"
    _rejected(parse_message(huge, b"{}", received_at=AT), "bad_topic")
    assert ingest._topic_parts.cache_info().currsize == 0
    parse_message(topic("telemetry"), b"{}", received_at=AT)
    assert ingest._topic_parts.cache_info().currsize == 1


def test_a_device_naming_ever_new_models_keeps_its_row_bounded(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        for seq in range(1, 21):
            record = dataclasses.replace(window(seq), models=tuple(ingest.ModelWindow(model=f"m{seq}-{i}", bundle_id=None, count=1, errors=0, p50_ms=1.0,
                                                     p99_ms=1.0, throughput_per_s=1.0, memory_mb=None)
                                  for i in range(64)))  # fmt: skip
            assert store.add_windows([record]) == 1
        ((marks,),) = store._query("test", "SELECT marks FROM device_latest")  # type: ignore[attr-defined]
    model_marks = [key for key in json.loads(marks) if key.startswith("m")]
    assert len(model_marks) == MAX_MODEL_MARKS  # 20 windows x 64 names x 2 tiers = 2,560 before


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[FleetStore]:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        yield store


def test_a_store_failure_nothing_foresaw_loses_one_window_not_the_writer(fleet_broker: MosquittoBroker,
                                                                         sqlite_store: FleetStore,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    real_add = sqlite_store.add_windows

    def add_windows(windows: Any) -> int:  # a bug in the store, on one device's windows only
        if any(w.device == "dev-bug" for w in windows):
            raise ValueError("year 10000 is out of range")
        return real_add(windows)

    monkeypatch.setattr(sqlite_store, "add_windows", add_windows)
    collector = Collector(fleet_broker.url, sqlite_store, client_id="hostile-writer", fleet="hw", flush_interval_s=0.05).start()
    try:
        with Publisher(fleet_broker) as device:
            messages = [(topic("telemetry", device=name, fleet="hw"), encode_message(telemetry(1, device=name, fleet="hw")))
                        for name in ("dev-1", "dev-bug", "dev-2")]  # fmt: skip
            device.publish_many(messages)
            assert collector.flush(10)
            device.publish(topic("telemetry", device="dev-3", fleet="hw"), encode_message(telemetry(1, device="dev-3", fleet="hw")))
            assert collector.flush(10)
    finally:
        collector.stop()
    assert sorted(w.device for w in sqlite_store.windows(fleet="hw")) == ["dev-1", "dev-2", "dev-3"]  # the writer lives
    assert sqlite_store.rejected_counts() == {"store_refused": 1}


def test_a_huge_buffer_is_measured_before_it_is_copied() -> None:
    """A bytearray or memoryview payload over the limit is rejected without a copy of it (bytes from paho are used
    as they are)."""
    import tracemalloc

    huge = bytearray(b"x" * (20 * 1024 * 1024))
    tracemalloc.start()
    try:
        records = [parse_message(topic("telemetry"), payload, received_at=AT) for payload in (huge, memoryview(huge))]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for record in records:
        _rejected(record, "oversized", f"payload of {len(huge)} bytes is over the limit of {ingest.MAX_PAYLOAD_BYTES} bytes")
        assert record.size_bytes == len(huge)  # type: ignore[union-attr]
    assert peak < 1024 * 1024, peak


def test_an_mqtt5_collector_asks_the_broker_to_keep_huge_messages_to_itself(fleet_broker: MosquittoBroker,
                                                                           sqlite_store: FleetStore) -> None:  # fmt: skip
    """MQTT 5 CONNECT carries a Maximum Packet Size (max_payload_bytes plus room for a topic): the broker drops a
    larger message instead of the collector reading it whole to reject it; one a little over the limit still
    arrives and is counted as oversized."""
    from edgekit.fleet.collector import PACKET_OVERHEAD_BYTES

    collector = Collector(fleet_broker.url, sqlite_store, client_id="hostile-huge", fleet="hh", mqtt_version="5",
                          max_payload_bytes=1024, flush_interval_s=0.05).start()  # fmt: skip
    try:
        with Publisher(fleet_broker) as device:
            device.publish(topic("telemetry", fleet="hh"), b"x" * (1024 + PACKET_OVERHEAD_BYTES + 1024))
            device.publish(topic("telemetry", fleet="hh"), b"x" * 2048)
            device.publish(topic("telemetry", fleet="hh"), encode_message(telemetry(1, fleet="hh")))
            deadline = time.monotonic() + 10
            while not list(sqlite_store.windows(fleet="hh")) and time.monotonic() < deadline:
                time.sleep(0.02)
        assert collector.flush()
    finally:
        collector.stop()
    snapshot = collector.metrics.snapshot()
    assert (snapshot["received"].get("telemetry"), snapshot["rejected"]) == (2, {"oversized": 1})
    assert [w.seq for w in sqlite_store.windows(fleet="hh")] == [1]
