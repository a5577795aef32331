"""The fleet collector: subscribes to the agents' MQTT topics, validates every message and stores it.

One paho-mqtt 2.x client (MQTT 3.1.1 by default, or 5; a :class:`~edgekit.fleet.mqtt_buffered.BufferedClient`,
which reads the socket in large chunks) receives, and :func:`~edgekit.fleet.ingest.parse_message`
validates each message in the network thread; a writer thread stores the records in batches (every
``batch_size`` records or ``flush_interval_s`` seconds; a transaction per kind of record). Telemetry
windows and events are stored once however often they arrive (QoS 1 redelivery, spool replay).
Rejected messages are counted per reason, logged with their topic, and a bounded sample of them (with a
summary row for the rest) is kept in the store's rejected table (:mod:`~edgekit.fleet.rejected_samples`).

With ``shared_group`` the telemetry and event subscriptions go through ``$share/<group>/...`` and
several collectors split the load. Status topics are always subscribed plainly: brokers do not send
retained messages to shared subscriptions, and every collector should know which devices are online
(status writes are idempotent, so several collectors writing them agree).

Acknowledgement: by default (``ack_after_store``) the PUBACK goes out only after the batch is committed,
so a killed collector's messages are redelivered (to it, with a persistent session, or to another member
of a shared group): nothing acknowledged is ever lost. A broker sends only so many unacknowledged
messages (Mosquitto's ``max_inflight_messages``, 20 by default), so the writer also stores what it holds
as soon as nothing has arrived for ``ACK_IDLE_FLUSH_S``; a ``max_inflight_messages`` well above
``batch_size`` still gives the best rate. ``ack_after_store=False`` acknowledges each message as it
arrives (with the others of the same socket read), before it is stored, so what a collector holds in
memory when it is killed is lost (the agents' spools cover broker outages, not this).

Sessions: with ``session_expiry_s`` > 0 and a fixed ``client_id`` (``edgekit fleet collect`` uses
:func:`default_client_id` and a day), the broker queues for a stopped collector, and a shared group keeps
routing a share to it; :meth:`Collector.retire` drains and ends such a session for good (scale-in).
Telemetry redelivered after retention rolled it up is still recognised (the store keeps the rolled-up
seqs), so nothing is counted twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from pathlib import Path
from typing import Any

from edgekit.fleet.acks import StoredAcks
from edgekit.fleet.collector_writes import StoreWrites, why
from edgekit.fleet.errors import CollectorError, StoreError
from edgekit.fleet.handoff import Handoff, HandoffItem
from edgekit.fleet.ingest import MAX_PAYLOAD_BYTES, READ_KINDS, Rejection, parse_message
from edgekit.fleet.metrics import IngestMetrics
from edgekit.fleet.rejected_samples import RejectedSampler, RejectedSampling, RejectionLog
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus, FleetStore, TelemetryWindow

logger = logging.getLogger(__name__)

#: MQTT versions the collector speaks. 3.1.1 is the default: paho-mqtt receives it with about 40 % less
#: CPU than MQTT 5, and it keeps QoS 1, retained status, wills and (on Mosquitto and EMQX) ``$share``
#: subscriptions; use 5 for a broker that only shares subscriptions with MQTT 5 clients.
MQTT_VERSIONS = ("5", "3.1.1")
DEFAULT_MQTT_VERSION = "3.1.1"
#: Raw windows older than this are rolled up by default (``retention=None`` keeps them raw forever).
DEFAULT_RETENTION = dt.timedelta(hours=1)
#: With ack_after_store: a pause in arrivals this long stores (and acknowledges) the batch held so far,
#: since the broker may be waiting for those acknowledgements before it sends more.
ACK_IDLE_FLUSH_S = 0.005
#: Session expiry of ``edgekit fleet collect`` (1 day): a collector away for less than this finds every message
#: the broker accepted meanwhile queued for it (within the broker's own queue bound, ``max_queued_messages``).
DEFAULT_SESSION_EXPIRY_S = 24 * 3600
#: The longest MQTT 5 session expiry (about 136 years).
MAX_SESSION_EXPIRY_S = 0xFFFF_FFFF
#: The longest wait between retention passes while they keep failing (each failure doubles the interval up to it).
RETENTION_BACKOFF_MAX_S = 3600.0
#: The MQTT 5 Maximum Packet Size asked of the broker is max_payload_bytes plus this (the longest topic and headers):
#: an oversized message a little over the limit is still received and counted, a huge one is dropped by the broker.
PACKET_OVERHEAD_BYTES = 64 * 1024 + 16
MAX_PACKET_BYTES = 268_435_455  # the largest MQTT packet
_STOP = object()


def default_client_id(fleet: str | None = None, shared_group: str | None = None, host: str | None = None) -> str:
    """The client id ``edgekit fleet collect`` uses unless given one: the same on every start on this host for
    this fleet (and shared group), so that a restarted collector gets back its persistent session and with it
    what the broker queued, or had sent unacknowledged, while it was away."""
    import re
    import socket

    host_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", host if host is not None else socket.gethostname()) or "host"
    return "-".join(["edgekit-collector", host_name, fleet or "all"] + ([shared_group] if shared_group else []))


class Collector(StoreWrites):
    """Collect one fleet (or all, ``fleet=None``) from the broker at ``broker_url`` into ``store``.

    ``with Collector("mqtt://127.0.0.1:1883", store, client_id="collector-1") as collector: ...``
    starts it and stops it (storing what it holds). :meth:`flush` waits until every message received
    so far is stored; :attr:`metrics` holds the counters and gauges ``/metrics`` serves.

    ``max_payload_bytes``: larger messages are rejected as ``oversized``. ``queue_size``: records held
    for the writer; when full, receiving waits (the broker buffers). ``session_expiry_s`` > 0 keeps a
    persistent session (with a fixed ``client_id``, the broker queues for the collector while it is
    away). ``retention`` (default 1 h; ``None`` keeps everything raw): raw windows older than this are
    rolled into ``rollup_minutes`` buckets, checked every ``retention_interval_s``; with ``rollup_retention``,
    rollups older than that are forgotten (the fleet's hourly aggregates and each device's totals stay).
    ``mqtt_version``: "3.1.1" (default; cheaper to receive, and what the local stack's embedded broker
    speaks) or "5" (for brokers that share subscriptions only with MQTT 5 clients). ``username``/``password_file`` and ``tls_*`` as for the agent;
    a password over ``mqtt://`` to a host that is not loopback is refused unless ``allow_plaintext_password``.
    """

    def __init__(
        self,
        broker_url: str,
        store: FleetStore,
        *,
        client_id: str,
        fleet: str | None = None,
        shared_group: str | None = None,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        rejected_sampling: RejectedSampling | None = None,  # rows kept per reason and bytes per window
        batch_size: int = 500,
        flush_interval_s: float = 0.25,
        queue_size: int = 20_000,
        username: str | None = None,
        password_file: str | Path | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        keepalive_s: int = 30,
        session_expiry_s: int = 0,
        retention: dt.timedelta | None = DEFAULT_RETENTION,
        rollup_minutes: int = 5,
        retention_interval_s: float = 60.0,
        rollup_retention: dt.timedelta | None = None,
        metrics: IngestMetrics | None = None,
        ack_after_store: bool = True,
        mqtt_version: str = DEFAULT_MQTT_VERSION,
        allow_plaintext_password: bool = False,
        alerts: Any = None,
    ) -> None:
        from edgekit_runtime.agent.broker import parse_broker_url, refuse_plaintext_password
        from edgekit_runtime.agent.topics import TelemetryError, subscription, validate_id

        try:
            self.address = parse_broker_url(broker_url)
            refuse_plaintext_password(broker_url, has_password=password_file is not None, allow=allow_plaintext_password,
                                      source="fleet collect", field="--password-file",
                                      allow_option="--allow-plaintext-password (Collector(allow_plaintext_password=True))")  # fmt: skip
            if fleet is not None:
                validate_id(fleet, "fleet id")
            if shared_group is not None:
                validate_id(shared_group, "shared subscription group")
        except TelemetryError as exc:
            raise CollectorError(exc.message, hint=exc.hint) from exc
        for label, value, minimum in (("batch_size", batch_size, 1), ("max_payload_bytes", max_payload_bytes, 1),
                                      ("queue_size", queue_size, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise CollectorError(f"collector {label} must be an integer >= {minimum}, got {value!r}")
        if mqtt_version not in MQTT_VERSIONS:
            raise CollectorError(f"collector mqtt_version must be one of {', '.join(MQTT_VERSIONS)}, got {mqtt_version!r}",
                                 hint="use '3.1.1' (the default, cheaper to receive) or '5'")  # fmt: skip
        if not flush_interval_s > 0:
            raise CollectorError(f"collector flush_interval_s must be > 0, got {flush_interval_s!r}")
        if (isinstance(session_expiry_s, bool) or not isinstance(session_expiry_s, int)
                or not 0 <= session_expiry_s <= MAX_SESSION_EXPIRY_S):  # fmt: skip
            raise CollectorError(f"collector session_expiry_s must be an integer from 0 to {MAX_SESSION_EXPIRY_S}, "
                                 f"got {session_expiry_s!r}",
                                 hint="0 is a clean session; a day (86400) rides out restarts and outages")  # fmt: skip
        if not client_id and session_expiry_s:
            raise CollectorError("collector with a persistent session (session_expiry_s > 0) needs a client_id",
                                 hint="give a fixed client id, e.g. default_client_id(fleet)")  # fmt: skip
        self.broker_url, self.store, self.client_id = self.address.url, store, client_id
        self.fleet, self.shared_group = fleet, shared_group
        self.max_payload_bytes, self.batch_size, self.flush_interval_s = max_payload_bytes, batch_size, flush_interval_s
        self.retention, self.rollup_minutes, self.retention_interval_s = retention, rollup_minutes, retention_interval_s
        self.rollup_retention = rollup_retention
        self.metrics = metrics or IngestMetrics()
        self.alerts = alerts  # an edgekit.fleet.alerts.AlertEngine: fed stored windows, started and stopped with us
        self.ack_after_store, self.mqtt_version = ack_after_store, mqtt_version
        prefix = f"$share/{shared_group}/" if shared_group else ""
        self.subscriptions: tuple[str, ...] = (
            prefix + subscription("telemetry", fleet), prefix + subscription("events", fleet), subscription("status", fleet),
        )  # fmt: skip
        self._auth = (username, password_file, tls_ca, tls_cert, tls_key)
        self._keepalive_s, self._session_expiry_s = keepalive_s, session_expiry_s
        self._queue = Handoff(queue_size)
        self._generation = 0
        self._subscribed = threading.Event()
        self._unsubscribed = threading.Event()
        self._retiring = False
        self._session_present = False
        self._connect_problem: str | None = None
        self._stopping = threading.Event()
        self._rejections_logged = RejectionLog()  # used by the network thread only
        self._rejected = RejectedSampler(rejected_sampling)  # used by the writer thread only
        self._writer = threading.Thread(target=self._write_loop, name="edgekit-collector-writer", daemon=True)
        self._client: Any = None
        self._last_retention = time.monotonic()
        self._retention_wait_s = retention_interval_s  # doubled while retention passes fail
        self.acks = StoredAcks(client_id)  # ack.v1 to each device after a commit (edgekit/fleet/acks.py)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 10.0) -> Collector:
        """Connect, subscribe (QoS 1) and start the writer; raise :class:`CollectorError` if that fails."""
        from edgekit_runtime.agent.broker import describe_connect_failure

        self._client = self._make_client()
        self._writer.start()
        try:
            if self.mqtt_version == "5":
                self._client.connect(self.address.host, self.address.port, keepalive=self._keepalive_s,
                                     clean_start=self._session_expiry_s == 0, properties=self._connect_properties())  # fmt: skip
            else:
                self._client.connect(self.address.host, self.address.port, keepalive=self._keepalive_s)
        except (OSError, ValueError) as exc:
            self._stop_writer()
            message, hint = describe_connect_failure(exc, self.address)
            raise CollectorError(f"collector {self.client_id}: {message}", hint=hint) from exc
        self._client.loop_start()
        if not self._subscribed.wait(timeout_s) or self._connect_problem:
            problem = self._connect_problem or f"no subscription acknowledged within {timeout_s:g} s"
            self.stop()
            raise CollectorError(f"collector {self.client_id} could not subscribe on {self.broker_url}: {problem}",
                                 hint="check the broker URL, the credentials and the broker's ACL (the collector reads "
                                      "edgekit/v1/#)")  # fmt: skip
        logger.info("collector %s subscribed on %s to %s", self.client_id, self.broker_url, ", ".join(self.subscriptions))
        if self.alerts is not None:
            self.alerts.start(publish=lambda topic, payload: self._client.publish(topic, payload, qos=1))
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop receiving, store and acknowledge what was received, then disconnect."""
        if self._client is None or self._stopping.is_set():
            return
        if self.alerts is not None:
            self.alerts.stop(timeout_s)
        client = self._client
        if client.is_connected() and not self._session_expiry_s:  # a persistent session keeps its subscriptions
            self._unsubscribed.clear()
            client.unsubscribe(list(self.subscriptions))
            self._unsubscribed.wait(min(timeout_s, 2.0))
        self.flush(timeout_s)
        self._stopping.set()
        client.disconnect()
        client.loop_stop()
        self._stop_writer(timeout_s)

    def retire(self, idle_s: float = 2.0, timeout_s: float = 600.0) -> int | None:
        """Instead of :meth:`start`: end this client id's persistent session for good, storing what it holds.

        Connects to the session, unsubscribes at once (the broker routes nothing new to it: the other members
        of a shared group get everything), stores and acknowledges what the broker had queued for it until
        nothing has come for ``idle_s`` (or ``timeout_s`` passed), then ends the session (MQTT 5: session expiry
        0 on DISCONNECT; 3.1.1: a clean-session connection). Returns how many messages it drained, or None
        when the broker held no session for this client id."""
        if self._client is not None:
            raise CollectorError(f"collector {self.client_id} is already started; retire() is used instead of start()")
        if not self._session_expiry_s:
            raise CollectorError(f"collector {self.client_id}: retire() needs session_expiry_s > 0 (it resumes the "
                                 "session to drain it)", hint="pass the session_expiry_s the collector ran with")  # fmt: skip
        self._retiring = True
        self.start()
        deadline = time.monotonic() + timeout_s
        last, quiet_since = -1, time.monotonic()
        while self._session_present and time.monotonic() < deadline:
            received = sum(self.metrics.snapshot()["received"].values())
            if received != last:
                last, quiet_since = received, time.monotonic()
            elif time.monotonic() - quiet_since >= idle_s:
                break
            time.sleep(0.05)
        self.flush()
        drained = sum(self.metrics.snapshot()["received"].values())
        self._end_session()
        logger.info("collector %s retired its session (%s)", self.client_id,
                    f"{drained} messages drained" if self._session_present else "there was none")  # fmt: skip
        return drained if self._session_present else None

    def _end_session(self) -> None:
        client = self._client
        self._stopping.set()
        if self.mqtt_version == "5":
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            properties = Properties(PacketTypes.DISCONNECT)
            properties.SessionExpiryInterval = 0
            client.disconnect(properties=properties)
        else:
            client.disconnect()
        client.loop_stop()
        self._stop_writer()
        if self.mqtt_version != "5":  # 3.1.1 ends a session by connecting with a clean one (it is empty by now)
            connected = threading.Event()
            clean = self._make_client(clean_session=True)
            clean.on_connect = lambda *args: connected.set()
            clean.on_subscribe = clean.on_unsubscribe = clean.on_message = clean.on_disconnect = None
            clean.connect(self.address.host, self.address.port, keepalive=self._keepalive_s)
            clean.loop_start()
            connected.wait(10.0)
            clean.disconnect()
            clean.loop_stop()

    def _stop_writer(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join(timeout_s)

    def run_forever(self) -> None:
        """Start (if not yet) and block until :meth:`stop` is called from another thread or Ctrl-C."""
        if self._client is None:
            self.start()
        try:
            while not self._stopping.wait(0.5):
                pass
        finally:
            self.stop()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every message received so far is stored; False if that took longer than ``timeout_s``."""
        if not self._writer.is_alive():
            return self._queue.qsize() == 0
        done = threading.Event()
        if not self._queue.put(done, timeout=timeout_s):
            return False
        return done.wait(timeout_s)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- MQTT ---------------------------------------------------------------------------------
    def _make_client(self, clean_session: bool | None = None) -> Any:
        from edgekit_runtime.agent.broker import make_tls_context, read_password_file
        from edgekit_runtime.agent.topics import TelemetryError
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        from edgekit.fleet.mqtt_buffered import BufferedClient

        username, password_file, tls_ca, tls_cert, tls_key = self._auth
        if self.mqtt_version == "5":
            client = BufferedClient(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                    protocol=MQTTProtocolVersion.MQTTv5, manual_ack=self.ack_after_store)  # fmt: skip
        else:
            client = BufferedClient(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                    protocol=MQTTProtocolVersion.MQTTv311,
                                    clean_session=self._session_expiry_s == 0 if clean_session is None else clean_session,
                                    manual_ack=self.ack_after_store)  # fmt: skip
        try:
            if username is not None:
                client.username_pw_set(username, read_password_file(password_file) if password_file else None)
            if self.address.tls:
                client.tls_set_context(make_tls_context(tls_ca, tls_cert, tls_key))
        except TelemetryError as exc:
            raise CollectorError(exc.message, hint=exc.hint) from exc
        client.reconnect_delay_set(1, 30)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_disconnect = self._on_disconnect
        client.on_unsubscribe = self._on_unsubscribe
        client.on_message = self._on_message
        return client

    def _connect_properties(self) -> Any:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        properties = Properties(PacketTypes.CONNECT)
        if self._session_expiry_s:
            properties.SessionExpiryInterval = self._session_expiry_s
        # the broker drops (as delivered) what is larger, instead of making us read it all to reject it as oversized
        properties.MaximumPacketSize = min(self.max_payload_bytes + PACKET_OVERHEAD_BYTES, MAX_PACKET_BYTES)
        return properties

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._connect_problem = f"the broker refused the connection: {reason}"
            logger.error("collector %s: broker %s refused the connection: %s", self.client_id, self.broker_url, reason)
            self._subscribed.set()
            return
        self._generation += 1
        self.metrics.connected = True
        if self._retiring:  # drain what the session holds, receive nothing new
            self._session_present = self._session_present or bool(flags.session_present)
            client.unsubscribe(list(self.subscriptions))
            return
        client.subscribe([(topic, 1) for topic in self.subscriptions])

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        self._unsubscribed.set()
        if self._retiring:
            self._subscribed.set()  # what start() waits for

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        refused = [f"{topic}: {code}" for topic, code in zip(self.subscriptions, reason_codes) if code.is_failure]
        if refused:
            self._connect_problem = "the broker refused " + "; ".join(refused)
            logger.error("collector %s: %s", self.client_id, self._connect_problem)
        self._subscribed.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.metrics.connected = False
        if not self._stopping.is_set():
            logger.warning("collector %s lost the broker %s (%s); reconnecting", self.client_id, self.broker_url, reason)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        received_at = dt.datetime.now(dt.timezone.utc)
        try:
            topic = message.topic
        except UnicodeDecodeError:
            topic = bytes(message._topic).decode("utf-8", "replace")
        kind = topic.rsplit("/", 1)[-1]
        self.metrics.count_received(kind if kind in READ_KINDS else "other")
        record = parse_message(topic, message.payload, max_payload_bytes=self.max_payload_bytes, received_at=received_at,
                               retained=bool(message.retain))  # fmt: skip
        if isinstance(record, Rejection):
            self._note_rejection(record)
        elif isinstance(record, DeviceStatus):
            self.metrics.observe_status(record)
        item = HandoffItem(record, message.mid, message.qos, self._generation)
        # A full queue holds the network thread: the broker then buffers (backpressure).
        while not self._queue.put(item, timeout=0.5):
            if not self._writer.is_alive():
                return
        self.metrics.queue_depth = self._queue.qsize()

    def _note_rejection(self, rejection: Rejection) -> None:
        self.metrics.count_rejected(rejection.reason)
        seen = self._rejections_logged.note(rejection)  # the first of each topic and reason, then now and then
        if seen is not None:
            logger.warning("rejected a message on %s (%d bytes): %s: %s%s", rejection.topic, rejection.size_bytes,
                           rejection.reason, rejection.detail,
                           f" [{seen} {rejection.reason} so far]" if seen > 1 else "")  # fmt: skip

    # -- the writer ---------------------------------------------------------------------------
    def _write_loop(self) -> None:
        # A batch is written when it holds batch_size records, flush_interval_s after its first record,
        # before a flush's event is set (and at stop), and with ack_after_store after a pause in arrivals.
        pending: list[HandoffItem] = []
        deadline: float | None = None
        while True:
            room = self.batch_size - len(pending)
            if deadline is None:
                items = self._queue.take(room, 1, self.retention_interval_s)
            elif self.ack_after_store:
                items = self._queue.take(room, room, min(deadline - time.monotonic(), ACK_IDLE_FLUSH_S))
                if not items:
                    deadline = 0.0  # idle: write (and acknowledge) now
            else:
                items = self._queue.take(room, room, deadline - time.monotonic())
            for item in items:
                if isinstance(item, HandoffItem):
                    pending.append(item)
                    continue
                if pending:
                    self._write_batch(pending)
                    pending, deadline = [], None
                if isinstance(item, threading.Event):
                    item.set()
                elif item is _STOP:
                    if summaries := self._rejected.flush():  # the summaries of the open window
                        self._write_step("rejected", summaries)
                    return
            if pending and deadline is None:
                deadline = time.monotonic() + self.flush_interval_s
            if pending and (len(pending) >= self.batch_size or time.monotonic() >= (deadline or 0.0)):
                self._write_batch(pending)
                pending, deadline = [], None
            self.metrics.queue_depth = self._queue.qsize()
            self._maybe_apply_retention()
            if summaries := self._rejected.due():  # the summaries of an ended window, even when idle
                self._write_step("rejected", summaries)

    def _write_batch(self, batch: list[HandoffItem]) -> None:
        steps: list[tuple[str, list[Any]]] = [  # status first: the fleet aggregates take a device's target from it
            ("status", [i.record for i in batch if isinstance(i.record, DeviceStatus)]),
            ("telemetry", [i.record for i in batch if isinstance(i.record, TelemetryWindow)]),
            ("events", [i.record for i in batch if isinstance(i.record, DeviceEvent)]),
            ("rejected", self._rejected.rows(i.record for i in batch if isinstance(i.record, Rejection))),
        ]
        unwritten: set[int] = set()  # ids of records neither stored nor refused for good (the store went away)
        for kind, records in steps:
            if not records:
                continue
            stored, left = self._write_step(kind, records)
            if stored and kind == "telemetry":
                self.acks.publish(self._client, records)  # the agents may now drop these windows
            unwritten.update(map(id, left))
        if not self.ack_after_store:
            return
        generation = self._generation
        if unwritten:  # not acknowledged: the broker sends them again (with a persistent session, after a reconnect)
            batch = [item for item in batch if id(item.record) not in unwritten]
        self._client.ack_many([item.mid for item in batch if item.qos == 1 and item.generation == generation])
        for item in batch:
            if item.qos > 1 and item.generation == generation:  # not subscribed for; acknowledged all the same
                self._client.ack(item.mid, item.qos)

    def _maybe_apply_retention(self) -> None:
        if self.retention is None or time.monotonic() - self._last_retention < self._retention_wait_s:
            return
        self._last_retention = time.monotonic()
        try:
            rolled = self.store.apply_retention(self.retention, self.rollup_minutes, rollups_for=self.rollup_retention)
        except Exception as exc:  # noqa: BLE001 - a StoreError, or a failure nothing foresaw: the writer goes on
            # a pass that keeps failing is tried less and less often: each holds the writer while it runs
            self._retention_wait_s = min(self._retention_wait_s * 2, max(self.retention_interval_s, RETENTION_BACKOFF_MAX_S))
            logger.error("collector %s: retention failed (next try in %.0f s): %s", self.client_id,
                         self._retention_wait_s, why(exc), exc_info=not isinstance(exc, StoreError))  # fmt: skip
            return
        self._retention_wait_s = self.retention_interval_s
        if rolled:
            logger.info("collector %s: rolled %d windows older than %s into %d-minute buckets", self.client_id, rolled,
                        self.retention, self.rollup_minutes)  # fmt: skip


__all__ = [
    "ACK_IDLE_FLUSH_S", "Collector", "DEFAULT_MQTT_VERSION", "DEFAULT_RETENTION", "DEFAULT_SESSION_EXPIRY_S",
    "MAX_SESSION_EXPIRY_S", "MQTT_VERSIONS", "default_client_id",
]  # fmt: skip
