"""The agent's MQTT 5 link to the fleet broker (paho-mqtt 2.x, ``CallbackAPIVersion.VERSION2``).

Delivery contract:

* :meth:`MqttLink.publish_telemetry` and :meth:`MqttLink.publish_event` validate the message, then
  commit it to the :class:`~edgekit_runtime.agent.spool.Spool`; nothing is sent that is not on disk.
* One network thread owns the paho client. While connected it sends the oldest spooled messages, at most
  ``max_inflight`` unacknowledged at a time. With ``delivery="broker_ack"`` each leaves the spool when its PUBACK
  arrives; with ``"collector_ack"`` (the agent's default) a telemetry window stays until the collector's ``ack.v1`` on
  ``.../ack`` says it is stored, and is published again until then (:mod:`~edgekit_runtime.agent.delivery`). The spool
  is the only outgoing queue: when a connection drops, what the broker had not acknowledged is sent again, in order,
  on the next one (delivery is at least once; ``seq`` and ``event_id`` let the collector drop duplicates). A message
  the broker refuses (a PUBACK reason code >= 0x80, e.g. "Not authorized") is removed and counted as ``rejected``.
* On connect the link subscribes to ``.../cmd`` and publishes ``{"state": "online"}`` retained on
  ``.../status``; the will publishes ``{"state": "offline"}`` retained when the connection is lost;
  :meth:`MqttLink.stop` publishes offline itself, then disconnects cleanly.
* Failed connects wait :class:`~edgekit_runtime.agent.backoff.Backoff` delays (exponential, with jitter), reset once
  a connection has lasted ``stable_after_s``; a message over the broker's packet limit is refused (:mod:`.mqtt_limits`).
* Commands on ``.../cmd`` are untrusted: each is checked (size, depth, schema, signature, replay)
  before anything acts on it (:mod:`~edgekit_runtime.agent.mqtt_commands`).
* No exception leaves a paho callback: an unexpected one is logged once per callback and type,
  counted in ``callback_errors`` and reported as an ``error`` event. (An exception out of
  ``on_message`` would make paho handle the same packet again on every loop, forever.)
* Every event is at most :data:`~edgekit_runtime.agent.bounded.MAX_EVENT_BYTES` of JSON.
* :attr:`MqttLink.link_state` is the link as it is: connected or not, since when, the last error;
  a network thread that died or stopped looping counts as not connected.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.bounded import bound_event
from edgekit_runtime.agent.broker import (
    BrokerConnectionError,
    describe_connect_failure,
    make_tls_context,
    parse_broker_url,
    read_password_file,
)
from edgekit_runtime.agent.delivery import DEFAULT_RESEND_AFTER_S, DeliveryMode, DeliveryTracker
from edgekit_runtime.agent.mqtt_commands import MAX_COMMAND_BYTES, MAX_COMMAND_DEPTH, CommandHandler, CommandIntake
from edgekit_runtime.agent.mqtt_limits import STABLE_CONNECTION_S, ConnectionWatch, report_oversize
from edgekit_runtime.agent.mqtt_state import LinkCounters, LinkState, ConnectionPhase
from edgekit_runtime.agent.replay import ReplayWindow
from edgekit_runtime.agent.spool import Spool, SpoolEntry
from edgekit_runtime.agent.telemetry import (
    EVENT_ERROR,
    BundleRef,
    EventLevel,
    build_event,
    build_status,
    encode_message,
    utc_timestamp,
)
from edgekit_runtime.agent.topics import DeviceTopics, TelemetryError, validate_id
from edgekit_runtime.schemas import validate_message

logger = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 16
_LOOP_TIMEOUT_S = 0.05
_STOP_FLUSH_S = 2.0
_UNSPECIFIED_ERROR = 0x80
#: Largest MQTT packet the agent accepts (announced in CONNECT): bigger commands never reach it at all;
#: those up to this size get a command_rejected event naming the size.
MAX_PACKET_BYTES = 1024 * 1024
_REPORTED_CALLBACK_FAILURES = 32

__all__ = ["DEFAULT_MAX_INFLIGHT", "MAX_COMMAND_BYTES", "MAX_COMMAND_DEPTH", "MAX_PACKET_BYTES", "CommandHandler",
           "LinkCounters", "LinkState", "MqttLink"]  # fmt: skip


class MqttLink(CommandIntake):
    """The device's connection to the broker. ``start()``, publish, ``stop()``; a context manager."""

    def __init__(
        self,
        broker_url: str,
        client_id: str,
        fleet: str,
        device: str,
        *,
        spool: Spool,
        on_command: CommandHandler | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        username: str | None = None,
        password_file: str | Path | None = None,
        keepalive_s: int = 30,
        backoff: Backoff | None = None,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        connect_timeout_s: float = 10.0,
        agent_version: str = AGENT_VERSION,
        bundle: BundleRef | None = None,
        replay: ReplayWindow | None = None,
        command_key: Any = None,
        require_signed_commands: bool = False,
        event_sink: Callable[[dict[str, Any]], None] | None = None,
        delivery: DeliveryMode = "broker_ack",
        resend_after_s: float = DEFAULT_RESEND_AFTER_S,
        stable_after_s: float = STABLE_CONNECTION_S,
    ) -> None:
        """``replay``: the persisted record of command ids (the link closes it on :meth:`stop`); without one the record
        lives in memory, so replays are refused only until the process ends. ``command_key``: the fleet's Ed25519
        public key; a command's ``signature`` is checked against it when present, and required with
        ``require_signed_commands``. ``event_sink``: where the events the link raises itself (pong, command_rejected,
        ...) go instead of :meth:`publish_event`; the agent passes its ordered outbox, which keeps them in memory while
        the spool cannot be written (a full disk). ``delivery``: ``"broker_ack"`` (a message leaves the spool on its
        PUBACK) or ``"collector_ack"`` (a telemetry window leaves when the collector's ack names it; ``resend_after_s``
        until it is published again). ``stable_after_s``: how long a connection must last to reset the backoff."""
        self.address = parse_broker_url(broker_url)
        self.topics = DeviceTopics(validate_id(fleet, "fleet id"), validate_id(device, "device id"))
        if not isinstance(client_id, str) or not client_id:
            raise TelemetryError(f"MQTT client_id must be a non-empty string, got {client_id!r}",
                                 hint="use the device id, e.g. client_id=device")  # fmt: skip
        for label, number, low in (("keepalive_s", keepalive_s, 1), ("max_inflight", max_inflight, 1)):
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                raise TelemetryError(f"MqttLink {label} must be an int >= {low}, got {number!r}")
        if not connect_timeout_s > 0:
            raise TelemetryError(f"MqttLink connect_timeout_s must be > 0, got {connect_timeout_s!r}")
        if not self.address.tls and any(v is not None for v in (tls_ca, tls_cert, tls_key)):
            raise TelemetryError(f"TLS files were given but the broker URL {broker_url!r} is plain mqtt://",
                                 hint=f"use mqtts://{self.address.host}:8883 (or drop tls_ca/tls_cert/tls_key)")  # fmt: skip
        if password_file is not None and username is None:
            raise TelemetryError("password_file was given without a username", hint="pass username=... as well")
        self.client_id = client_id
        self.spool = spool
        self.delivery = DeliveryTracker(self.topics, spool, delivery, resend_after_s=resend_after_s)
        self.backoff = backoff if backoff is not None else Backoff(initial_s=1.0, max_s=60.0)
        self._watch = ConnectionWatch(self.backoff, f"{self.address.url} as {client_id!r}", stable_after_s=stable_after_s)
        self.agent_version = agent_version
        self._on_command = on_command
        self._event_sink = event_sink
        self._max_inflight = max_inflight
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = float(connect_timeout_s)
        self._bundle = bundle
        self._status_fields: dict[str, Any] = {}  # identity, target, power_mode (set_status_fields)
        # Without a record on disk the window lives in memory: replays are refused until the process ends.
        self.replay = replay if replay is not None else ReplayWindow(":memory:")
        if require_signed_commands and command_key is None:
            raise TelemetryError("require_signed_commands needs the fleet's public key as command_key",
                                 hint="pass command_key=load_public_key('fleet.pub.pem')")  # fmt: skip
        self._command_key = command_key
        self._require_signed = require_signed_commands
        self._client = self._make_client(tls_ca, tls_cert, tls_key, username, password_file)
        self._json_properties = Properties(PacketTypes.PUBLISH)
        self._json_properties.PayloadFormatIndicator = 1
        self._json_properties.ContentType = "application/json"

        # Owned by the network thread.
        self._state = ConnectionPhase.DISCONNECTED
        self._connack_deadline = 0.0
        self._cmd_subscribe_mid: int | None = None
        self._ack_subscribe_mid: int | None = None
        self._inflight: dict[int, tuple[int, str]] = {}  # mid -> (spool id, topic)
        self._sent_upto_id = 0
        self._pubacks: list[tuple[int, ReasonCode]] = []
        self._drop_reason: tuple[str, str] | None = None
        self._status_dirty = False
        self._state_since: str | None = None
        self._last_loop_monotonic = time.monotonic()
        self._reported_failures: set[tuple[str, str]] = set()

        self._counts = dict.fromkeys(
            ("published", "acked", "rejected", "connects", "reconnects", "commands_received", "commands_rejected",
             "commands_duplicate", "callback_errors"), 0
        )  # fmt: skip
        self._counts_lock = threading.Lock()
        self._last_error: tuple[str, str] | None = None
        self._connected_event = threading.Event()
        self._stop_requested = threading.Event()
        self._commands: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._network_thread: threading.Thread | None = None
        self._command_thread: threading.Thread | None = None

    # -- public API -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the broker has accepted the current connection and the network thread is serving it."""
        if self._state is not ConnectionPhase.CONNECTED:
            return False
        thread = self._network_thread
        if thread is None or not thread.is_alive():
            return False
        # A loop step takes _LOOP_TIMEOUT_S; one that has not finished in a keepalive period is stuck.
        return time.monotonic() - self._last_loop_monotonic < self._keepalive_s

    @property
    def link_state(self) -> LinkState:
        """Connected or not, since when, and the last error (for the agent's health)."""
        connected = self.connected
        last_error = self.last_error
        if not connected and last_error is None and self._state is ConnectionPhase.CONNECTED:
            last_error = "the MQTT network thread stopped serving the connection; see the agent log"
        return LinkState(connected, self._state_since, None if connected else last_error,
                         self.delivery.counters().to_dict())  # fmt: skip

    @property
    def last_error(self) -> str | None:
        """Why the last connection attempt failed or the last connection dropped (None once connected)."""
        return self._last_error[0] if self._last_error else None

    @property
    def counters(self) -> LinkCounters:
        with self._counts_lock:
            counts = dict(self._counts)
        return LinkCounters(**counts, dropped=self.spool.dropped_total(), backlog=self.spool.backlog())

    def start(self) -> MqttLink:
        """Start the network and command threads; connecting happens in the background."""
        if self._network_thread is not None:
            raise TelemetryError(f"MqttLink for {self.topics.prefix} was already started",
                                 hint="create a new MqttLink to connect again after stop()")  # fmt: skip
        self._command_thread = threading.Thread(target=self._dispatch_commands, name="edgekit-mqtt-commands",
                                                daemon=True)  # fmt: skip
        self._network_thread = threading.Thread(target=self._run, name="edgekit-mqtt-network", daemon=True)
        self._command_thread.start()
        self._network_thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish offline status, disconnect cleanly and end the threads; safe to call twice."""
        self._stop_requested.set()
        if self._network_thread is not None:
            self._network_thread.join(timeout_s)
            if self._network_thread.is_alive():
                logger.warning("MQTT network thread did not end within %.1f s", timeout_s)
        if self._command_thread is not None and self._command_thread.is_alive():
            self._commands.put(None)
            self._command_thread.join(timeout_s)
        if self._network_thread is None or not self._network_thread.is_alive():
            self.replay.close()

    def __enter__(self) -> MqttLink:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wait_connected(self, timeout_s: float) -> None:
        """Block until connected and subscribed to commands; raise :class:`BrokerConnectionError` with the
        last failure on timeout."""
        if self._connected_event.wait(timeout_s):
            return
        message, hint = self._last_error or ("no answer from the broker yet", "check the broker URL and network")
        raise BrokerConnectionError(f"not connected to {self.address.url} after {timeout_s:g} s: {message}",
                                    hint=hint)  # fmt: skip

    def flush(self, timeout_s: float) -> bool:
        """Wait until the spool is empty (everything acknowledged: by the broker, or with ``collector_ack`` by the
        collector); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.spool.backlog() > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def publish_telemetry(self, message: Mapping[str, Any]) -> int:
        """Validate a ``telemetry.v1`` message, commit it to the spool (QoS 1); returns its spool id."""
        validate_message(message, "telemetry.v1", what=f"telemetry message seq {message.get('seq')!r}")
        return self._spool_message(message, self.topics.telemetry)

    def publish_event(self, message: Mapping[str, Any]) -> int:
        """Validate an ``event.v1`` message, bound it to ``MAX_EVENT_BYTES``, commit it to the spool (QoS 1);
        returns its spool id."""
        validate_message(message, "event.v1", what=f"event {message.get('kind')!r}")
        return self._spool_message(bound_event(message), self.topics.events)

    def emit_event(self, kind: str, message: str, *, level: EventLevel = "info", command_id: str | None = None,
                   details: Mapping[str, Any] | None = None) -> int:  # fmt: skip
        """Build an event for this device and :meth:`publish_event` it (or hand it to ``event_sink``; then 0)."""
        event = build_event(
            device=self.topics.device, fleet=self.topics.fleet, kind=kind, message=message, level=level,
            command_id=command_id, details=details, agent_version=self.agent_version,
        )  # fmt: skip
        if self._event_sink is not None:
            self._event_sink(event)
            return 0
        return self.publish_event(event)

    def set_bundle(self, bundle: BundleRef | None) -> None:
        """The bundle now running: republished in the retained status and used in the will."""
        self._bundle = bundle
        self._status_dirty = True

    # -- client setup ---------------------------------------------------------------------------

    def set_status_fields(self, **fields: Mapping[str, Any] | None) -> None:
        """Optional status.v1 fields (``identity``, ``target``, ``power_mode``): republished in the retained
        status and used in the will; a field set to ``None`` is left out."""
        self._status_fields = {**self._status_fields, **fields}
        self._status_dirty = True

    def _make_client(
        self,
        tls_ca: str | Path | None,
        tls_cert: str | Path | None,
        tls_key: str | Path | None,
        username: str | None,
        password_file: str | Path | None,
    ) -> paho.Client:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
        client.enable_logger(logging.getLogger(f"{__name__}.paho"))
        if self.address.tls:
            client.tls_set_context(make_tls_context(tls_ca, tls_cert, tls_key))
        if username is not None:
            password = read_password_file(password_file) if password_file is not None else None
            client.username_pw_set(username, password)
        client.max_inflight_messages_set(self._max_inflight + 4)  # room for status beside the spool window
        client.connect_timeout = self._connect_timeout_s
        client.on_connect = self._guarded("on_connect", self._on_connect)
        client.on_disconnect = self._guarded("on_disconnect", self._on_disconnect)
        client.on_publish = self._guarded("on_publish", self._on_publish)
        client.on_message = self._guarded("on_message", self._on_message)
        client.on_subscribe = self._guarded("on_subscribe", self._on_subscribe)
        connect_properties = Properties(PacketTypes.CONNECT)
        # The broker drops anything larger for us instead of making paho hold it in memory (MQTT 5).
        connect_properties.MaximumPacketSize = MAX_PACKET_BYTES
        client.connect_async(self.address.host, self.address.port, keepalive=self._keepalive_s, clean_start=True,
                             properties=connect_properties)  # fmt: skip
        return client

    def _guarded(self, name: str, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` such that no exception leaves it into paho (see the module docstring)."""

        def guarded(*args: Any) -> None:
            try:
                callback(*args)
            except Exception as exc:  # noqa: BLE001 - the boundary: log, count, report, carry on
                self._callback_failed(name, exc)

        return guarded

    def _callback_failed(self, name: str, exc: Exception) -> None:
        with self._counts_lock:
            self._counts["callback_errors"] += 1
        key = (name, type(exc).__name__)
        if key in self._reported_failures:
            logger.debug("MQTT %s failed again: %s: %s", name, type(exc).__name__, exc)
            return
        if len(self._reported_failures) < _REPORTED_CALLBACK_FAILURES:
            self._reported_failures.add(key)
        logger.error("MQTT %s failed; the message is dropped and the link carries on (reported once per error "
                     "type)", name, exc_info=exc)  # fmt: skip
        try:
            self.emit_event(EVENT_ERROR, f"MQTT {name} failed: {type(exc).__name__}: {exc}", level="error",
                            details={"code": "mqtt.callback_failed", "callback": name, "error": type(exc).__name__})  # fmt: skip
        except Exception:  # noqa: BLE001 - reporting must not fail the boundary either
            logger.exception("cannot report the failure of MQTT %s", name)

    def _set_state(self, state: ConnectionPhase) -> None:
        up = state is ConnectionPhase.CONNECTED
        if self._state_since is None or up != (self._state is ConnectionPhase.CONNECTED):
            self._state_since = utc_timestamp()  # connecting again after a failure is still "down"
        self._state = state

    def _status_payload(self, state: str, reason: str | None) -> bytes:
        status = build_status(device=self.topics.device, fleet=self.topics.fleet, state=state,  # type: ignore[arg-type]
                              bundle=self._bundle, reason=reason, agent_version=self.agent_version,
                              **self._status_fields)  # fmt: skip
        return encode_message(status)

    def _spool_message(self, message: Mapping[str, Any], topic: str) -> int:
        if message.get("device") != self.topics.device or message.get("fleet") != self.topics.fleet:
            raise TelemetryError(
                f"message for {message.get('fleet')!r}/{message.get('device')!r} given to the link of "
                f"{self.topics.fleet!r}/{self.topics.device!r}",
                hint="build messages with this link's fleet and device ids",
            )
        return self.spool.append(topic, encode_message(message), qos=1)

    # -- network thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                try:
                    self._step()
                except Exception:  # the network thread must outlive any single failure
                    logger.exception("MQTT link %s: unexpected error; continuing", self.address.url)
                    self._stop_requested.wait(0.5)
        finally:
            self._shutdown()

    def _step(self) -> None:
        self._last_loop_monotonic = time.monotonic()
        if self._state is ConnectionPhase.DISCONNECTED and not self._begin_connect():
            self._pause_before_retry()
            return
        rc = self._client.loop(timeout=_LOOP_TIMEOUT_S)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._link_down(f"connection to broker {self.address.url} lost ({paho.error_string(rc)})",
                            "check that the broker is up; the link reconnects by itself")  # fmt: skip
            self._pause_before_retry()
            return
        if self._state is ConnectionPhase.CONNECTING and time.monotonic() > self._connack_deadline:
            self._link_down(f"broker {self.address.url} sent no CONNACK within {self._connect_timeout_s:g} s",
                            "check that the port is an MQTT listener and the TLS settings match")  # fmt: skip
            self._pause_before_retry()
            return
        self._settle_acks()
        if self._state is ConnectionPhase.CONNECTED:
            self._watch.check()
            if self._status_dirty:
                self._status_dirty = False
                self._publish_status("online", None)
            self._drain()

    def _begin_connect(self) -> bool:
        self._drop_reason = None
        self._client.will_set(self.topics.status, self._status_payload("offline", "connection lost"),
                              qos=1, retain=True)  # fmt: skip
        try:
            rc = self._client.reconnect()
        except (OSError, ValueError) as exc:
            self._record_error(*describe_connect_failure(exc, self.address))
            return False
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._record_error(f"cannot send CONNECT to {self.address.url}: {paho.error_string(rc)}",
                               "check the broker URL and the network")  # fmt: skip
            return False
        self._set_state(ConnectionPhase.CONNECTING)
        self._connack_deadline = time.monotonic() + self._connect_timeout_s
        return True

    def _pause_before_retry(self) -> None:
        if self._state_since is None:  # the first attempt failed: down since now
            self._state_since = utc_timestamp()
        delay_s = self.backoff.next_delay_s()
        logger.warning("MQTT link %s: %s; retrying in %.1f s (failure %d in a row)",
                       self.address.url, self.last_error, delay_s, self.backoff.failures)  # fmt: skip
        self._stop_requested.wait(delay_s)

    def _record_error(self, message: str, hint: str) -> None:
        self._last_error = (message, hint)

    def _link_down(self, message: str, hint: str) -> None:
        was_connected = self._state is ConnectionPhase.CONNECTED
        self._set_state(ConnectionPhase.DISCONNECTED)
        self._connected_event.clear()
        self._record_error(*(self._drop_reason or (message, hint)))
        self._watch.dropped(self.last_error)
        # The spool is the only queue: forget paho's copies, resend from the oldest the broker has not
        # acknowledged (windows awaiting the collector are behind it: the delivery tracker resends those).
        self._client.drop_out_messages()
        self._sent_upto_id = min((spool_id for spool_id, _ in self._inflight.values()),
                                 default=self._sent_upto_id + 1) - 1  # fmt: skip
        self._inflight.clear()
        self._pubacks.clear()
        if was_connected:
            logger.warning("MQTT link %s down: %s", self.address.url, self.last_error)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode,
                    properties: Properties | None) -> None:  # fmt: skip
        if reason.is_failure:
            self._drop_reason = (
                f"broker {self.address.url} refused the connection: {reason}",
                "check username, password_file and the broker's ACL for this device",
            )
            return
        self._set_state(ConnectionPhase.CONNECTED)
        self._watch.accepted(properties)  # the backoff resets once the connection has lasted
        self._last_error = None
        with self._counts_lock:
            self._counts["connects"] += 1
            if self._counts["connects"] > 1:
                self._counts["reconnects"] += 1
        _, self._cmd_subscribe_mid = client.subscribe(self.topics.cmd, qos=1)
        if self.delivery.waits_for_collector:
            _, self._ack_subscribe_mid = client.subscribe(self.topics.ack, qos=1)
        self._status_dirty = False
        self._publish_status("online", None)
        logger.info("MQTT link connected to %s as %s (backlog %d)", self.address.url, self.client_id,
                    self.spool.backlog())  # fmt: skip

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: list[ReasonCode],
                      properties: Properties | None) -> None:  # fmt: skip
        if mid == self._ack_subscribe_mid and any(reason.is_failure for reason in reasons):
            logger.error("broker %s refused the subscription to %s: %s; windows stay in the spool until its bound "
                         "(allow the device to read it, see runtime/mosquitto/acl.template, or set telemetry.delivery: "
                         "broker_ack)", self.address.url, self.topics.ack, ", ".join(str(r) for r in reasons))  # fmt: skip
        if mid != self._cmd_subscribe_mid:
            return
        if any(reason.is_failure for reason in reasons):
            logger.error("broker %s refused the subscription to %s: %s; commands will not arrive",
                         self.address.url, self.topics.cmd, ", ".join(str(r) for r in reasons))  # fmt: skip
        self._connected_event.set()  # connected and listening for commands

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode,
                       properties: Properties | None) -> None:  # fmt: skip
        # paho reports a dropped socket as "Unspecified error"; anything else came from the broker.
        if self._drop_reason is None and reason.is_failure and reason.value != _UNSPECIFIED_ERROR:
            self._drop_reason = (
                f"broker {self.address.url} closed the connection: {reason}",
                "check the broker log; a second client with the same client_id takes the session over",
            )

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: ReasonCode,
                    properties: Properties | None) -> None:  # fmt: skip
        self._pubacks.append((mid, reason))

    def _publish_status(self, state: str, reason: str | None) -> paho.MQTTMessageInfo:
        return self._client.publish(self.topics.status, self._status_payload(state, reason), qos=1, retain=True,
                                    properties=self._json_properties)  # fmt: skip

    def _drain(self) -> None:
        room = self._max_inflight - len(self._inflight)
        if room <= 0:
            return
        again = self.delivery.take_due(room)  # windows the collector has not confirmed in time
        resending = {entry.id for entry in again}
        for entry in again + self.spool.peek(room - len(again), after_id=self._sent_upto_id):
            if self.delivery.already_confirmed(entry):
                self.spool.ack(entry.id)
                self._sent_upto_id = max(self._sent_upto_id, entry.id)
                continue
            if self._refused_for_size(entry):
                continue
            info = self._client.publish(entry.topic, entry.payload, qos=entry.qos, properties=self._json_properties)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                logger.debug("publish of spool entry %d deferred: %s", entry.id, paho.error_string(info.rc))
                break
            self._sent_upto_id = max(self._sent_upto_id, entry.id)
            self.delivery.sent(entry, resend=entry.id in resending)
            with self._counts_lock:
                self._counts["published"] += 1
            if entry.qos == 0:
                self.spool.ack(entry.id)
            else:
                self._inflight[info.mid] = (entry.id, entry.topic)

    def _refused_for_size(self, entry: SpoolEntry) -> bool:
        """Whether ``entry`` is over the broker's Maximum Packet Size: then it is settled as refused and reported."""
        size = self._watch.oversize_bytes(entry, self._json_properties)
        if size is not None:
            self._sent_upto_id = max(self._sent_upto_id, entry.id)
            self.delivery.settle([], [entry.id])
            with self._counts_lock:
                self._counts["rejected"] += 1
            report_oversize(entry, size, self._watch.max_packet_bytes or 0, self.address.url, self.emit_event)
        return size is not None

    def _settle_acks(self) -> None:
        if not self._pubacks:
            return
        pubacks, self._pubacks = self._pubacks, []
        delivered: list[tuple[int, str]] = []
        rejected: list[tuple[int, str, ReasonCode]] = []
        for mid, reason in pubacks:
            spooled = self._inflight.pop(mid, None)
            if spooled is None:
                if reason.is_failure:
                    logger.error("broker %s refused the status message: %s", self.address.url, reason)
                continue
            if reason.is_failure:
                rejected.append((spooled[0], spooled[1], reason))
            else:
                delivered.append(spooled)
        self.delivery.settle(delivered, [entry_id for entry_id, _, _ in rejected])
        for entry_id, topic, reason in rejected:
            logger.error("broker %s refused spooled message %d on %s: %s; dropped it",
                         self.address.url, entry_id, topic, reason)  # fmt: skip
        with self._counts_lock:
            self._counts["acked"] += len(delivered)
            self._counts["rejected"] += len(rejected)

    def _shutdown(self) -> None:
        if self._state is ConnectionPhase.CONNECTED:
            info = self._publish_status("offline", "agent stopped")
            deadline = time.monotonic() + _STOP_FLUSH_S
            while not info.is_published() and time.monotonic() < deadline:
                if self._client.loop(timeout=_LOOP_TIMEOUT_S) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    break
                self._settle_acks()
            self._settle_acks()
            self._client.disconnect()  # sent at once: no paho thread, so paho writes it right here
        self._set_state(ConnectionPhase.DISCONNECTED)
        self._record_error("the link was stopped", "start the agent again")
        self._connected_event.clear()
        logger.info("MQTT link to %s stopped (backlog %d)", self.address.url, self.spool.backlog())
