"""Telling the world an alert fired or cleared: the alert message (schema ``edgekit.alert/1``, published on
``edgekit/v1/<fleet>/alerts``), the webhook that receives the same JSON, and the device event the store keeps.

The message schema is ``alert.v1.json`` next to this module. The webhook is POSTed from its own thread with
a timeout; a failure is logged and counted, and a full queue drops the notice (counted too): nothing here ever
waits on the network while the collector ingests.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edgekit.fleet.errors import CollectorError
from edgekit.fleet.store.base import DeviceEvent

logger = logging.getLogger(__name__)

ALERT_SCHEMA = "edgekit.alert/1"
#: The JSON Schema of an alert message (and of the webhook's body, and of the stored event's payload).
ALERT_SCHEMA_PATH = Path(__file__).resolve().parent / "alert.v1.json"
#: Event kinds stored for alerts.
EVENT_KINDS = {"firing": "alert_firing", "resolved": "alert_resolved"}
#: The event level of each severity (events know info, warning, error).
EVENT_LEVELS = {"critical": "error", "warning": "warning", "info": "info"}
WEBHOOK_TIMEOUT_S = 5.0
WEBHOOK_QUEUE_SIZE = 1000


def alerts_topic(fleet: str) -> str:
    """Where a fleet's alert messages are published (not a device topic: one level shorter)."""
    return f"edgekit/v1/{fleet}/alerts"


def _time(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def alert_message(*, event_id: str, status: str, rule: str, kind: str, severity: str, fleet: str, subject: str,
                  device: str | None, value: Any, threshold: Any, summary: str, labels: dict[str, str],
                  description: str | None, details: dict[str, Any], pending_since: dt.datetime,
                  fired_at: dt.datetime, resolved_at: dt.datetime | None) -> dict[str, Any]:  # fmt: skip
    """One alert message (``status`` ``firing`` or ``resolved``), as published, POSTed and stored."""
    return {
        "schema": ALERT_SCHEMA, "event_id": event_id, "status": status, "rule": rule, "kind": kind,
        "severity": severity, "fleet": fleet, "device": device, "subject": subject,
        "value": value, "threshold": threshold, "summary": summary[:1024], "labels": dict(labels),
        "description": description, "details": details, "pending_since": _time(pending_since),
        "fired_at": _time(fired_at), "resolved_at": _time(resolved_at),
    }  # fmt: skip


def alert_event(message: dict[str, Any], at: dt.datetime) -> DeviceEvent | None:
    """The device event the store keeps for ``message`` (None when the alert names no device)."""
    if not message.get("device"):
        return None
    verb = "firing" if message["status"] == "firing" else "resolved"
    return DeviceEvent(fleet=message["fleet"], device=message["device"], event_id=message["event_id"],
                       kind=EVENT_KINDS[message["status"]], level=EVENT_LEVELS[message["severity"]] if verb == "firing" else "info",
                       message=f"alert {message['rule']} {verb}: {message['summary']}"[:2048], at=at, payload=message)  # fmt: skip


def check_webhook_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; else a :class:`CollectorError` naming the fix."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CollectorError(f"alert webhook {url!r} is not an http:// or https:// URL with a host",
                             hint="e.g. --alert-webhook https://hooks.example.com/edgekit")  # fmt: skip
    return url


class WebhookSender:
    """POSTs alert messages as JSON to one URL from a daemon thread, ``timeout_s`` each; never blocks the caller."""

    def __init__(self, url: str, timeout_s: float = WEBHOOK_TIMEOUT_S, queue_size: int = WEBHOOK_QUEUE_SIZE) -> None:
        self.url, self.timeout_s = check_webhook_url(url), timeout_s
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="edgekit-alert-webhook", daemon=True)
        self._thread.start()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.dropped += 1
            logger.error("alert webhook %s: %d notices wait already; dropped the %s notice of %s", self.url,
                         self._queue.qsize(), message["status"], message["rule"])  # fmt: skip

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (for up to ``timeout_s``), then stop."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            message = self._queue.get()
            if message is None:
                return
            body = json.dumps(message).encode("utf-8")
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json", "User-Agent": "edgekit-alerts"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (http(s) checked)
                    response.read(1024)
                self.sent += 1
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.failed += 1
                logger.warning("alert webhook %s failed for %s %s (%s; %d failures so far)", self.url, message["rule"],
                               message["status"], getattr(exc, "reason", exc), self.failed)  # fmt: skip


__all__ = ["ALERT_SCHEMA", "ALERT_SCHEMA_PATH", "EVENT_KINDS", "WebhookSender", "alert_event", "alert_message",
           "alerts_topic", "check_webhook_url"]  # fmt: skip
