"""The alert engine: evaluates the rules every ``evaluate_every`` in its own thread and fires and clears alerts.

State is kept per (rule, fleet, subject), the subject being a device (or ``rollout/<id>``):

* a breach seen for the first time is **pending** since then;
* a pending breach still seen after the rule's ``for`` **fires**: the alert message is published on
  ``edgekit/v1/<fleet>/alerts``, POSTed to the webhook (if any) and stored as an ``alert_firing`` device event;
* a firing alert no longer breaching **resolves** the same three ways (``alert_resolved``); a pending one
  that stops breaching is forgotten, so one bad window pages no one.

The engine reads the store (``device_summaries``: liveness, p99, temperature; ``rollouts``) with a store of
its own (``edgekit fleet collect`` opens a second connection) so that a slow read never holds the collector's
writer, and takes each device's newest window from the collector (:meth:`AlertEngine.observe_windows`, a dict
update per stored window) for error rates and spool problems. At start it takes back the alerts the store
says are firing (:func:`~edgekit.fleet.alerts.active.active_alerts`), so a restart neither repeats nor loses them;
one judged on windows (:data:`WINDOW_RULE_KINDS`) is kept firing until the device's first window since the restart
is judged (or the device falls silent), since until then the engine has nothing to judge it on.
Run it in one collector of a shared group: each engine alerts on its own.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from edgekit.fleet.alerts.conditions import CONDITIONS, SILENT_STATES, Breach, FleetSnapshot, WindowFigures
from edgekit.fleet.alerts.notify import WebhookSender, alert_event, alert_message, alerts_topic
from edgekit.fleet.alerts.rules import AlertRules
from edgekit.fleet.errors import StoreError
from edgekit.fleet.store.base import FleetStore, TelemetryWindow

logger = logging.getLogger(__name__)

#: How many recent rollout records an evaluation reads (only rollout_failed rules need them).
ROLLOUTS_READ = 50
#: Rule kinds judged on a device's newest window, which the engine holds only once the collector stored one.
WINDOW_RULE_KINDS = ("error_rate_above", "spool_disk_full")

Publish = Callable[[str, bytes], Any]


@dataclass
class _Tracked:
    state: str  # "pending" | "firing"
    pending_since: dt.datetime
    breach: Breach | None
    fired_at: dt.datetime | None = None
    restored: dict[str, Any] = field(default_factory=dict)  # the firing message taken back from the store


@dataclass
class AlertCounters:
    """What the engine did since it started (logs, tests, and a future /metrics family)."""

    evaluations: int = 0
    evaluation_errors: int = 0
    fired: int = 0
    resolved: int = 0
    publish_failures: int = 0
    store_failures: int = 0
    last_evaluation_s: float = 0.0


class AlertEngine:
    """Evaluate ``rules`` against ``store`` (one fleet, or all with ``fleet=None``) and notify.

    ``publish(topic, payload)`` sends an MQTT message (the collector passes its own client's; None: no MQTT).
    ``webhook_url``: POST each notice there as JSON (``webhook_timeout_s`` each, from its own thread).
    ``evaluate_every_s`` overrides the rules file's ``evaluate_every``.
    """

    def __init__(self, rules: AlertRules, store: FleetStore, *, fleet: str | None = None, publish: Publish | None = None,
                 webhook_url: str | None = None, webhook_timeout_s: float = 5.0,
                 evaluate_every_s: float | None = None, close_store: bool = False) -> None:  # fmt: skip
        self.rules, self.store, self.fleet, self.publish = rules, store, fleet, publish
        self._close_store = close_store
        self.evaluate_every_s = evaluate_every_s if evaluate_every_s is not None else rules.evaluate_every_s
        self.webhook = WebhookSender(webhook_url, webhook_timeout_s) if webhook_url else None
        self.counters = AlertCounters()
        self._tracked: dict[tuple[str, str, str], _Tracked] = {}
        self._windows: dict[tuple[str, str], WindowFigures] = {}
        self._windows_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._needs_rollouts = any(rule.kind == "rollout_failed" for rule in rules.rules.values())

    # -- feeding and lifecycle ----------------------------------------------------------------------
    def observe_windows(self, windows: Iterable[TelemetryWindow]) -> None:
        """Keep each device's newest window's figures (the collector calls this after storing a batch)."""
        figures = [(w.fleet, w.device, WindowFigures.of(w)) for w in windows if self.fleet is None or w.fleet == self.fleet]
        with self._windows_lock:
            for fleet, device, figure in figures:
                current = self._windows.get((fleet, device))
                if current is None or figure.replaces(current):
                    self._windows[(fleet, device)] = figure

    def start(self, publish: Publish | None = None) -> AlertEngine:
        """Take back the firing alerts from the store, then evaluate every ``evaluate_every_s`` in a thread."""
        if publish is not None:
            self.publish = publish
        self._restore()
        self._thread = threading.Thread(target=self._run, name="edgekit-alerts", daemon=True)
        self._thread.start()
        logger.info("alerts: %d rules, evaluated every %g s%s", len(self.rules.rules), self.evaluate_every_s,
                    f", webhook {self.webhook.url}" if self.webhook else "")  # fmt: skip
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.webhook is not None:
            self.webhook.close(min(timeout_s, 5.0))
        if self._close_store:
            self.store.close()

    def __enter__(self) -> AlertEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def firing(self) -> list[tuple[str, str, str]]:
        """(rule, fleet, subject) of every alert firing now, in this engine."""
        return sorted(key for key, tracked in self._tracked.items() if tracked.state == "firing")

    def _run(self) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            try:
                self.evaluate()
            except StoreError as exc:
                self.counters.evaluation_errors += 1
                logger.warning("alerts: cannot read the store (%s); trying again in %g s", exc.message, self.evaluate_every_s)
            except Exception:  # noqa: BLE001 (a bug in one evaluation must not end alerting)
                self.counters.evaluation_errors += 1
                logger.exception("alerts: an evaluation failed")
            self._stopping.wait(max(self.evaluate_every_s - (time.monotonic() - began), 0.05))

    # -- evaluation ---------------------------------------------------------------------------------
    def snapshot(self, now: dt.datetime | None = None) -> FleetSnapshot:
        """The fleet as the next evaluation sees it."""
        now = now or dt.datetime.now(dt.timezone.utc)
        devices = self.store.device_summaries(self.fleet)
        rollouts = self.store.rollouts(self.fleet, limit=ROLLOUTS_READ) if self._needs_rollouts else []
        with self._windows_lock:
            windows = dict(self._windows)
        return FleetSnapshot(now=now, devices=devices, windows=windows, rollouts=rollouts)

    def evaluate(self, now: dt.datetime | None = None) -> list[dict[str, Any]]:
        """Evaluate every rule once; returns the notices (firing and resolved messages) it sent."""
        began = time.monotonic()
        snapshot = self.snapshot(now)
        now = snapshot.now
        notices: list[dict[str, Any]] = []
        seen: set[tuple[str, str, str]] = set()
        for name, rule in self.rules.rules.items():
            for_s = rule.for_s
            for breach in CONDITIONS[rule.kind](rule, snapshot):
                key = (name, breach.fleet, breach.subject)
                seen.add(key)
                tracked = self._tracked.get(key)
                if tracked is None:
                    tracked = self._tracked[key] = _Tracked("pending", now, breach)
                tracked.breach = breach
                if tracked.state == "pending" and (now - tracked.pending_since).total_seconds() >= for_s:
                    tracked.state, tracked.fired_at = "firing", now
                    notices.append(self._notice("firing", key, tracked, None))
        gone = [k for k in self._tracked if k not in seen]
        unjudged = self._awaiting_a_window(gone, snapshot)
        for key in [k for k in gone if k not in unjudged]:
            tracked = self._tracked.pop(key)
            if tracked.state == "firing":
                notices.append(self._notice("resolved", key, tracked, now))
        self._send(notices, now)
        self.counters.evaluations += 1
        self.counters.last_evaluation_s = time.monotonic() - began
        return notices

    def _awaiting_a_window(self, keys: list[tuple[str, str, str]], snapshot: FleetSnapshot) -> set[tuple[str, str, str]]:
        """Of ``keys``, the alerts taken back from the store, of rules judged on windows, whose device is heard from
        but sent no window since the restart: they have not been judged yet, so they are still firing."""
        restored = [(name, fleet, subject) for name, fleet, subject in keys
                    if self._tracked[(name, fleet, subject)].breach is None and name in self.rules.rules
                    and self.rules.rules[name].kind in WINDOW_RULE_KINDS and (fleet, subject) not in snapshot.windows]  # fmt: skip
        if not restored:
            return set()
        heard = {(d.fleet, d.device) for d in snapshot.devices if d.state not in SILENT_STATES}
        return {key for key in restored if (key[1], key[2]) in heard}

    def _notice(self, status: str, key: tuple[str, str, str], tracked: _Tracked, resolved_at: dt.datetime | None) -> dict[str, Any]:
        name, fleet, subject = key
        rule = self.rules.rules.get(name)
        breach, old = tracked.breach, tracked.restored
        return alert_message(
            event_id=uuid.uuid4().hex, status=status, rule=name, kind=rule.kind if rule else old.get("kind", "device_state"),
            severity=rule.severity if rule else old.get("severity", "warning"), fleet=fleet, subject=subject,
            device=breach.device if breach else old.get("device"), value=breach.value if breach else old.get("value"),
            threshold=breach.threshold if breach else old.get("threshold"),
            summary=breach.summary if breach else old.get("summary", ""),
            labels=dict(rule.labels) if rule else old.get("labels", {}),
            description=rule.description if rule else old.get("description"),
            details=breach.details if breach else old.get("details", {}), pending_since=tracked.pending_since,
            fired_at=tracked.fired_at or tracked.pending_since, resolved_at=resolved_at,
        )  # fmt: skip

    def _send(self, notices: list[dict[str, Any]], now: dt.datetime) -> None:
        for notice in notices:
            if notice["status"] == "firing":
                self.counters.fired += 1
                logger.warning("alert %s firing: %s", notice["rule"], notice["summary"])
            else:
                self.counters.resolved += 1
                logger.info("alert %s resolved: %s", notice["rule"], notice["subject"])
            if self.publish is not None:
                try:
                    self.publish(alerts_topic(notice["fleet"]), json.dumps(notice).encode("utf-8"))
                except Exception as exc:  # noqa: BLE001 (paho raises several kinds; a lost notice is counted)
                    self.counters.publish_failures += 1
                    logger.error("alerts: cannot publish the %s notice of %s: %s", notice["status"], notice["rule"], exc)
            if self.webhook is not None:
                self.webhook.send(notice)
        events = [event for event in (alert_event(n, now) for n in notices) if event is not None]
        if events:
            try:
                self.store.add_events(events)
            except StoreError as exc:
                self.counters.store_failures += 1
                logger.error("alerts: cannot store %d alert events: %s", len(events), exc.message)

    def _restore(self) -> None:
        from edgekit.fleet.alerts.active import active_alerts

        try:
            restored = active_alerts(self.store, self.fleet)
        except StoreError as exc:
            logger.warning("alerts: cannot read the firing alerts back from the store (%s); starting afresh", exc.message)
            return
        for alert in restored:
            self._tracked[(alert.rule, alert.fleet, alert.subject)] = _Tracked(
                "firing", alert.pending_since, None, alert.fired_at, restored=alert.message)  # fmt: skip
        if restored:
            logger.info("alerts: %d alerts were firing when the collector last stopped", len(restored))


def alert_engine_for(store: FleetStore, rules_path: str | Path | None, *, use_default_rules: bool = False,
                     webhook_url: str | None = None, fleet: str | None = None) -> AlertEngine | None:
    """The engine ``edgekit fleet collect --alerts / --alert-rules FILE [--alert-webhook URL]`` runs (None without
    rules), reading a store connection of its own (the same store for an in-memory SQLite)."""
    from edgekit.fleet.alerts.rules import DEFAULT_RULES_PATH, load_alert_rules
    from edgekit.fleet.errors import CollectorError
    from edgekit.fleet.store import open_store

    if rules_path is None and use_default_rules:
        rules_path = DEFAULT_RULES_PATH

    if rules_path is None:
        if webhook_url:
            raise CollectorError("--alert-webhook is given but no alert rules are evaluated",
                                 hint="add --alerts (the shipped rules) or --alert-rules FILE")  # fmt: skip
        return None
    rules = load_alert_rules(rules_path)
    own = not store.url.endswith(":memory:")
    return AlertEngine(rules, open_store(store.url) if own else store, fleet=fleet, webhook_url=webhook_url,
                       close_store=own)  # fmt: skip


__all__ = ["WINDOW_RULE_KINDS", "AlertCounters", "AlertEngine", "alert_engine_for"]
