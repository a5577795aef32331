"""Many MQTT connections driven by one thread: paho clients on paho's external-loop API.

Each simulated device gets a connection of its own (its own client id, will, subscription and
QoS 1 flow), exactly like a real agent, but a single thread owns all of them: one ``selectors``
loop reads and writes their sockets, runs timers, and carries out calls handed over from other
threads (:meth:`MqttMux.call_soon`). That keeps hundreds of devices to one thread instead of two
per :class:`~edgekit_runtime.agent.mqtt.MqttLink`.

Outgoing messages are queued per connection and handed to paho at most ``window`` at a time
(paho's own in-flight window); each PUBACK makes room for the next. Nothing is persisted: a
simulator has no spool, so what is queued when the process stops is lost (and counted).

Connecting is paced: at most ``max_connecting`` connections wait for their CONNACK at a time (the
others wait in line, reconnects too), so thousands of devices never overrun the broker's accept
queue (Mosquitto listens with a backlog of 100; a dropped SYN costs a second of retransmission in a
blocking connect). Keep-alive work (paho's ``loop_misc``) visits a slice of the connections on each
tick, so every connection is visited about every :data:`_MISC_ROUND_S` seconds whatever their number.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.broker import (BrokerAddress, make_tls_context, parse_broker_url, read_password_file,
                                          refuse_plaintext_password)
from edgekit_runtime.agent.topics import TelemetryError

logger = logging.getLogger(__name__)

MqttVersion = Literal["5", "3.1.1"]
MQTT_VERSIONS: dict[str, MQTTProtocolVersion] = {"5": MQTTProtocolVersion.MQTTv5, "3.1.1": MQTTProtocolVersion.MQTTv311}
_MISC_INTERVAL_S = 0.5
#: Every connection gets paho's ``loop_misc`` (keep-alive pings, timeouts) about this often.
_MISC_ROUND_S = 2.0
#: Timers run per turn of the loop before the sockets are served again: a loop that fell behind (10,000
#: devices' windows due at once on a starved host) keeps answering PUBACKs and pings meanwhile, so the
#: broker does not drop connections as silent.
_TIMERS_PER_STEP = 200
#: Connections waiting for their CONNACK at once, by default (Mosquitto's listen backlog is 100).
DEFAULT_MAX_CONNECTING = 64


class _SimClient(paho.Client):  # type: ignore[misc]  # paho is untyped here
    """paho's client, asking the environment about a proxy once per broker host instead of on every
    connect: paho reads the whole of ``os.environ`` twice per connect (``urllib.request.getproxies``),
    about a sixth of the CPU of connecting 10,000 devices. The answer is the same for every device."""

    _proxy_by_host: dict[str, Any] = {}

    def _get_proxy(self) -> Any:
        if self._proxy:  # set explicitly with proxy_set(): paho's own handling
            return super()._get_proxy()
        host = str(self._host)
        if host not in self._proxy_by_host:
            self._proxy_by_host[host] = super()._get_proxy()
        return self._proxy_by_host[host]


@dataclass(frozen=True)
class BrokerOptions:
    """Where the simulated devices connect, and how."""

    url: str
    mqtt_version: MqttVersion = "5"
    tls_ca: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    keepalive_s: int = 30
    #: send the password over mqtt:// to a broker that is not on loopback (refused unless true)
    allow_plaintext_password: bool = False

    def address(self) -> BrokerAddress:
        if self.mqtt_version not in MQTT_VERSIONS:
            raise TelemetryError(f"unknown MQTT version {self.mqtt_version!r}", hint="use '5' or '3.1.1'")
        refuse_plaintext_password(self.url, has_password=self.password_file is not None,
                                  allow=self.allow_plaintext_password, source="fleet simulate", field="--password-file",
                                  allow_option="--allow-plaintext-password")  # fmt: skip
        return parse_broker_url(self.url)


@dataclass
class Connection:
    """One device's MQTT connection, owned by the mux thread."""

    client_id: str
    client: paho.Client
    on_connected: Callable[[Connection], None]
    on_message: Callable[[str, bytes], None]
    will: Callable[[], tuple[str, bytes]]
    window: int
    queue: deque[tuple[str, bytes, int, bool]] = field(default_factory=deque)
    outstanding: int = 0
    connected: bool = False
    ever_connected: bool = False
    #: its socket is open and its CONNECT sent, no CONNACK yet (counts against the mux's max_connecting)
    awaiting_connack: bool = False
    #: in the mux's line of connections to start
    waiting_to_connect: bool = False
    #: cut by :meth:`MqttMux.drop` (a simulated crash): stays down
    dropped: bool = False
    closing: bool = False
    published: int = 0
    acked: int = 0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.5, max_s=10.0))


