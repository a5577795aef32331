"""The dashboard's JSON: device table, bundle versions, rollouts, rejected-message counts, events, and
time series downsampled in the store (time buckets), so a page never receives more than ``points``
values per line however many windows the store holds."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from edgekit.fleet.rollout_state import RolloutLog
from edgekit.fleet.store.base import Aggregate, DeviceSummary, FleetStore

DEFAULT_POINTS = 288
MAX_POINTS = 2000
MAX_HOURS = 24 * 90
#: Bucket lengths the series snap to, in seconds (so neighbouring requests share buckets).
NICE_BUCKETS_S = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def bucket_for(span_s: float, points: int) -> int:
    """The smallest nice bucket that keeps ``span_s`` to at most ``points`` buckets."""
    wanted = span_s / max(1, points)
    return next((b for b in NICE_BUCKETS_S if b >= wanted), int(math.ceil(wanted)))


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def device_row(summary: DeviceSummary) -> dict[str, Any]:
    return {
        "fleet": summary.fleet, "device": summary.device, "state": summary.state, "bundle_id": summary.bundle_id,
        "target": summary.target, "p50_ms": _round(summary.p50_ms), "p99_ms": _round(summary.p99_ms),
        "power_mw": _round(summary.power_mean_mw, 1), "energy_per_inference_mj": _round(summary.energy_per_inference_mj),
        "temperature_c": _round(summary.temperature_max_c, 1), "last_seen": _iso(summary.last_seen),
        "windows": summary.windows, "missing_seqs": summary.missing_seqs,
    }  # fmt: skip


def bundle_rows(summaries: Sequence[DeviceSummary]) -> list[dict[str, Any]]:
    """Bundle versions in the fleet: how many devices run each (and how many of them are online)."""
    running = Counter(s.bundle_id for s in summaries)
    online = Counter(s.bundle_id for s in summaries if s.state == "online")
    targets: dict[str | None, set[str]] = {}
    for s in summaries:
        if s.target:
            targets.setdefault(s.bundle_id, set()).add(s.target)
    return [{"bundle_id": bundle, "devices": count, "online": online.get(bundle, 0),
             "targets": sorted(targets.get(bundle, ()))} for bundle, count in running.most_common()]  # fmt: skip


def overview(store: FleetStore, rollouts: RolloutLog | None, *, fleet: str | None = None, events: int = 30) -> dict[str, Any]:
    """Everything the page shows at first load, in one answer."""
    summaries = store.device_summaries(fleet)
    recent_events = store.events(fleet=fleet, limit=events)
    return {
        "generated_at": _iso(dt.datetime.now(dt.timezone.utc)),
        "store": store.url,
        "fleet": fleet,
        "counts": {"devices": len(summaries), "online": sum(1 for s in summaries if s.state == "online"),
                   "offline": sum(1 for s in summaries if s.state != "online")},  # fmt: skip
        "devices": [device_row(s) for s in summaries],
        "bundles": bundle_rows(summaries),
        "rejected": store.rejected_counts(),
        "rollouts": [r.to_json() for r in rollouts.recent(10, fleet)] if rollouts is not None else [],
        "events": [{"fleet": e.fleet, "device": e.device, "kind": e.kind, "level": e.level, "message": e.message,
                    "at": _iso(e.at), "command_id": e.command_id} for e in recent_events],  # fmt: skip
    }


def _series(rows: Sequence[Aggregate], bucket_s: int, fields: Sequence[str]) -> dict[str, list[Any]]:
    ordered = sorted((r for r in rows if r.bucket_start is not None), key=lambda r: r.bucket_start)  # type: ignore[arg-type, return-value]
    out: dict[str, list[Any]] = {"t": [int(r.bucket_start.timestamp() * 1000) for r in ordered]}  # type: ignore[union-attr]
    for name in fields:
        out[name] = [_round(getattr(r, name)) for r in ordered]
    return out


SERIES_FIELDS = ("p50_ms", "p99_ms", "power_mean_mw", "energy_per_inference_mj", "temperature_max_c")


def device_series(store: FleetStore, fleet: str, device: str, *, hours: float = 24.0, points: int = DEFAULT_POINTS,
                  now: dt.datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """One device's latency, power, energy and temperature over the last ``hours``, at most ``points`` buckets."""
    now = now or dt.datetime.now(dt.timezone.utc)
    bucket_s = bucket_for(hours * 3600.0, points)
    rows = store.aggregate(("device",), devices=[(fleet, device)], since=now - dt.timedelta(hours=hours), bucket_s=bucket_s)
    return {"fleet": fleet, "device": device, "hours": hours, "bucket_s": bucket_s, "series": _series(rows, bucket_s, SERIES_FIELDS)}


def bundle_series(store: FleetStore, *, fleet: str | None = None, hours: float = 24.0, points: int = DEFAULT_POINTS,
                  now: dt.datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """Fleet-wide p99 and power per bundle over time: what changed when a bundle rolled out."""
    now = now or dt.datetime.now(dt.timezone.utc)
    bucket_s = bucket_for(hours * 3600.0, points)
    rows = store.aggregate(("bundle_id",), fleet=fleet, since=now - dt.timedelta(hours=hours), bucket_s=bucket_s)
    by_bundle: dict[str, list[Aggregate]] = {}
    for row in rows:
        by_bundle.setdefault(row.bundle_id or "(none)", []).append(row)
    return {"fleet": fleet, "hours": hours, "bucket_s": bucket_s,
            "bundles": {bundle: _series(group, bucket_s, ("p50_ms", "p99_ms", "power_mean_mw")) | {"devices": max(r.devices for r in group)}
                        for bundle, group in by_bundle.items()}}  # fmt: skip


def aggregate_json(row: Aggregate) -> dict[str, Any]:
    data = asdict(row)
    for key in ("bucket_start", "first_window_start", "last_window_end"):
        data[key] = _iso(data[key])
    return data
