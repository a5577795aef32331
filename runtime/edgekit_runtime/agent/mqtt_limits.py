"""What the MQTT link learns about the broker beyond its acknowledgements (a part of
:class:`~edgekit_runtime.agent.mqtt.MqttLink`):

* **The largest packet it takes.** An MQTT 5 broker may announce a Maximum Packet Size in its CONNACK
  (Mosquitto's ``max_packet_size``). paho-mqtt 2.2 does not enforce it, and a broker that receives a larger
  PUBLISH closes the connection: the link would send the same spooled message first on every reconnect, and
  nothing behind it would ever be delivered. The link therefore measures each spooled message as a PUBLISH
  packet (:func:`publish_size_bytes`) and refuses one over the announced limit as if the broker had refused
  its PUBACK: it leaves the spool, counts as ``rejected``, and is logged and reported as an ``error`` event
  with ``details.code`` ``mqtt.packet_too_large`` (:func:`report_oversize`). A broker that announces no
  limit and drops the connection anyway (or an MQTT 3.1.1 one) is met by the backoff below.
* **Whether a connection counted.** :class:`ConnectionWatch` resets the reconnect backoff only once a
  connection has stayed up :data:`STABLE_CONNECTION_S`, not when the broker accepts it. A broker that accepts
  and then drops connections at once (a second client with the same client id taking the session over, e.g.
  an agent started from a cloned image) meets growing delays, not a reconnect a second, and the link warns
  when that keeps happening.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from paho.mqtt.properties import Properties

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.spool import SpoolEntry
from edgekit_runtime.agent.telemetry import EVENT_ERROR
from edgekit_runtime.agent.topics import TelemetryError
from edgekit_runtime.errors import EdgekitError

logger = logging.getLogger("edgekit_runtime.agent.mqtt")

#: How long a connection must stay up before the reconnect backoff starts again from its first delay.
STABLE_CONNECTION_S = 30.0
#: Connections in a row that end sooner than that before the link warns of the likely causes.
SHORT_CONNECTIONS_WARNING = 3
#: ``details.code`` of the ``error`` event that reports a message too large for the broker.
PACKET_TOO_LARGE = "mqtt.packet_too_large"


def publish_size_bytes(topic: str, payload: bytes, qos: int, properties: Properties | None) -> int:
    """Bytes of the MQTT 5 PUBLISH packet that carries ``payload`` (fixed header included), as paho builds it."""
    remaining = 2 + len(topic.encode("utf-8")) + len(payload) + (2 if qos > 0 else 0)
    remaining += len(properties.pack()) if properties is not None else 1
    length_bytes = 1 if remaining < 128 else 2 if remaining < 16_384 else 3 if remaining < 2_097_152 else 4
    return 1 + length_bytes + remaining


def report_oversize(entry: SpoolEntry, size_bytes: int, limit_bytes: int, broker_url: str,
                    emit_event: Callable[..., object]) -> None:  # fmt: skip
    """Log that ``entry`` was dropped for being over the broker's limit, and report it as an ``error`` event through
    ``emit_event`` (:meth:`~edgekit_runtime.agent.mqtt.MqttLink.emit_event`) unless the entry was such a report
    itself (so a tiny limit cannot loop)."""
    try:
        message = json.loads(entry.payload)
    except ValueError:
        message = None
    message = message if isinstance(message, dict) else {}
    seq, kind = message.get("seq"), message.get("kind")
    what = (f"telemetry window seq {seq}" if isinstance(seq, int) else f"event {kind!r}" if isinstance(kind, str)
            else "message")  # fmt: skip
    text = (f"{what} (spool entry {entry.id} on {entry.topic}) is {size_bytes} bytes as an MQTT packet, over the "
            f"maximum packet size of {limit_bytes} bytes that broker {broker_url} announced; dropped it")  # fmt: skip
    logger.error("%s (raise the broker's max_packet_size, or send smaller messages)", text)
    details = message.get("details")
    if isinstance(details, dict) and details.get("code") == PACKET_TOO_LARGE:
        return
    try:
        emit_event(EVENT_ERROR, text, level="error", details={
            "code": PACKET_TOO_LARGE, "topic": entry.topic, "seq": seq if isinstance(seq, int) else None,
            "size_bytes": size_bytes, "max_packet_bytes": limit_bytes})  # fmt: skip
    except EdgekitError as err:
        logger.error("cannot report the dropped message: %s", err)


class ConnectionWatch:
    """The link's connections as they come and go: resets ``backoff`` once one has lasted ``stable_after_s``, warns
    when they keep ending sooner, and keeps the Maximum Packet Size the broker announced for the current one.
    ``where`` names the link in the warning (broker URL and client id). Used from the network thread."""

    def __init__(self, backoff: Backoff, where: str, *, stable_after_s: float = STABLE_CONNECTION_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if isinstance(stable_after_s, bool) or not isinstance(stable_after_s, (int, float)) or not stable_after_s > 0:
            raise TelemetryError(f"MqttLink stable_after_s must be a number > 0, got {stable_after_s!r}",
                                 hint=f"e.g. stable_after_s={STABLE_CONNECTION_S:g}")  # fmt: skip
        self.backoff, self.where, self.stable_after_s = backoff, where, float(stable_after_s)
        self._clock = clock
        self._accepted_at: float | None = None  # while connected and not yet stable
        self.short_in_row = 0
        self.max_packet_bytes: int | None = None

    def accepted(self, connack_properties: Properties | None) -> None:
        """The broker accepted a connection (its CONNACK's properties)."""
        self._accepted_at = self._clock()
        limit = getattr(connack_properties, "MaximumPacketSize", None)  # MQTT 5, when the broker has a limit
        self.max_packet_bytes = limit if isinstance(limit, int) and limit > 0 else None

    def oversize_bytes(self, entry: SpoolEntry, properties: Properties | None) -> int | None:
        """The size of ``entry`` as a PUBLISH packet when it is over the broker's limit, else None."""
        if self.max_packet_bytes is None:
            return None
        size = publish_size_bytes(entry.topic, entry.payload, entry.qos, properties)
        return size if size > self.max_packet_bytes else None

    def check(self) -> None:
        """While connected: reset the backoff once the connection has lasted ``stable_after_s``."""
        if self._accepted_at is not None and self._clock() - self._accepted_at >= self.stable_after_s:
            self._accepted_at, self.short_in_row = None, 0
            self.backoff.reset()

    def dropped(self, reason: str | None) -> None:
        """The link is down (``reason``): a connection that ended too soon counts, and warns when it repeats."""
        self.check()
        if self._accepted_at is None:  # it was stable, or there was no connection
            return
        lasted_s, self._accepted_at = self._clock() - self._accepted_at, None
        self.short_in_row += 1
        if self.short_in_row == SHORT_CONNECTIONS_WARNING or self.short_in_row % 20 == 0:
            logger.warning(
                "MQTT link %s: %d connections in a row ended within %g s of the broker accepting them (the last after "
                "%.1f s: %s); reconnects back off up to %g s meanwhile. Likely cause: another client connects with the "
                "same client id (a second agent with this device_id, e.g. started from a cloned image), and the broker "
                "takes the session over; look for 'already connected' in the broker log. A message over a packet size "
                "limit the broker does not announce does the same", self.where, self.short_in_row,
                self.stable_after_s, lasted_s, reason, self.backoff.max_s,
            )  # fmt: skip


__all__ = ["PACKET_TOO_LARGE", "SHORT_CONNECTIONS_WARNING", "STABLE_CONNECTION_S", "ConnectionWatch", "publish_size_bytes",
           "report_oversize"]  # fmt: skip
