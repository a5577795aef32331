"""The dashboard's device page (``/api/device?fleet=F&device=D``): what the device says it is (board, OS, JetPack,
power mode, as its agent reports them in status.v1 ``identity``), its own events, and the rollouts that included
it with its outcome in each and its p50/p99/power in the 15 minutes before and after. A device the store does not know is answered 404 by the route, never replaced by
another device."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from edgekit.fleet.rollout_state import RolloutLog, RolloutRecord
from edgekit.fleet.store.base import DeviceIdentityRecord, FleetStore

#: How many of the device's newest events the page gets (it filters them by kind, level and text itself).
DEVICE_EVENTS = 200
#: How many of the fleet's newest rollouts are searched for the device's rollout history.
ROLLOUTS_SEARCHED = 100

#: The device's telemetry this long before and after each rollout's start is compared (its newest rollouts only).
COMPARE_S = 900
COMPARED_ROLLOUTS = 10

#: Identity fields in the order the page lists them, with their labels.
IDENTITY_FIELDS = (("board", "board"), ("soc", "SoC"), ("os", "OS"), ("l4t", "L4T"), ("jetpack", "JetPack"),
                   ("cuda", "CUDA"), ("tensorrt", "TensorRT"), ("onnxruntime", "ONNX Runtime"),
                   ("power_mode", "power mode"))  # fmt: skip


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def identity_json(record: DeviceIdentityRecord | None) -> dict[str, Any] | None:
    """The identity the device last reported (None when its agent never reported one)."""
    if record is None:
        return None
    return {"fields": [{"name": name, "label": label, "value": getattr(record, name)} for name, label in IDENTITY_FIELDS],
            "clocks_locked": record.clocks_locked, "updated_at": _iso(record.updated_at)}  # fmt: skip


def rollout_history(records: Sequence[RolloutRecord], device: str) -> list[dict[str, Any]]:
    """The rollouts (newest first) that included ``device``: the bundle before and after, the rollout's state, and
    this device's wave, outcome and reason."""
    history = []
    for record in records:
        if device not in record.devices and device not in record.outcomes:
            continue
        result = record.device_results.get(device, {})
        history.append({"rollout_id": record.rollout_id, "started_at": _iso(record.started_at), "state": record.state,
                        "bundle_id": record.bundle_id, "previous_bundle_id": record.previous_bundles.get(device),
                        "outcome": record.outcomes.get(device), "wave": result.get("wave"), "reason": result.get("reason"),
                        "hint": result.get("hint"), "seconds": result.get("seconds")})  # fmt: skip
    return history


def device_detail(store: FleetStore, rollouts: RolloutLog | None, fleet: str, device: str, *,
                  events: int = DEVICE_EVENTS) -> dict[str, Any]:  # fmt: skip
    """What the device page shows besides its charts."""
    from edgekit.fleet.dashboard.api import events_json

    identity = next((i for i in store.device_identities(fleet) if i.device == device), None)
    records = rollouts.recent(ROLLOUTS_SEARCHED, fleet) if rollouts is not None else []
    history = rollout_history(records, device)
    for entry in history[:COMPARED_ROLLOUTS]:
        entry["before"], entry["after"] = before_after(store, fleet, device, dt.datetime.fromisoformat(entry["started_at"]))
    return {"fleet": fleet, "device": device, "identity": identity_json(identity),
            "events": events_json(store.events(fleet=fleet, device=device, limit=events)), "rollouts": history,
            "compare_s": COMPARE_S}  # fmt: skip


def before_after(store: FleetStore, fleet: str, device: str, moment: dt.datetime,
                 seconds: float = COMPARE_S) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:  # fmt: skip
    """The device's p50, p99 and mean power in the ``seconds`` before ``moment`` and after it (None: no window)."""
    span = dt.timedelta(seconds=seconds)
    sides = []
    for since, until in ((moment - span, moment), (moment, moment + span)):
        rows = [r for r in store.aggregate(("device",), devices=[(fleet, device)], since=since, until=until) if r.windows]
        sides.append({"windows": rows[0].windows, "p50_ms": rows[0].p50_ms, "p99_ms": rows[0].p99_ms,
                      "power_mean_mw": rows[0].power_mean_mw} if rows else None)  # fmt: skip
    return sides[0], sides[1]


__all__ = ["COMPARE_S", "DEVICE_EVENTS", "IDENTITY_FIELDS", "before_after", "device_detail", "identity_json", "rollout_history"]
