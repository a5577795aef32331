"""MQTT topic names of the edgekit fleet protocol, version 1, and the ids that go into them.

Every device owns five topics under ``edgekit/v1/<fleet>/<device>/``:

=============  =========  =======  ===========================================================
topic          direction  QoS      content
=============  =========  =======  ===========================================================
``telemetry``  device ->  1        one :mod:`telemetry.v1 <edgekit_runtime.schemas>` window
``status``     device ->  1 (ret)  ``online`` on connect; ``offline`` on stop or as the will
``events``     device ->  1        deploy results, rejected commands, errors, pongs
``cmd``        -> device  1        deploy, rollback, set_interval, ping
``ack``        -> device  1        :mod:`ack.v1 <edgekit_runtime.schemas>`: the telemetry seqs the
                                   collector has stored (the agent then drops them from its spool)
=============  =========  =======  ===========================================================

Fleet and device ids are single topic levels: 1-64 characters, without ``+``, ``#``, ``/`` or
control characters. This module also defines :class:`TelemetryError`, the base of the errors the
telemetry path raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from edgekit_runtime.errors import EdgekitError

TOPIC_ROOT = "edgekit/v1"
MAX_ID_LENGTH = 64
TopicKind = Literal["telemetry", "status", "events", "cmd", "ack"]
TOPIC_KINDS: tuple[TopicKind, ...] = ("telemetry", "status", "events", "cmd", "ack")
QOS_BY_KIND: dict[TopicKind, int] = {"telemetry": 1, "status": 1, "events": 1, "cmd": 1, "ack": 1}

_FORBIDDEN = {"+": "'+' (MQTT's single-level wildcard)", "#": "'#' (MQTT's multi-level wildcard)",
              "/": "'/' (MQTT's level separator)"}  # fmt: skip
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_ID_HINT = "use letters, digits, '-', '_' or '.', at most 64 characters (for example 'orin-nano-07')"


class TelemetryError(EdgekitError):
    """The telemetry path failed: a bad id or topic, a broken spool, an unusable broker address."""


def validate_id(value: object, what: str = "device id") -> str:
    """Return ``value`` when it can be one topic level; raise :class:`TelemetryError` otherwise."""
    if not isinstance(value, str):
        raise TelemetryError(f"{what} must be a string, got {type(value).__name__} {value!r}", hint=_ID_HINT)
    if not value:
        raise TelemetryError(f"{what} is empty", hint=_ID_HINT)
    if len(value) > MAX_ID_LENGTH:
        raise TelemetryError(
            f"{what} {value[:20]!r}... is {len(value)} characters, more than {MAX_ID_LENGTH}", hint=_ID_HINT
        )
    for char, name in _FORBIDDEN.items():
        if char in value:
            raise TelemetryError(f"{what} {value!r} contains {name}", hint=_ID_HINT)
    if _CONTROL_RE.search(value):
        raise TelemetryError(f"{what} {value!r} contains a control character", hint=_ID_HINT)
    return value


@dataclass(frozen=True)
class DeviceTopics:
    """The topics of one device. ``DeviceTopics("lab", "orin-01").telemetry`` ->
    ``"edgekit/v1/lab/orin-01/telemetry"``."""

    fleet: str
    device: str

    def __post_init__(self) -> None:
        validate_id(self.fleet, "fleet id")
        validate_id(self.device, "device id")

    @property
    def prefix(self) -> str:
        return f"{TOPIC_ROOT}/{self.fleet}/{self.device}"

    def topic(self, kind: TopicKind) -> str:
        if kind not in TOPIC_KINDS:
            raise TelemetryError(f"unknown topic kind {kind!r}", hint=f"use one of {', '.join(TOPIC_KINDS)}")
        return f"{self.prefix}/{kind}"

    @property
    def telemetry(self) -> str:
        return self.topic("telemetry")

    @property
    def status(self) -> str:
        return self.topic("status")

    @property
    def events(self) -> str:
        return self.topic("events")

    @property
    def cmd(self) -> str:
        return self.topic("cmd")

    @property
    def ack(self) -> str:
        return self.topic("ack")


def subscription(kind: TopicKind, fleet: str | None = None) -> str:
    """A collector's subscription filter for ``kind`` on every device of ``fleet`` (all fleets when None)."""
    if kind not in TOPIC_KINDS:
        raise TelemetryError(f"unknown topic kind {kind!r}", hint=f"use one of {', '.join(TOPIC_KINDS)}")
    fleet_level = "+" if fleet is None else validate_id(fleet, "fleet id")
    return f"{TOPIC_ROOT}/{fleet_level}/+/{kind}"


@dataclass(frozen=True)
class ParsedTopic:
    fleet: str
    device: str
    kind: TopicKind


def parse_topic(topic: str) -> ParsedTopic:
    """Split ``edgekit/v1/<fleet>/<device>/<kind>``; raise :class:`TelemetryError` for anything else."""
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_ROOT or parts[4] not in TOPIC_KINDS:
        raise TelemetryError(
            f"topic {topic!r} is not an edgekit v1 device topic",
            hint=f"expected {TOPIC_ROOT}/<fleet>/<device>/<{'|'.join(TOPIC_KINDS)}>",
        )
    fleet = validate_id(parts[2], f"fleet id in topic {topic!r}")
    device = validate_id(parts[3], f"device id in topic {topic!r}")
    return ParsedTopic(fleet=fleet, device=device, kind=parts[4])  # type: ignore[arg-type]