class MqttMux:
    """One thread, many paho clients. Every method except :meth:`call_soon`, :meth:`start`,
    :meth:`stop` and :meth:`call` must run on the mux thread (from a callback or a timer)."""

    def __init__(self, broker: BrokerOptions, *, window: int = 32, max_connecting: int = DEFAULT_MAX_CONNECTING,
                 name: str = "edgekit-sim-mqtt") -> None:  # fmt: skip
        self.broker = broker
        self.address = broker.address()
        self.window = window
        self.max_connecting = max(1, max_connecting)
        self.name = name
        self.connections: dict[str, Connection] = {}
        self._to_connect: deque[Connection] = deque()
        self._connecting = 0
        self._misc_order: list[Connection] = []
        self._misc_next = 0
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._calls: deque[Callable[[], None]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tls_context = make_tls_context(broker.tls_ca, None, None) if self.address.tls else None
        self._password = read_password_file(broker.password_file) if broker.password_file is not None else None
        self._properties: Properties | None = None
        if broker.mqtt_version == "5":
            self._properties = Properties(PacketTypes.PUBLISH)
            self._properties.PayloadFormatIndicator = 1
            self._properties.ContentType = "application/json"

    # -- thread handling --------------------------------------------------------------------------

    def start(self) -> MqttMux:
        if self._thread is not None:
            raise TelemetryError("the simulator's MQTT loop was already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def call_soon(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the mux thread (thread-safe)."""
        self._calls.append(action)
        self._wake()

    def call(self, action: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Run ``action`` on the mux thread and return its result (thread-safe, blocking)."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = action()
            except BaseException as exc:  # handed back to the caller's thread
                box["error"] = exc
            finally:
                done.set()

        self.call_soon(run)
        if not done.wait(timeout_s):
            raise TelemetryError(f"the simulator's MQTT loop did not answer within {timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def schedule(self, delay_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + max(0.0, delay_s), next(self._timer_ids), action))

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    # -- connections --------------------------------------------------------------------------------

    def add(self, client_id: str, *, on_connected: Callable[[Connection], None], on_message: Callable[[str, bytes], None],
            will: Callable[[], tuple[str, bytes]]) -> Connection:  # fmt: skip
        """Create a connection and put it in line to connect (mux thread)."""
        version = MQTT_VERSIONS[self.broker.mqtt_version]
        if version is MQTTProtocolVersion.MQTTv5:
            client = _SimClient(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version)
        else:
            client = _SimClient(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version, clean_session=True)
        connection = Connection(client_id, client, on_connected, on_message, will, self.window)
        if self._tls_context is not None:
            client.tls_set_context(self._tls_context)
        if self.broker.username is not None:
            client.username_pw_set(self.broker.username, self._password)
        client.max_inflight_messages_set(self.window + 4)
        client.user_data_set(connection)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        if version is MQTTProtocolVersion.MQTTv5:
            client.connect_async(self.address.host, self.address.port, keepalive=self.broker.keepalive_s, clean_start=True)
        else:
            client.connect_async(self.address.host, self.address.port, keepalive=self.broker.keepalive_s)
        self.connections[client_id] = connection
        self._misc_order.append(connection)
        self._queue_connect(connection)
        return connection

    @property
    def connecting(self) -> int:
        """Connections waiting for a CONNACK now."""
        return self._connecting

    @property
    def waiting_to_connect(self) -> int:
        """Connections in line to start connecting."""
        return len(self._to_connect)

    def _queue_connect(self, connection: Connection) -> None:
        if self._stop.is_set() or connection.closing or connection.waiting_to_connect or connection.awaiting_connack:
            return
        connection.waiting_to_connect = True
        self._to_connect.append(connection)
        self._start_connects()

    def _start_connects(self) -> None:
        while self._to_connect and self._connecting < self.max_connecting:
            connection = self._to_connect.popleft()
            connection.waiting_to_connect = False
            self._connect(connection)

    def _connack_settled(self, connection: Connection) -> None:
        if connection.awaiting_connack:
            connection.awaiting_connack = False
            self._connecting -= 1
            self._start_connects()

    def _connect(self, connection: Connection) -> None:
        if self._stop.is_set() or connection.closing:
            return
        topic, payload = connection.will()
        connection.client.will_set(topic, payload, qos=1, retain=True)
        try:
            rc = connection.client.reconnect()
        except (OSError, ValueError) as exc:
            delay = connection.backoff.next_delay_s()
            logger.warning("%s: cannot connect to %s (%s); retrying in %.1f s", connection.client_id, self.address.url, exc, delay)
            self.schedule(delay, lambda: self._queue_connect(connection))
            return
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.schedule(connection.backoff.next_delay_s(), lambda: self._queue_connect(connection))
            return
        connection.awaiting_connack = True
        self._connecting += 1

    def publish(self, connection: Connection, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Queue a message; it goes out in order, within the connection's in-flight window (mux thread)."""
        connection.queue.append((topic, payload, qos, retain))
        self._pump(connection)

    def _pump(self, connection: Connection) -> None:
        client = connection.client
        while connection.connected and connection.queue and connection.outstanding < connection.window:
            topic, payload, qos, retain = connection.queue[0]
            info = client.publish(topic, payload, qos=qos, retain=retain, properties=self._properties)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return
            connection.queue.popleft()
            connection.published += 1
            if qos > 0:
                connection.outstanding += 1
            else:
                connection.acked += 1

    def drop(self, connection: Connection) -> None:
        """Close the socket without DISCONNECT, as a crash or a cut cable would (the broker sends the will)."""
        connection.closing = True
        connection.dropped = True
        sock = connection.client.socket()
        connection.connected = False
        self._connack_settled(connection)
        if sock is not None:
            self._unregister(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def disconnect(self, connection: Connection) -> None:
        """A clean DISCONNECT (no will) after what is queued in paho has been written."""
        connection.closing = True
        connection.client.disconnect()

    # -- paho callbacks (mux thread) ----------------------------------------------------------------

    def _on_connect(self, client: paho.Client, connection: Connection, flags: Any, reason: Any, properties: Any) -> None:
        self._connack_settled(connection)
        if reason.is_failure:
            logger.error("%s: broker %s refused the connection: %s", connection.client_id, self.address.url, reason)
            return
        connection.connected = True
        connection.outstanding = 0
        connection.backoff.reset()
        connection.on_connected(connection)
        connection.ever_connected = True
        self._pump(connection)

    def _on_disconnect(self, client: paho.Client, connection: Connection, flags: Any, reason: Any, properties: Any) -> None:
        connection.connected = False
        self._connack_settled(connection)
        if connection.closing or self._stop.is_set():
            return
        delay = connection.backoff.next_delay_s()
        logger.warning("%s: connection to %s lost (%s); reconnecting in %.1f s", connection.client_id, self.address.url, reason, delay)
        self.schedule(delay, lambda: self._queue_connect(connection))

    def _on_publish(self, client: paho.Client, connection: Connection, mid: int, reason: Any, properties: Any) -> None:
        connection.outstanding = max(0, connection.outstanding - 1)
        connection.acked += 1
        self._pump(connection)

    def _on_message(self, client: paho.Client, connection: Connection, message: paho.MQTTMessage) -> None:
        try:
            connection.on_message(message.topic, bytes(message.payload))
        except Exception:  # one bad handler must not stop the loop of every device
            logger.exception("%s: handling a message on %s failed", connection.client_id, message.topic)

    def _on_socket_open(self, client: paho.Client, connection: Connection, sock: Any) -> None:
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _on_socket_close(self, client: paho.Client, connection: Connection, sock: Any) -> None:
        self._unregister(sock)

    def _on_register_write(self, client: paho.Client, connection: Connection, sock: Any) -> None:
        try:
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection)
        except (KeyError, ValueError):
            pass

    def _on_unregister_write(self, client: paho.Client, connection: Connection, sock: Any) -> None:
        try:
            self._selector.modify(sock, selectors.EVENT_READ, connection)
        except (KeyError, ValueError):
            pass

    def _unregister(self, sock: Any) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    # -- the loop -----------------------------------------------------------------------------------

    def _run(self) -> None:
        next_misc = time.monotonic() + _MISC_INTERVAL_S
        while not self._stop.is_set():
            try:
                next_misc = self._step(next_misc)
            except Exception:  # the loop must outlive any single failure
                logger.exception("simulator MQTT loop: unexpected error; continuing")
                time.sleep(0.1)
        self._close_all()

    def _step(self, next_misc: float) -> float:
        while self._calls:
            self._calls.popleft()()
        now = time.monotonic()
        budget = _TIMERS_PER_STEP
        while self._timers and self._timers[0][0] <= now and budget > 0:
            _, _, action = heapq.heappop(self._timers)
            action()
            budget -= 1
        if self._calls:
            return next_misc
        deadline = min(next_misc, self._timers[0][0] if self._timers else next_misc)
        # behind on timers: still read and write the sockets (PUBACKs, pings) before the next batch of them
        for key, mask in self._selector.select(max(0.0, deadline - time.monotonic()) if budget > 0 else 0.0):
            connection = key.data
            if connection is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                continue
            if mask & selectors.EVENT_READ:
                connection.client.loop_read()
            if mask & selectors.EVENT_WRITE and connection.client.socket() is not None:
                connection.client.loop_write()
        if time.monotonic() >= next_misc:
            self._misc_slice()
            next_misc = time.monotonic() + _MISC_INTERVAL_S
        return next_misc

    def _misc_slice(self) -> None:
        """paho's ``loop_misc`` for the next slice of connections (each about every ``_MISC_ROUND_S``)."""
        order = self._misc_order
        if not order:
            return
        size = max(1, -(-len(order) * _MISC_INTERVAL_S // _MISC_ROUND_S))
        first = self._misc_next if self._misc_next < len(order) else 0
        for connection in order[first:first + int(size)]:
            if connection.client.socket() is not None:
                connection.client.loop_misc()
        self._misc_next = first + int(size)

    def _close_all(self) -> None:
        for connection in self.connections.values():
            connection.closing = True
            if connection.client.socket() is not None:
                try:
                    connection.client.disconnect()
                    connection.client.loop_write()
                except OSError:
                    pass
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
