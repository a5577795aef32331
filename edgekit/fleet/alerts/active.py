"""The alerts firing now, read from the store's ``alert_firing`` / ``alert_resolved`` events, worst first.

:func:`active_alerts` is what the dashboard and ``fleet status`` show ("devices breaching"); the alert engine
also reads it at start to take back the alerts it had fired. Only events the engine wrote count: the store is asked
for the two alert kinds alone (so no number of deploy or command events pushes a firing alert out of the read), and
an event whose payload is not an alert message (``schema`` ``edgekit.alert/1``) is ignored, whatever its kind.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from edgekit.fleet.alerts.notify import ALERT_SCHEMA, EVENT_KINDS
from edgekit.fleet.alerts.rules import SEVERITIES
from edgekit.fleet.store.base import FleetStore

#: How far back active_alerts looks for the events of alerts still firing (an alert firing longer is not shown).
DEFAULT_LOOKBACK = dt.timedelta(days=30)
#: The most alert events (firing and resolved) active_alerts reads.
MAX_EVENTS_READ = 100_000


@dataclass(frozen=True)
class ActiveAlert:
    """One alert firing now, as its ``alert_firing`` event recorded it."""

    rule: str
    kind: str
    severity: str  # critical | warning | info
    fleet: str
    device: str | None
    subject: str  # the device id, or rollout/<rollout id>
    value: float | str | None
    threshold: float | str | None
    summary: str
    labels: dict[str, str]
    pending_since: dt.datetime
    fired_at: dt.datetime
    event_id: str
    message: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def excess(self) -> float:
        """How far past its threshold the value is (value / threshold; 1.0 when not numeric)."""
        if isinstance(self.value, (int, float)) and isinstance(self.threshold, (int, float)) and self.threshold > 0:
            return float(self.value) / float(self.threshold)
        return 1.0

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "kind": self.kind, "severity": self.severity, "fleet": self.fleet,
                "device": self.device, "subject": self.subject, "value": self.value, "threshold": self.threshold,
                "summary": self.summary, "labels": self.labels, "pending_since": self.pending_since.isoformat(),
                "fired_at": self.fired_at.isoformat(), "event_id": self.event_id}  # fmt: skip


def _parse_time(text: Any, default: dt.datetime) -> dt.datetime:
    if isinstance(text, str):
        try:
            return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            pass
    return default


def active_alerts(store: FleetStore, fleet: str | None = None, *, lookback: dt.timedelta = DEFAULT_LOOKBACK) -> list[ActiveAlert]:
    """The alerts firing now (their newest alert event is ``alert_firing``), in ``fleet`` or every fleet,
    worst first: by severity (critical, warning, info), then how far past its threshold, then longest firing."""
    since = dt.datetime.now(dt.timezone.utc) - lookback
    newest: dict[tuple[str, str, str], tuple[str, Any]] = {}
    kinds = (EVENT_KINDS["firing"], EVENT_KINDS["resolved"])
    for event in store.events(fleet, since=since, limit=MAX_EVENTS_READ, kinds=kinds):  # newest first
        payload = event.payload or {}
        if event.kind not in kinds or payload.get("schema") != ALERT_SCHEMA:  # not written by the alert engine
            continue
        key = (str(payload.get("rule")), event.fleet, str(payload.get("subject") or event.device))
        if key not in newest:
            newest[key] = (event.kind, event)
    found = []
    for (rule, fleet_id, subject), (kind, event) in newest.items():
        if kind != EVENT_KINDS["firing"]:
            continue
        payload = event.payload or {}
        fired_at = _parse_time(payload.get("fired_at"), event.at)
        found.append(ActiveAlert(
            rule=rule, kind=str(payload.get("kind", "")), severity=str(payload.get("severity", "warning")), fleet=fleet_id,
            device=payload.get("device"), subject=subject, value=payload.get("value"), threshold=payload.get("threshold"),
            summary=str(payload.get("summary", event.message)), labels=dict(payload.get("labels") or {}),
            pending_since=_parse_time(payload.get("pending_since"), fired_at), fired_at=fired_at,
            event_id=event.event_id, message=dict(payload),
        ))  # fmt: skip
    rank = {severity: index for index, severity in enumerate(SEVERITIES)}
    found.sort(key=lambda a: (rank.get(a.severity, len(SEVERITIES)), -a.excess, a.fired_at, a.fleet, a.subject, a.rule))
    return found


__all__ = ["ActiveAlert", "DEFAULT_LOOKBACK", "active_alerts"]
