"""The collector's buffered paho client: large reads served in paho's small pieces, packets that span
reads, bursts acknowledged together, TLS, and acknowledgements that follow the store's commits."""

from __future__ import annotations

import json
import random
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgekit.fleet.collector import Collector
from edgekit.fleet.mqtt_buffered import BufferedClient, BufferedSocket
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker, make_tls_files, mosquitto_factory  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]


class ScriptedSocket:
    """A non-blocking socket stand-in: ``recv`` hands out the scripted chunks (at most ``bufsize`` bytes
    each), then raises BlockingIOError; ``send`` records what is written."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.recv_sizes: list[int] = []
        self.sent: list[bytes] = []
        self.closed = False

    def recv(self, bufsize: int) -> bytes:
        self.recv_sizes.append(bufsize)
        if not self.chunks:
            raise BlockingIOError()
        chunk = self.chunks.pop(0)
        if len(chunk) > bufsize:
            chunk, rest = chunk[:bufsize], chunk[bufsize:]
            self.chunks.insert(0, rest)
        return chunk

    def send(self, data: bytes) -> int:
        self.sent.append(bytes(data))
        return len(data)

    def fileno(self) -> int:
        return -1

    def setblocking(self, flag: bool) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _publish_packet(topic_name: str, payload: bytes, mid: int, qos: int = 1) -> bytes:
    """An MQTT 3.1.1 PUBLISH, QoS 1 (or 2)."""
    body = len(topic_name).to_bytes(2, "big") + topic_name.encode() + mid.to_bytes(2, "big") + payload
    length, remaining = bytearray(), len(body)
    while True:
        byte, remaining = remaining % 128, remaining // 128
        length.append(byte | (128 if remaining else 0))
        if not remaining:
            break
    return bytes([0x30 | qos << 1]) + bytes(length) + body


def _split(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, position = [], 0
    for size in sizes:
        chunks.append(data[position : position + size])
        position += size
    return [c for c in chunks if c] + ([data[position:]] if position < len(data) else [])


def test_buffered_socket_reads_large_and_returns_no_more_than_asked() -> None:
    raw = ScriptedSocket([b"abcdefghij", b"klm"])
    sock = BufferedSocket(raw, chunk_bytes=64)  # type: ignore[arg-type]
    assert sock.recv(1) == b"a" and raw.recv_sizes == [64]
    assert sock.pending() == 9 and sock.buffered() == 9
    assert sock.recv(3) == b"bcd"
    assert sock.recv(100) == b"efghij"  # the rest of the buffer: the caller asks again for more
    assert sock.pending() == 0
    assert sock.recv(2) == b"kl" and sock.recv(2) == b"m"
    with pytest.raises(BlockingIOError):  # nothing buffered, nothing on the socket
        sock.recv(1)
    assert raw.recv_sizes == [64, 64, 64]
    raw.chunks.append(b"")  # the peer closed: passed through
    assert sock.recv(5) == b""
    sock.close()
    assert raw.closed and sock.pending() == 0


def _client(protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311, **options: Any) -> BufferedClient:
    options.setdefault("client_id", "buffered-test")
    return BufferedClient(CallbackAPIVersion.VERSION2, protocol=protocol, **options)


@pytest.mark.parametrize("split", ["one_read", "7_byte_reads", "random_reads"])
def test_every_message_of_a_burst_arrives_in_order_with_one_write_of_acks(split: str) -> None:
    rng = random.Random(5)
    sizes = [10, 900, 0, 127, 128, 16_383, 16_384, 70_000, 5, 1_000]  # 1-, 2- and 3-byte remaining lengths
    payloads = [bytes(rng.getrandbits(8) for _ in range(n)) for n in sizes]
    stream = b"".join(_publish_packet(f"edgekit/v1/f/d-{i}/telemetry", p, mid=i + 1) for i, p in enumerate(payloads))
    if split == "one_read":
        chunks = [stream]
    elif split == "7_byte_reads":
        chunks = _split(stream, [7] * (len(stream) // 7))
    else:
        chunks = _split(stream, [rng.randint(1, 3000) for _ in range(len(stream) // 1000)])
    raw = ScriptedSocket(chunks)
    client = _client()
    client._sock = BufferedSocket(raw, chunk_bytes=1 << 20 if split == "one_read" else 4096)  # type: ignore[assignment,arg-type]
    received: list[tuple[str, bytes, int]] = []
    client.on_message = lambda c, u, m: received.append((m.topic, m.payload, m.mid))
    for _ in range(len(chunks) + 5):  # what select() would do: call loop_read while data comes
        assert client.loop_read() == paho.MQTT_ERR_SUCCESS
        if len(received) == len(payloads):
            break
    assert [(t, p) for t, p, _ in received] == [(f"edgekit/v1/f/d-{i}/telemetry", p) for i, p in enumerate(payloads)]
    acks = b"".join(raw.sent)
    assert acks == b"".join(bytes([0x40, 2]) + (i + 1).to_bytes(2, "big") for i in range(len(payloads)))
    if split == "one_read":  # one recv(), one loop_read() for the whole burst: its acks went out in one send()
        assert len(raw.recv_sizes) == 1 and len(raw.sent) == 1


def test_a_qos_2_publish_in_a_burst_keeps_the_acknowledgements_in_order() -> None:
    stream = b"".join(_publish_packet("edgekit/v1/f/d/telemetry", b"x", mid, qos) for mid, qos in ((1, 1), (2, 2), (3, 1)))
    raw = ScriptedSocket([stream])
    client = _client()
    client._sock = BufferedSocket(raw)  # type: ignore[assignment,arg-type]
    assert client.loop_read() == paho.MQTT_ERR_SUCCESS
    assert b"".join(raw.sent) == bytes([0x40, 2, 0, 1, 0x50, 2, 0, 2, 0x40, 2, 0, 3])  # PUBACK 1, PUBREC 2, PUBACK 3


def test_ack_many_writes_manual_acks_as_one_packet() -> None:
    raw = ScriptedSocket([])
    client = _client(manual_ack=True)
    client._sock = BufferedSocket(raw)  # type: ignore[assignment,arg-type]
    assert client.ack_many([7, 8, 300]) == paho.MQTT_ERR_SUCCESS
    assert raw.sent == [bytes([0x40, 2, 0, 7, 0x40, 2, 0, 8, 0x40, 2, 1, 44])]
    assert client.ack_many([]) == paho.MQTT_ERR_SUCCESS and len(raw.sent) == 1
    auto = _client()  # without manual_ack paho acknowledges by itself: nothing to do
    auto._sock = BufferedSocket(raw)  # type: ignore[assignment,arg-type]
    assert auto.ack_many([1]) == paho.MQTT_ERR_SUCCESS and len(raw.sent) == 1


def _subscriber(broker: MosquittoBroker, protocol: MQTTProtocolVersion, chunk_bytes: int,
                tls_context: ssl.SSLContext | None = None) -> tuple[BufferedClient, list[tuple[str, bytes]]]:  # fmt: skip
    client = _client(protocol)
    client.read_chunk_bytes = chunk_bytes
    if tls_context is not None:
        client.tls_set_context(tls_context)
    received: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    client.on_message = lambda c, u, m: received.append((m.topic, m.payload))
    client.on_connect = lambda c, u, f, rc, p: c.subscribe("edgekit/v1/burst/+/telemetry", qos=1)
    client.on_subscribe = lambda *args: subscribed.set()
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    assert subscribed.wait(10)
    assert isinstance(client.socket(), BufferedSocket)
    return client, received


def _burst(count: int) -> list[tuple[str, bytes]]:
    rng = random.Random(count)
    return [(f"edgekit/v1/burst/d-{i % 3}/telemetry", bytes(rng.getrandbits(8) for _ in range(rng.choice([5, 900, 20_000]))))
            for i in range(count)]  # fmt: skip


def _wait(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


@pytest.mark.parametrize("chunk_bytes", [100, 64 * 1024])
@pytest.mark.parametrize("protocol", [MQTTProtocolVersion.MQTTv311, MQTTProtocolVersion.MQTTv5])
def test_a_real_broker_burst_arrives_whole_and_in_order(mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
                                                        protocol: MQTTProtocolVersion, chunk_bytes: int) -> None:  # fmt: skip
    broker = mosquitto_factory(extra_config=["max_queued_messages 0"])
    client, received = _subscriber(broker, protocol, chunk_bytes)
    try:
        messages = _burst(300)
        with Publisher(broker) as device:
            device.publish_many(messages)
        assert _wait(lambda: len(received) >= len(messages)), f"{len(received)} of {len(messages)}"
        time.sleep(0.2)  # nothing more (no duplicates) arrives
        assert received == messages
    finally:
        client.disconnect()
        client.loop_stop()


def test_tls_bursts_arrive_whole(mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path,  # noqa: F811
                                 ) -> None:  # fmt: skip
    tls = make_tls_files(tmp_path / "tls")
    broker = mosquitto_factory(tls=tls, extra_config=["max_queued_messages 0"])
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    client, received = _subscriber(broker, MQTTProtocolVersion.MQTTv311, 64 * 1024, tls_context=context)
    publisher = _client(MQTTProtocolVersion.MQTTv5, client_id="buffered-test-publisher")
    try:
        assert isinstance(client.socket().wrapped, ssl.SSLSocket)  # type: ignore[union-attr]
        publisher.tls_set_context(ssl.create_default_context(cafile=str(tls.ca_cert)))
        publisher.max_inflight_messages_set(500)
        publisher.connect(broker.host, broker.port)
        publisher.loop_start()
        messages = _burst(200)
        infos = [publisher.publish(t, p, qos=1) for t, p in messages]
        for info in infos:
            info.wait_for_publish(30)
        assert _wait(lambda: len(received) >= len(messages)), f"{len(received)} of {len(messages)}"
        assert received == messages
    finally:
        for c in (client, publisher):
            c.disconnect()
            c.loop_stop()


# -- acknowledgements and commits ---------------------------------------------------------------

_COLLECTOR_PROCESS = """
import json, sys, time
from edgekit.fleet import collector as collector_module
from edgekit.fleet.collector import Collector
from edgekit.fleet.store import open_store
broker_url, store_url, client_id, ack_after_store = sys.argv[1:5]
collector_module.ACK_IDLE_FLUSH_S = 120  # batches of exactly 20: the last 10 stay in memory, not committed
collector = Collector(broker_url, open_store(store_url), client_id=client_id, fleet="crash", session_expiry_s=3600,
                      batch_size=20, flush_interval_s=120, ack_after_store=ack_after_store == "1").start()
