"""The collector against a real Mosquitto: storing, rejecting, deduplicating, the last will, retention,
two collectors sharing one subscription, and its Prometheus /metrics."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.errors import CollectorError
from edgekit.fleet.metrics import CONTENT_TYPE, IngestMetrics, MetricsServer
from edgekit.fleet.store import FleetStore, open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import BUNDLE_B, Publisher, event, status, telemetry, topic
from tests.fleet.prometheus_text import parse_exposition
from tests.runtime.agent.mosquitto import MosquittoBroker, free_port

_client_ids = iter(range(1_000_000))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[FleetStore]:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        yield store


@pytest.fixture
def collector_factory(fleet_broker: MosquittoBroker) -> Iterator[Callable[..., Collector]]:
    started: list[Collector] = []

    def start(store: FleetStore, **options: Any) -> Collector:
        options.setdefault("client_id", f"test-collector-{next(_client_ids)}")
        options.setdefault("flush_interval_s", 0.05)
        collector = Collector(fleet_broker.url, store, **options).start()
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.stop()


def test_collector_stores_validates_and_deduplicates(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                                     collector_factory: Callable[..., Collector]) -> None:  # fmt: skip
    with Publisher(fleet_broker) as device:
        device.publish(topic("status", fleet="f1"), status("online", fleet="f1"), retain=True)  # before the collector
        collector = collector_factory(sqlite_store, fleet="f1")
        seqs = [3, 1, 2, 5, 6, 2, 3, 8]  # out of order; 2 and 3 redelivered; 4 and 7 never arrive
        device.publish_many([(topic("telemetry", fleet="f1"), encode_message(telemetry(s, fleet="f1"))) for s in seqs])
        deployed = event(fleet="f1", command_id="c-1")
        device.publish(topic("events", fleet="f1"), deployed)
        device.publish(topic("events", fleet="f1"), deployed)  # at least once: the same event_id again
        device.publish(topic("telemetry", fleet="f1"), b"not json")
        device.publish(topic("telemetry", fleet="f1"), json.dumps({**telemetry(9, fleet="f1"), "schema": "edgekit.telemetry/9"}))
        device.publish(topic("telemetry", device="dev-2", fleet="f1"), encode_message(telemetry(1, fleet="f1")))
        device.publish(topic("telemetry", fleet="f2"), encode_message(telemetry(1, fleet="f2")))  # other fleet: not read
        assert wait_until(lambda: sum(collector.metrics.snapshot()["received"].values()) == 1 + 8 + 2 + 3)
        assert collector.flush()
    assert [w.seq for w in sqlite_store.windows()] == [1, 2, 3, 5, 6, 8]
    assert sqlite_store.missing_seqs("f1", "dev-1") == [(4, 4), (7, 7)]
    (summary,) = sqlite_store.device_summaries()
    assert (summary.fleet, summary.state, summary.windows, summary.missing_seqs) == ("f1", "online", 6, 2)
    assert [e.event_id for e in sqlite_store.events()] == [deployed["event_id"]]
    assert sqlite_store.rejected_counts() == {"malformed_json": 1, "unknown_schema": 1, "device_mismatch": 1}
    counts = collector.metrics.snapshot()
    assert counts["received"] == {"status": 1, "telemetry": 11, "events": 2}
    assert counts["stored"] == {"status": 1, "telemetry": 6, "events": 1}
    assert counts["duplicates"] == {"status": 0, "telemetry": 2, "events": 1}
    assert counts["rejected"] == {"malformed_json": 1, "unknown_schema": 1, "device_mismatch": 1}


def test_rejections_are_logged_with_the_topic(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                              collector_factory: Callable[..., Collector],
                                              caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    collector = collector_factory(sqlite_store, fleet="logs", max_payload_bytes=1024)
    with Publisher(fleet_broker) as device:
        device.publish(topic("telemetry", fleet="logs"), b"{" * 2000)
        assert wait_until(lambda: collector.metrics.snapshot()["rejected"].get("oversized") == 1)
    assert collector.flush()
    assert "rejected a message on edgekit/v1/logs/dev-1/telemetry (2000 bytes): oversized" in caplog.text
    assert sqlite_store.rejected_counts() == {"oversized": 1}


def test_the_last_will_marks_a_device_offline(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                              collector_factory: Callable[..., Collector]) -> None:  # fmt: skip
    collector = collector_factory(sqlite_store, fleet="wills")
    will = encode_message(status("offline", fleet="wills", reason="connection lost"))
    device = Publisher(fleet_broker, "wills-dev-1", will=(topic("status", fleet="wills"), will))
    device.publish(topic("status", fleet="wills"), status("online", fleet="wills", bundle=BUNDLE_B), retain=True)
    assert wait_until(lambda: collector.flush() and [s.state for s in sqlite_store.device_summaries()] == ["online"])
    assert sqlite_store.device_summaries()[0].bundle_id == BUNDLE_B.id
    device.kill()  # no DISCONNECT: the broker publishes the will
    assert wait_until(lambda: collector.flush() and [s.state for s in sqlite_store.device_summaries()] == ["offline"])
    assert parse_exposition(collector.metrics.render())["edgekit_device_online"].value({"fleet": "wills", "device": "dev-1"}) == 0


@pytest.mark.parametrize("mode", ["ack_after_store", "mqtt_3.1.1"])
def test_collector_modes(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                         collector_factory: Callable[..., Collector], mode: str) -> None:  # fmt: skip
    options = {"ack_after_store": True} if mode == "ack_after_store" else {"mqtt_version": "3.1.1"}
    collector = collector_factory(sqlite_store, fleet=mode.replace(".", "_"), batch_size=7, **options)
    fleet = mode.replace(".", "_")
    with Publisher(fleet_broker) as device:
        device.publish_many([(topic("telemetry", fleet=fleet), encode_message(telemetry(s, fleet=fleet))) for s in range(1, 41)])
        assert wait_until(lambda: collector.metrics.snapshot()["stored"].get("telemetry") == 40)
    assert [w.seq for w in sqlite_store.windows()] == list(range(1, 41))


def test_collector_rolls_up_old_windows(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                        collector_factory: Callable[..., Collector]) -> None:  # fmt: skip
    collector = collector_factory(sqlite_store, fleet="old", retention=dt.timedelta(hours=1), retention_interval_s=0.05)
    with Publisher(fleet_broker) as device:  # windows from March 2026: long past one hour of raw retention
        device.publish_many([(topic("telemetry", fleet="old"), encode_message(telemetry(s, fleet="old"))) for s in range(1, 13)])
        assert wait_until(lambda: collector.metrics.snapshot()["stored"].get("telemetry") == 12)
    assert wait_until(lambda: not list(sqlite_store.windows()))
    (rolled,) = sqlite_store.aggregate(("device",))
    assert (rolled.device, rolled.windows) == ("dev-1", 12)
    assert sqlite_store.device_summaries()[0].windows == 12


def test_bad_collector_settings_are_explained(fleet_broker: MosquittoBroker, sqlite_store: FleetStore) -> None:
    with pytest.raises(CollectorError, match="broker URL 'http://x' has scheme 'http'"):
        Collector("http://x", sqlite_store, client_id="c")
    with pytest.raises(CollectorError, match=r"shared subscription group 'a\+b' contains '\+'"):
        Collector(fleet_broker.url, sqlite_store, client_id="c", shared_group="a+b")
    with pytest.raises(CollectorError, match="collector batch_size must be an integer >= 1, got 0"):
        Collector(fleet_broker.url, sqlite_store, client_id="c", batch_size=0)
    with pytest.raises(CollectorError, match="mqtt_version must be one of 5, 3.1.1, got '4'"):
        Collector(fleet_broker.url, sqlite_store, client_id="c", mqtt_version="4")
    with pytest.raises(CollectorError, match=r"collector c: broker 127\.0\.0\.1:\d+ refused the TCP connection") as info:
        Collector(f"mqtt://127.0.0.1:{free_port()}", sqlite_store, client_id="c").start()
    assert "check that the broker is running" in (info.value.hint or "")


# -- two collectors, one shared subscription -----------------------------------------------------


def test_two_collectors_share_a_subscription_without_loss_or_double_storage(
    fleet_broker: MosquittoBroker, store_url: str, collector_factory: Callable[..., Collector]
) -> None:
    devices, windows_per_device = 20, 40
    stores = [open_store(store_url), open_store(store_url)]  # each collector has its own connection
    try:
        collectors = [collector_factory(store, fleet="shared", shared_group="edgekit-test") for store in stores]
        assert all(c.subscriptions[0] == "$share/edgekit-test/edgekit/v1/shared/+/telemetry" for c in collectors)
        messages = [(topic("telemetry", device=f"d{d:02}", fleet="shared"),
                     encode_message(telemetry(s, device=f"d{d:02}", fleet="shared")))
                    for s in range(1, windows_per_device + 1) for d in range(devices)]  # fmt: skip
        replayed = messages[100:150]  # a spool replay after a reconnect: the same windows again
        publishers = [Publisher(fleet_broker) for _ in range(4)]
        for index, publisher in enumerate(publishers):
            publisher.publish_many(messages[index::4] + (replayed if index == 0 else []))
        for publisher in publishers:
            publisher.close()
        total = len(messages) + len(replayed)
        received = lambda: sum(c.metrics.snapshot()["received"].get("telemetry", 0) for c in collectors)  # noqa: E731
        assert wait_until(lambda: received() >= total, timeout_s=30), received()
        assert all(c.flush() for c in collectors)
        time.sleep(0.2)
        assert received() == total  # each message went to exactly one collector
        counts = [c.metrics.snapshot() for c in collectors]
        assert all(count["stored"]["telemetry"] > 0 for count in counts), counts  # both took a share
        assert sum(count["stored"]["telemetry"] for count in counts) == len(messages)
        assert sum(count["duplicates"]["telemetry"] for count in counts) == len(replayed)
        stored = [(w.device, w.seq) for w in stores[0].windows(fleet="shared")]
        assert len(stored) == len(set(stored)) == devices * windows_per_device
        assert all(s.missing_seqs == 0 and s.windows == windows_per_device for s in stores[0].device_summaries("shared"))
    finally:
        for store in stores:
            store.close()


# -- /metrics -------------------------------------------------------------------------------------


def test_metrics_endpoint_serves_device_gauges_and_counters(fleet_broker: MosquittoBroker, sqlite_store: FleetStore,
                                                            collector_factory: Callable[..., Collector]) -> None:  # fmt: skip
    metrics = IngestMetrics()
    server = MetricsServer(metrics, port=0).start()
    try:
        collector = collector_factory(sqlite_store, fleet="prom", metrics=metrics)
        newest = telemetry(2, device='dev "quoted"\\x', fleet="prom", latencies_ms=[1.0, 2.0, 3.0, 40.0], power_mw=4500.0,
                           temperature_c=66.5)  # fmt: skip
        with Publisher(fleet_broker) as device:
            device.publish(topic("status", device=newest["device"], fleet="prom"),
                           status("online", device=newest["device"], fleet="prom"))  # fmt: skip
            device.publish(topic("telemetry", device=newest["device"], fleet="prom"), encode_message(newest))
            device.publish(topic("telemetry", device=newest["device"], fleet="prom"),
                           encode_message(telemetry(1, device=newest["device"], fleet="prom")))  # older, arrives later
            device.publish(topic("telemetry", device="dev-9", fleet="prom"), b"[]")
            assert wait_until(lambda: collector.metrics.snapshot()["received"].get("telemetry") == 3)
        assert collector.flush()
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            text = response.read().decode("utf-8")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=5)
    finally:
        server.stop()
    families = parse_exposition(text)
    labels = {"fleet": "prom", "device": 'dev "quoted"\\x'}
    assert families["edgekit_device_latency_p50_seconds"].value(labels) == pytest.approx(newest["latency"]["p50_ms"] / 1e3)
    assert families["edgekit_device_latency_p99_seconds"].value(labels) == pytest.approx(newest["latency"]["p99_ms"] / 1e3)
    assert families["edgekit_device_power_watts"].value(labels) == pytest.approx(4.5)
    assert families["edgekit_device_energy_per_inference_joules"].value(labels) == pytest.approx(4.5 * 10 / 4)
    assert families["edgekit_device_temperature_max_celsius"].value(labels) == 66.5
    assert families["edgekit_device_online"].value(labels) == 1
    assert families["edgekit_device_last_seq"].value(labels) == 2
    assert families["edgekit_device_info"].value({**labels, "bundle": newest["bundle"]["id"]}) == 1
    assert families["edgekit_collector_messages_received_total"].value({"kind": "telemetry"}) == 3
    assert families["edgekit_collector_records_stored_total"].value({"kind": "telemetry"}) == 2
    assert families["edgekit_collector_messages_rejected_total"].value({"reason": "not_an_object"}) == 1
    assert families["edgekit_collector_messages_rejected_total"].value({"reason": "oversized"}) == 0
    assert families["edgekit_collector_connected"].type == "gauge"
    assert families["edgekit_collector_messages_received_total"].type == "counter"


def test_metrics_port_in_use_is_explained() -> None:
    first = MetricsServer(IngestMetrics(), port=0).start()
    try:
        with pytest.raises(CollectorError, match=f"cannot serve metrics on 127.0.0.1:{first.port}") as info:
            MetricsServer(IngestMetrics(), port=first.port)
        assert "--metrics-port" in (info.value.hint or "")
    finally:
        first.stop()


class FlakyStore:
    """A real SQLite store whose first ``outages`` window writes fail as unavailable, and which refuses
    any window of device ``poison`` (as a database constraint would)."""

    def __init__(self, inner: FleetStore, outages: int) -> None:
        self.inner, self.outages = inner, outages

    def add_windows(self, windows: list[Any]) -> int:
        from edgekit.fleet.errors import StoreError, StoreUnavailableError

        if self.outages > 0:
            self.outages -= 1
            raise StoreUnavailableError("fleet store test is busy: database is locked")
        if any(w.device == "poison" for w in windows):
            raise StoreError("fleet store test refused: CHECK constraint failed")
        return self.inner.add_windows(windows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_store_outages_are_retried_and_refused_records_kept_as_rejected(
    fleet_broker: MosquittoBroker, sqlite_store: FleetStore, collector_factory: Callable[..., Collector]
) -> None:
    flaky = FlakyStore(sqlite_store, outages=2)
    collector = collector_factory(flaky, fleet="flaky")  # type: ignore[arg-type]
    with Publisher(fleet_broker) as device:
        device.publish_many([(topic("telemetry", device=name, fleet="flaky"),
                              encode_message(telemetry(seq, device=name, fleet="flaky")))
                             for seq in (1, 2, 3) for name in ("dev-1", "poison")])  # fmt: skip
        assert wait_until(lambda: collector.metrics.snapshot()["received"].get("telemetry") == 6)
    assert collector.flush(20)
    assert [(w.device, w.seq) for w in sqlite_store.windows()] == [("dev-1", 1), ("dev-1", 2), ("dev-1", 3)]
    assert sqlite_store.rejected_counts() == {"store_refused": 3}
    assert collector.metrics.snapshot()["rejected"] == {"store_refused": 3}
    assert collector.metrics.store_errors >= 3  # two outages, then the batch the store refused
