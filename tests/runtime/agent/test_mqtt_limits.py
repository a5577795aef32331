"""MqttLink and what the broker's connection tells it (mqtt_limits), against real Mosquitto brokers: a spooled message
over the broker's Maximum Packet Size, and a broker that accepts connections and drops them at once."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.mqtt_limits import PACKET_TOO_LARGE, ConnectionWatch, publish_size_bytes
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.telemetry import TelemetryProblem
from edgekit_runtime.agent.topics import TelemetryError
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker, ReceivedMessage
from tests.runtime.agent.sample_messages import sample_telemetry

DEVICE, FLEET = "dev-1", "lab"
BROKER_LIMIT = 20_000


def _link(broker_url: str, spool: Spool, **kwargs: Any) -> MqttLink:
    kwargs.setdefault("backoff", Backoff(initial_s=0.1, max_s=0.5))
    return MqttLink(broker_url, DEVICE, FLEET, DEVICE, spool=spool, keepalive_s=5, **kwargs)


def _seqs(messages: list[ReceivedMessage]) -> list[int]:
    return [json.loads(m.payload)["seq"] for m in messages if m.topic.endswith("/telemetry")]


def _too_large_reports(messages: list[ReceivedMessage]) -> list[dict[str, Any]]:
    events = [m.json() for m in messages if m.topic.endswith("/events")]
    return [e for e in events if e["kind"] == "error" and e["details"].get("code") == PACKET_TOO_LARGE]


@pytest.fixture
def small_packet_broker(mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    """A broker that takes packets of at most 20,000 bytes and says so in its CONNACK (MQTT 5)."""
    return mosquitto_factory(extra_config=[f"max_packet_size {BROKER_LIMIT}"])


@pytest.mark.parametrize("delivery", ["broker_ack", "collector_ack"])
def test_a_window_over_the_brokers_packet_limit_is_refused_and_the_rest_flows(
    small_packet_broker: MosquittoBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture, delivery: str
) -> None:
    """Before: the broker dropped the connection on the 42 KB window, the link sent it first again on every
    reconnect (about once a second) and delivered nothing behind it."""
    with MessageRecorder(small_packet_broker) as recorder, Spool(tmp_path / "spool.db") as spool:
        link = _link(small_packet_broker.url, spool, delivery=delivery)
        big = sample_telemetry(spool.next_seq(), errors=[TelemetryProblem("x.y", "z" * 1000)] * 40)
        link.publish_telemetry(big)
        for _ in range(3):
            link.publish_telemetry(sample_telemetry(spool.next_seq()))
        with caplog.at_level(logging.ERROR, logger="edgekit_runtime.agent.mqtt"), link:
            assert recorder.wait_for(lambda ms: _seqs(ms) == [2, 3, 4] and _too_large_reports(ms), timeout_s=10), (
                _seqs(recorder.messages), link.counters, link.last_error)  # fmt: skip
            counters = link.counters
            left = [json.loads(entry.payload).get("seq") for entry in spool.peek(100)]
    assert counters.connects == 1 and counters.reconnects == 0 and counters.rejected == 1
    assert 1 not in left  # gone from the spool, like a message whose PUBACK was refused
    (report,) = _too_large_reports(recorder.messages)
    validate_message(report, "event.v1")
    details = report["details"]
    assert details["seq"] == 1 and details["topic"].endswith("/telemetry") and details["max_packet_bytes"] == BROKER_LIMIT
    assert details["size_bytes"] > 40_000 and report["level"] == "error"
    (logged,) = [r.getMessage() for r in caplog.records if "maximum packet size" in r.getMessage()]
    assert "telemetry window seq 1" in logged and f"{details['size_bytes']} bytes" in logged and "20000 bytes" in logged


def test_a_message_at_the_limit_is_sent_and_one_byte_over_is_refused(
    small_packet_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The size is measured as the PUBLISH packet paho sends (topic, properties and headers included)."""
    with MessageRecorder(small_packet_broker) as recorder, Spool(tmp_path / "spool.db") as spool:
        link = _link(small_packet_broker.url, spool)

        def payload(seq: int, packet_bytes: int) -> bytes:
            """A payload that makes a PUBLISH packet of ``packet_bytes`` (the length field grows with it)."""
            for pad in range(packet_bytes, 0, -1):
                data = b'{"seq":%d,"pad":"%s"}' % (seq, b"p" * pad)
                if publish_size_bytes(link.topics.telemetry, data, 1, link._json_properties) == packet_bytes:
                    return data
            raise AssertionError(f"no payload makes a {packet_bytes}-byte packet")

        for seq, packet_bytes in ((1, BROKER_LIMIT), (2, BROKER_LIMIT + 1), (3, 500)):
            spool.append(link.topics.telemetry, payload(seq, packet_bytes))
        with link:
            assert recorder.wait_for(lambda ms: _seqs(ms) == [1, 3] and _too_large_reports(ms), timeout_s=10)
            assert link.flush(5)
            counters = link.counters
    assert counters.connects == 1 and counters.rejected == 1 and counters.acked == 3  # two windows and the report
    assert _too_large_reports(recorder.messages)[0]["details"]["size_bytes"] == BROKER_LIMIT + 1


def test_a_broker_that_drops_each_connection_at_once_meets_a_growing_backoff(
    mosquitto: MosquittoBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two agents with one client id (a cloned image): the broker takes the session over on every CONNECT. Before,
    the backoff reset at each CONNACK and both reconnected every ~0.2 s here (about once a second with the defaults)."""
    with caplog.at_level(logging.WARNING, logger="edgekit_runtime.agent.mqtt"), \
            Spool(tmp_path / "a.db") as spool_a, Spool(tmp_path / "b.db") as spool_b:  # fmt: skip
        links = [MqttLink(mosquitto.url, "same-id", FLEET, DEVICE, spool=spool, keepalive_s=5,
                          backoff=Backoff(initial_s=0.2, max_s=5.0, jitter=0.0)) for spool in (spool_a, spool_b)]  # fmt: skip
        for link in links:
            link.start()
        try:
            time.sleep(8.0)
            connects = [link.counters.connects for link in links]
            failures = [link.backoff.failures for link in links]
        finally:
            for link in links:
                link.stop()
    # 0.2 + 0.4 + 0.8 + 1.6 + 3.2 s: about 6 connects each in 8 s (before: ~30 each)
    assert sum(connects) <= 16 and min(failures) >= 3, (connects, failures)
    warnings = [r.getMessage() for r in caplog.records if "connections in a row ended within" in r.getMessage()]
    assert warnings and "same client id" in warnings[0] and "'same-id'" in warnings[0], caplog.text


def test_the_backoff_resets_once_a_connection_has_lasted(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        link = _link(mosquitto.url, spool, backoff=Backoff(initial_s=0.05, max_s=0.2), stable_after_s=1.0)
        with link:
            link.wait_connected(10)
            mosquitto.stop()
            deadline = time.monotonic() + 10
            while link.backoff.failures < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            mosquitto.start()
            link.wait_connected(10)
            assert link.backoff.failures >= 3  # accepted, not yet lasted
            deadline = time.monotonic() + 10
            while link.backoff.failures and time.monotonic() < deadline:
                time.sleep(0.05)
            assert link.backoff.failures == 0 and link.connected


@pytest.mark.parametrize("stable_after_s", [0, -1, True, "30"])
def test_stable_after_s_must_be_a_positive_number(stable_after_s: object) -> None:
    with pytest.raises(TelemetryError, match="stable_after_s must be a number > 0"):
        ConnectionWatch(Backoff(), "mqtt://x", stable_after_s=stable_after_s)  # type: ignore[arg-type]
