"""Rollouts as the dashboard's overview and ``/api/rollouts`` send them: a summary per rollout whose size does not
grow with the number of devices (a record of a rollout to 10,000 devices is 3.4 MB of per-device outcomes and
results; ten of them made ``/api/overview`` 34 MB). The whole record is one request away: ``/api/rollout?id=ID``.

A summary holds the record's own fields (state, bundle, times, gate figures, options, reason), each wave with its
device count in place of its device list, the devices per outcome (``outcome_counts``), and the devices that did not
succeed (``not_succeeded``: failures first, then by name; at most :data:`LISTED_DEVICES`, each with its
``device_results`` entry), with ``not_succeeded_more`` saying how many more there are."""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import quote

from edgekit.fleet.rollout_state import KEPT_OUTCOMES, RolloutRecord

#: At most this many devices that did not succeed are listed in a rollout's summary.
LISTED_DEVICES = 50
#: Outcomes of devices still on their way or never sent the bundle: listed after the failures.
UNFINISHED_OUTCOMES = ("pending", "deploying", "not_started", "skipped_offline")


def _time(record: RolloutRecord, name: str) -> str | None:
    value = getattr(record, name)
    return None if value is None else value.isoformat()


def _failure_first(item: tuple[str, str]) -> tuple[int, str]:
    device, outcome = item
    return (1 if outcome in KEPT_OUTCOMES or outcome in UNFINISHED_OUTCOMES else 0, device)


def rollout_summary(record: RolloutRecord, *, listed: int = LISTED_DEVICES) -> dict[str, Any]:
    """The record of one rollout without its per-device maps: counts per outcome, and the first ``listed`` devices
    whose outcome is not ``succeeded`` (with their results), built without copying the whole record."""
    outcomes = record.outcomes
    counts = Counter(outcomes.values())
    others = sorted(((d, o) for d, o in outcomes.items() if o != "succeeded"), key=_failure_first)
    waves = [{k: v for k, v in wave.items() if k != "devices"} | {"device_count": len(wave.get("devices") or ())}
             for wave in record.waves]  # fmt: skip
    finished = record.finished_at or record.updated_at
    return {
        "rollout_id": record.rollout_id, "fleet": record.fleet, "bundle_id": record.bundle_id, "url": record.url,
        "sha256": record.sha256, "state": record.state, "target": record.target, "reason": record.reason,
        "started_at": _time(record, "started_at"), "updated_at": _time(record, "updated_at"),
        "finished_at": _time(record, "finished_at"), "seconds": round((finished - record.started_at).total_seconds(), 3),
        "silent_s": record.silent_s(), "health": record.health, "options": record.options, "waves": waves,
        "device_count": len(record.devices), "canary_count": len(record.canary), "forced_count": len(record.forced),
        "outcome_counts": dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))),
        "not_succeeded": [{"device": device, **record.device_results.get(device, {}), "outcome": outcome}
                          for device, outcome in others[:listed]],
        "not_succeeded_more": max(0, len(others) - listed),
        "detail": f"/api/rollout?id={quote(record.rollout_id, safe='')}",
    }  # fmt: skip


__all__ = ["LISTED_DEVICES", "rollout_summary"]