while True:
    print(json.dumps(collector.metrics.snapshot()), flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def crash_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with MosquittoBroker(tmp_path / "mosquitto", extra_config=["max_queued_messages 0", "max_inflight_messages 0"]) as broker:
        yield broker


@pytest.mark.parametrize("ack_after_store", [True, False])
def test_a_killed_collector_loses_nothing_when_acks_follow_commits(crash_broker: MosquittoBroker, tmp_path: Path,
                                                                   ack_after_store: bool) -> None:  # fmt: skip
    """50 windows; the collector commits two batches of 20 and holds 10 when it is killed (SIGKILL). With
    ack_after_store the broker redelivers exactly those 10 to the next collector on the session; with
    acks on receipt (the default) they were acknowledged already and are lost, as documented."""
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    open_store(store_url).close()  # the schema, before two processes open it
    child = subprocess.Popen([sys.executable, "-c", _COLLECTOR_PROCESS, crash_broker.url, store_url, "crash-collector",
                              "1" if ack_after_store else "0"], cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        child.stdout.readline()  # connected and subscribed
        with Publisher(crash_broker) as device:
            device.publish_many([(topic("telemetry", fleet="crash"), encode_message(telemetry(s, fleet="crash")))
                                 for s in range(1, 51)])  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            counts = json.loads(child.stdout.readline())
            if counts["received"].get("telemetry") == 50 and counts["stored"].get("telemetry") == 40:
                break
        assert (counts["received"].get("telemetry"), counts["stored"].get("telemetry")) == (50, 40)
        time.sleep(0.5)  # the committed batches' PUBACKs reach the broker
        child.kill()
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    store = open_store(store_url)
    try:
        collector = Collector(crash_broker.url, store, client_id="crash-collector", fleet="crash", session_expiry_s=3600,
                              flush_interval_s=0.05, ack_after_store=ack_after_store).start()  # fmt: skip
        try:
            expected = 10 if ack_after_store else 0
            _wait(lambda: collector.metrics.snapshot()["received"].get("telemetry", 0) >= expected, 10)
            time.sleep(0.5)  # and no more than that
            assert collector.flush()
            assert collector.metrics.snapshot()["received"].get("telemetry", 0) == expected
        finally:
            collector.stop()
        seqs = [w.seq for w in store.windows(fleet="crash")]
    finally:
        store.close()
    assert seqs == list(range(1, 51 if ack_after_store else 41))  # each once


def test_a_queue_smaller_than_a_batch_does_not_stall(crash_broker: MosquittoBroker, tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        collector = Collector(crash_broker.url, store, client_id="small-queue", fleet="small", queue_size=5,
                              batch_size=500, flush_interval_s=0.2).start()  # fmt: skip
        try:
            with Publisher(crash_broker) as device:
                device.publish_many([(topic("telemetry", fleet="small"), encode_message(telemetry(s, fleet="small")))
                                     for s in range(1, 101)])  # fmt: skip
            assert _wait(lambda: collector.metrics.snapshot()["stored"].get("telemetry") == 100, 10)
        finally:
            collector.stop()
        assert [w.seq for w in store.windows()] == list(range(1, 101))


def test_acks_after_store_keep_flowing_when_the_broker_caps_unacknowledged_messages(tmp_path: Path) -> None:
    """Mosquitto sends at most 20 unacknowledged messages by default: the writer stores and acknowledges
    them as soon as arrivals pause, rather than after flush_interval_s (5 s here)."""
    with MosquittoBroker(tmp_path / "mosquitto", extra_config=["max_queued_messages 0"]) as broker, \
            open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:  # fmt: skip
        collector = Collector(broker.url, store, client_id="capped", fleet="capped", ack_after_store=True,
                              batch_size=500, flush_interval_s=5.0).start()  # fmt: skip
        try:
            started = time.monotonic()
            with Publisher(broker) as device:
                device.publish_many([(topic("telemetry", fleet="capped"), encode_message(telemetry(s, fleet="capped")))
                                     for s in range(1, 201)])  # fmt: skip
                assert _wait(lambda: collector.metrics.snapshot()["stored"].get("telemetry") == 200, 20)
            assert time.monotonic() - started < 3.0
        finally:
            collector.stop()
        assert [w.seq for w in store.windows()] == list(range(1, 201))
