"""active_alerts reads only the alert engine's own events: asked of the store by kind (so any number of deploy
events after an alert fired leave it firing), and never a device's event dressed up as an alert."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from edgekit.fleet.alerts import AlertEngine, AlertRules, active
from edgekit.fleet.alerts.active import active_alerts
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import FleetStore
from edgekit.fleet.store.base import DeviceEvent
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.alerts.live_messages import live_window
from tests.fleet.messages import event

SLOW = AlertRules.model_validate({"rules": {"slow": {"kind": "p99_above", "threshold_ms": 50}}})


def _progress_events(count: int, after: dt.datetime) -> list[DeviceEvent]:
    return [DeviceEvent("lab", f"dev-{index:03d}", uuid.uuid4().hex, "deploy_progress", "info", "step",
                        after + dt.timedelta(milliseconds=index + 1)) for index in range(count)]  # fmt: skip


def test_the_store_reads_events_of_the_kinds_asked_for(store: FleetStore) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    firing = DeviceEvent("lab", "dev-1", uuid.uuid4().hex, "alert_firing", "error", "alert slow firing", now)
    store.add_events([firing, *_progress_events(10, now)])
    assert [e.event_id for e in store.events(limit=3, kinds=("alert_firing", "alert_resolved"))] == [firing.event_id]
    assert [e.kind for e in store.events(limit=3)] == ["deploy_progress"] * 3
    assert len(store.events(limit=100, kinds=("deploy_progress",))) == 10


def test_a_firing_alert_outlives_any_number_of_other_events(store: FleetStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(active, "MAX_EVENTS_READ", 5)  # the read's limit, far below the events written after the alert
    store.add_windows([live_window(1, device="dev-slow", p99_ms=200.0, window_s=60.0)])
    [fired] = AlertEngine(SLOW, store).evaluate()
    store.add_events(_progress_events(20, dt.datetime.now(dt.timezone.utc)))
    assert [(a.rule, a.subject, a.event_id) for a in active_alerts(store)] == [("slow", "dev-slow", fired["event_id"])]
    restarted = AlertEngine(SLOW, store)
    restarted._restore()
    assert restarted.firing() == [("slow", "lab", "dev-slow")]
    assert restarted.evaluate() == []  # still breaching: not paged a second time


def test_a_device_event_of_an_alert_kind_is_no_alert(store: FleetStore) -> None:
    spoofed = event("alert_firing", device="dev-7", message="totally an alert")
    assert parse_message("edgekit/v1/lab/dev-7/events", encode_message(spoofed)).reason == "reserved_kind"  # type: ignore[union-attr]
    # stored all the same (a collector from before the check): its payload is an event.v1 message, not an alert
    store.add_events([DeviceEvent("lab", "dev-7", spoofed["event_id"], "alert_firing", "error", spoofed["message"],
                                  dt.datetime.now(dt.timezone.utc), payload=spoofed)])  # fmt: skip
    assert active_alerts(store) == []
    engine = AlertEngine(AlertRules.model_validate({"rules": {}}), store)
    engine._restore()
    assert (engine.firing(), engine.evaluate()) == ([], [])
