"""Against a peer that accepts MQTT 5 connections but never acknowledges a PUBLISH: the link keeps at
most ``max_inflight`` messages unacknowledged, keeps them in the spool, and sends them again, in
order, on the next connection."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from tests.runtime.agent.sample_messages import sample_telemetry

CONNECT, PUBLISH, SUBSCRIBE, PINGREQ = 0x1, 0x3, 0x8, 0xC
CONNACK_V5_SUCCESS = bytes([0x20, 0x03, 0x00, 0x00, 0x00])  # flags, reason code, no properties
PINGRESP = bytes([0xD0, 0x00])


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


class SilentBroker:
    """Answers CONNECT, SUBSCRIBE and PINGREQ, records every PUBLISH as (connection number, topic, payload), acks nothing."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.publishes: list[tuple[int, str, bytes]] = []
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(conn)
                number = len(self._connections)
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            while True:
                first = _read_exactly(conn, 1)[0]
                length, shift = 0, 0
                while True:
                    byte = _read_exactly(conn, 1)[0]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                body = _read_exactly(conn, length)
                kind = first >> 4
                if kind == CONNECT:
                    conn.sendall(CONNACK_V5_SUCCESS)
                elif kind == SUBSCRIBE:  # packet id, no properties, granted QoS 1
                    conn.sendall(bytes([0x90, 0x04]) + body[:2] + bytes([0x00, 0x01]))
                elif kind == PINGREQ:
                    conn.sendall(PINGRESP)
                elif kind == PUBLISH:
                    qos = (first >> 1) & 0x3
                    topic_length = int.from_bytes(body[:2], "big")
                    topic = body[2 : 2 + topic_length].decode()
                    pos = 2 + topic_length + (2 if qos else 0)
                    properties_length, pos = _read_varint(body, pos)
                    with self._lock:
                        self.publishes.append((number, topic, body[pos + properties_length :]))
        except (ConnectionError, OSError):
            return

    def telemetry_seqs(self, connection: int) -> list[int]:
        with self._lock:
            return [json.loads(p)["seq"] for n, t, p in self.publishes if n == connection and t.endswith("/telemetry")]

    def drop_connections(self) -> None:
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # wakes the serving thread's recv and sends FIN
                except OSError:
                    pass
                conn.close()

    def close(self) -> None:
        self._server.close()
        self.drop_connections()


def _wait(predicate, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_unacknowledged_messages_stay_spooled_and_are_resent_in_order(tmp_path: Path) -> None:
    broker = SilentBroker()
    try:
        with Spool(tmp_path / "spool.db") as spool:
            link = MqttLink(f"mqtt://127.0.0.1:{broker.port}", "dev-1", "lab", "dev-1", spool=spool, max_inflight=3,
                            backoff=Backoff(initial_s=0.05, max_s=0.1))  # fmt: skip
            for _ in range(10):
                link.publish_telemetry(sample_telemetry(spool.next_seq()))
            with link:
                link.wait_connected(5)
                assert _wait(lambda: broker.telemetry_seqs(1) == [1, 2, 3])
                time.sleep(0.5)  # no PUBACK ever comes: nothing more is sent, nothing leaves the spool
                assert broker.telemetry_seqs(1) == [1, 2, 3]
                assert spool.backlog() == 10
                counters = link.counters
                assert counters.published == 3 and counters.acked == 0

                broker.drop_connections()
                assert _wait(lambda: broker.telemetry_seqs(2) == [1, 2, 3])  # resent from the spool, in order
                assert link.counters.reconnects == 1
                assert spool.backlog() == 10
                with broker._lock:
                    status = [json.loads(p)["state"] for _, t, p in broker.publishes if t.endswith("/status")]
                assert status == ["online", "online"]
                broker.close()  # gone before stop(): stop() does not wait for the offline status' PUBACK
    finally:
        broker.close()
