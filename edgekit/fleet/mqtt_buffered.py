"""A paho-mqtt client that receives in large reads, for the collector's thousands of messages a second.

paho-mqtt 2.x reads every packet with three or more ``recv()`` calls (the command byte, the
remaining length one byte at a time, then the body) and goes back to ``select()`` after each packet;
each acknowledgement is one more ``send()``. At a few thousand 1 KiB messages a second those system
calls cost more than the messages' parsing. :class:`BufferedClient` wraps the connection in a
:class:`BufferedSocket`, which reads up to 64 KiB at once and serves paho's small reads from memory;
the client then handles every packet already buffered before it returns to ``select()``, and queues
the PUBACKs of such a burst as one write (:meth:`BufferedClient.ack_many` does the same for manual
acknowledgements). The MQTT behaviour is paho's own: same packets, same order, same callbacks, same
threads; a PUBACK still goes out only after ``on_message`` returned for its message.

TLS works unchanged: an ``ssl.SSLSocket`` is wrapped like a plain socket (paho's handshake happens
before), and :meth:`BufferedSocket.pending` adds what the SSL layer holds to what the wrapper holds.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

#: Bytes asked of the socket per read: some 60 telemetry windows.
CHUNK_BYTES = 64 * 1024
#: Packets handled per :meth:`BufferedClient.loop_read` call at most, so that writes (acknowledgements)
#: and keepalives are not held back behind a long backlog.
MAX_PACKETS_PER_READ = 500
_PUBACK = int(paho.PUBACK)
_PUBACK_PACKET = struct.Struct("!BBH")  # command, remaining length 2, packet id


class BufferedSocket:
    """A connected (plain or TLS) socket whose ``recv`` reads ``chunk_bytes`` at once and returns the
    bytes asked for from memory; everything else is the wrapped socket's.

    ``recv`` never returns more than asked, so paho's packet framing is untouched; it raises what the
    wrapped socket raises (``BlockingIOError``, ``ssl.SSLWantReadError``, ...) only when nothing is
    buffered. :meth:`pending` is what paho's loop checks before it waits in ``select()``.
    """

    def __init__(self, sock: socket.socket | ssl.SSLSocket, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._sock = sock
        self._chunk_bytes = chunk_bytes
        self._buffer = b""
        self._position = 0

    def recv(self, bufsize: int) -> bytes:
        buffer, start = self._buffer, self._position
        available = len(buffer) - start
        if available <= 0:
            data = self._sock.recv(max(bufsize, self._chunk_bytes))
            if len(data) <= bufsize:  # b"" (closed) included
                return data
            self._buffer, self._position = data, bufsize
            return data[:bufsize]
        if bufsize >= available:
            self._buffer, self._position = b"", 0
            return buffer[start:] if start else buffer
        self._position = start + bufsize
        return buffer[start : start + bufsize]

    def buffered(self) -> int:
        """Bytes read from the socket that paho has not taken yet."""
        return len(self._buffer) - self._position

    def pending(self) -> int:
        """Bytes readable without waiting: buffered here, plus decrypted ones the SSL layer holds."""
        inner = self._sock.pending() if isinstance(self._sock, ssl.SSLSocket) else 0
        return len(self._buffer) - self._position + inner

    def send(self, data: bytes | bytearray | memoryview) -> int:
        return self._sock.send(data)

    def fileno(self) -> int:
        return self._sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)

    def close(self) -> None:
        self._buffer, self._position = b"", 0
        self._sock.close()

    @property
    def wrapped(self) -> socket.socket | ssl.SSLSocket:
        return self._sock

    def __getattr__(self, name: str) -> Any:  # settimeout, getpeercert, ...: the socket's own
        if name == "_sock":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._sock, name)


class BufferedClient(paho.Client):
    """``paho.mqtt.client.Client`` reading through a :class:`BufferedSocket` (same constructor), plus
    :meth:`ack_many`."""

    #: Bytes asked of the socket per read.
    read_chunk_bytes: int = CHUNK_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._burst_thread: int | None = None  # the network thread while loop_read() holds its PUBACKs
        self._held_acks: list[int] = []

    def _create_socket(self) -> Any:
        sock = super()._create_socket()
        if isinstance(sock, (socket.socket, ssl.SSLSocket)):  # not websockets: paho wraps those itself
            return BufferedSocket(sock, self.read_chunk_bytes)
        return sock

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        # paho handles one packet per select(); go on while whole packets are already in memory, and
        # queue the burst's PUBACKs as one packet at the end (one wake-up of the loop, one send()).
        self._burst_thread = threading.get_ident()
        try:
            rc = super().loop_read(max_packets)
            budget = MAX_PACKETS_PER_READ
            while rc == MQTTErrorCode.MQTT_ERR_SUCCESS and budget > 0:
                sock = self._sock
                if not isinstance(sock, BufferedSocket) or sock.pending() <= 0:
                    break
                rc = super().loop_read(1)
                budget -= 1
            return rc
        finally:  # also when on_message raised: the messages before it were handled, as paho would ack them
            self._burst_thread = None
            self._release_held_acks()

    def _release_held_acks(self) -> None:
        held, self._held_acks = self._held_acks, []
        if held and self._sock is not None:  # a lost connection drops them, as paho drops its queue
            self._queue_pubacks(held)

    def _send_puback(self, mid: int) -> MQTTErrorCode:
        if self._burst_thread == threading.get_ident():
            self._held_acks.append(mid)
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return super()._send_puback(mid)

    def _send_pubrec(self, mid: int) -> MQTTErrorCode:
        if self._burst_thread == threading.get_ident():  # PUBACKs and PUBRECs go out in their PUBLISHes' order
            self._release_held_acks()
        return super()._send_pubrec(mid)

    def ack_many(self, mids: Sequence[int]) -> MQTTErrorCode:
        """Acknowledge QoS 1 messages received with ``manual_ack=True``, written as one packet."""
        if not self._manual_ack or not mids:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        if self._burst_thread == threading.get_ident():  # from on_message: with the burst's own
            self._held_acks.extend(mids)
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return self._queue_pubacks(mids)

    def _queue_pubacks(self, mids: Sequence[int]) -> MQTTErrorCode:
        self._easy_log(paho.MQTT_LOG_DEBUG, "Sending %d PUBACKs (Mids: %d..%d)", len(mids), mids[0], mids[-1])
        packet = b"".join([_PUBACK_PACKET.pack(_PUBACK, 2, mid) for mid in mids])
        # paho does nothing per PUBACK once written, so several in one queued packet behave like one each.
        return self._packet_queue(_PUBACK, packet, 0, 0)


__all__ = ["BufferedClient", "BufferedSocket", "CHUNK_BYTES"]
