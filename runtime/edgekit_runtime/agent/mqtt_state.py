"""What :class:`~edgekit_runtime.agent.mqtt.MqttLink` reports about itself: its counters and its state."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class LinkCounters:
    """What the link has done since :meth:`MqttLink.start` (``dropped`` counts over the spool's life)."""

    published: int
    acked: int
    rejected: int
    connects: int
    reconnects: int
    dropped: int
    backlog: int
    commands_received: int
    commands_rejected: int
    commands_duplicate: int
    callback_errors: int


@dataclass(frozen=True)
class LinkState:
    """The link as it is now: ``since`` is when it last connected or went down (UTC, None before the
    first attempt), ``last_error`` why it went down or failed to connect (None while connected);
    ``delivery`` the :class:`~edgekit_runtime.agent.delivery.DeliveryCounters` as a dict."""

    connected: bool
    since: str | None
    last_error: str | None
    delivery: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"connected": self.connected, "since": self.since, "last_error": self.last_error,
                "delivery": self.delivery}  # fmt: skip


class ConnectionPhase(Enum):
    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    CONNECTED = "connected"
