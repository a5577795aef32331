"""The dashboard's JSON: overview (devices per state, bundle versions, rollouts, rejected-message counts, events), and
time series downsampled in the store (time buckets), so a page never receives more than ``points``
values per line however many windows the store holds."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edgekit.fleet.dashboard.rollout_summary import rollout_summary
from edgekit.fleet.liveness import STATES
from edgekit.fleet.rollout_state import RolloutLog
from edgekit.fleet.store.base import Aggregate, DeviceEvent, DeviceSummary, FleetStore, ModelAggregate
from edgekit.fleet.store.device_reads import DeviceCounts
from edgekit.fleet.store.postgres import redact

#: How far ahead of the host a device's clock may run and its windows still show: a device whose clock says 2999
#: would otherwise stretch every chart's time axis to it.
CLOCK_AHEAD = dt.timedelta(minutes=5)
DEFAULT_POINTS = 300
MAX_POINTS = 2000
MAX_HOURS = 24 * 90
#: Bucket lengths the series snap to, in seconds (so neighbouring requests share buckets).
NICE_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def bucket_for(span_s: float, points: int) -> int:
    """The smallest nice bucket that keeps ``span_s`` to at most ``points`` buckets."""
    wanted = span_s / max(1, points)
    return next((b for b in NICE_BUCKETS_S if b >= wanted), int(math.ceil(wanted)))


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def device_row(summary: DeviceSummary, power_mode: str | None = None, models: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "fleet": summary.fleet, "device": summary.device, "state": summary.state, "bundle_id": summary.bundle_id,
        "models": ", ".join(models) or None,
        "target": summary.target, "power_mode": power_mode, "p50_ms": _round(summary.p50_ms), "p99_ms": _round(summary.p99_ms),
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


def state_counts(summaries: Sequence[DeviceSummary]) -> dict[str, int]:
    """Devices per state (as the store judged it, :mod:`edgekit.fleet.liveness`): the four liveness states always,
    0 when none, then any other state an agent reported (``updating``)."""
    counts = dict.fromkeys(STATES, 0)
    for summary in summaries:
        counts[summary.state] = counts.get(summary.state, 0) + 1
    return counts


def events_json(events: Sequence[DeviceEvent]) -> list[dict[str, Any]]:
    return [{"fleet": e.fleet, "device": e.device, "kind": e.kind, "level": e.level, "message": e.message,
             "at": _iso(e.at), "command_id": e.command_id} for e in events]  # fmt: skip


def overview(store: FleetStore, rollouts: RolloutLog | None, *, fleet: str | None = None, events: int = 30,
             summaries: Sequence[DeviceSummary] | None = None, fleets: Sequence[str] | None = None,
             breaching: int | None = None, counts: DeviceCounts | None = None,
             simulated: int | None = None) -> dict[str, Any]:  # fmt: skip
    """What the page shows besides the device table (``/api/devices`` pages that): devices per state, bundle
    versions, rejected messages, rollouts, recent events, and the fleets the selector offers. A few KB however
    large the fleet. The devices are counted in the store (``counts``, when the caller has them already), or from
    ``summaries`` when given; ``fleets`` and ``simulated`` (devices whose numbers are synthetic) may be passed too;
    ``breaching`` (devices with an active alert) is left out when None."""
    if summaries is not None:
        devices, states, bundles = len(summaries), state_counts(summaries), bundle_rows(summaries)
    else:
        counts = store.device_counts(fleet) if counts is None else counts  # type: ignore[attr-defined]
        devices, states, bundles = counts.devices, counts.states, counts.bundles
    figures: dict[str, Any] = {"devices": devices, "states": states, "simulated": store.simulated_devices(fleet) if simulated is None else simulated}
    if breaching is not None:
        figures["breaching"] = breaching
    return {
        "generated_at": _iso(dt.datetime.now(dt.timezone.utc)),
        "store": redact(store.url),  # the page shows it: never a password
        "fleet": fleet,
        "fleets": list(store.known_values("fleet") if fleets is None else fleets),
        "counts": figures,
        "bundles": bundles,
        "rejected": store.rejected_counts(),
        "rollouts": [rollout_summary(r) for r in rollouts.recent(10, fleet)] if rollouts is not None else [],  # /api/rollout: all
        "events": events_json(store.events(fleet=fleet, limit=events)),
    }


def _series(rows: Sequence[Aggregate] | Sequence[ModelAggregate], fields: Sequence[str]) -> dict[str, list[Any]]:
    ordered = sorted((r for r in rows if r.bucket_start is not None), key=lambda r: r.bucket_start)  # type: ignore[arg-type, return-value]
    out: dict[str, list[Any]] = {"t": [int(r.bucket_start.timestamp() * 1000) for r in ordered]}  # type: ignore[union-attr]
    for name in fields:
        out[name] = [_round(getattr(r, name)) for r in ordered]
    return out


#: Per bucket: p50 and p99 are inference-weighted means, ``p99_max_ms`` the worst window's p99 (a 20 s spike keeps
#: its height in a 5-minute bucket), power the time-weighted mean, temperature the maximum.
SERIES_FIELDS = ("p50_ms", "p99_ms", "p99_max_ms", "power_mean_mw", "energy_per_inference_mj", "temperature_max_c")
FLEET_SERIES_FIELDS = ("p50_ms", "p99_ms", "p99_max_ms", "power_mean_mw")
#: What the fleet chart can group by (a key of :meth:`FleetStore.aggregate`, or ``model``: per-model windows, issue 20).
FLEET_GROUPS = ("bundle_id", "target", "power_mode", "model")
#: By model the second chart shows each model's throughput (power is the device's, shared by its models).
MODEL_SERIES_FIELDS = ("p50_ms", "p99_ms", "p99_max_ms", "throughput_per_s")


@dataclass(frozen=True)
class SeriesRange:
    """The time a series covers and its bucket length. The span starts at the first window in the asked range
    (not at the range's start), so a store holding 30 s of telemetry gets buckets of a second or two, not one
    bucket of 5 minutes: resolution follows the data as well as the range."""

    since: dt.datetime
    until: dt.datetime
    bucket_s: int

    def to_json(self) -> dict[str, Any]:
        return {"since": _iso(self.since), "until": _iso(self.until), "bucket_s": self.bucket_s,
                "span_s": round((self.until - self.since).total_seconds(), 3)}  # fmt: skip


def median_interval_s(summaries: Sequence[DeviceSummary]) -> float | None:
    """The median device's telemetry interval (its newest window's length), None when no device has one."""
    intervals = sorted(s.interval_s for s in summaries if s.interval_s)
    return intervals[len(intervals) // 2] if intervals else None


#: A telemetry window length, or how to find it (called only when a range is not kept already).
WindowLength = Callable[[], "float | None"]


def series_range(store: FleetStore, *, hours: float, points: int, now: dt.datetime, window_s: WindowLength | None = None,
                 **filters: Any) -> SeriesRange:  # fmt: skip
    """Bucket length for ``hours`` back from ``now``, or for the stretch of it that holds windows matching ``filters``,
    never shorter than the devices' telemetry window (a fleet bucket shorter than that would hold a different
    few devices each time, and the line would zigzag between them).

    Fleet-wide (no ``devices`` filter) with ``window_s`` given (the median device's interval, from the summaries the
    page reads anyway), the first window comes from the store's per-fleet aggregate: at 10,000 devices that is
    about a millisecond, where finding each device's window length in the range took 1.6 s. The aggregate is asked
    from one window length before the range (it counts a window by its start, the per-device read by its end, so a
    window straddling the range's start is in both), and when it finds nothing the range is empty for the per-device
    read too: the answer is the default bucket, without that read (1.3-1.4 s at 10,000 devices on PostgreSQL when no
    window had started in the last hour, as with hourly windows)."""
    since = now - dt.timedelta(hours=hours)
    if window_s is not None and "devices" not in filters:
        length = window_s()
        if length:
            found = store.aggregate(("fleet",), since=since - dt.timedelta(seconds=length), until=now + CLOCK_AHEAD, **filters)
            firsts = [row.first_window_start for row in found
                      if row.first_window_start is not None]  # fmt: skip
            if not firsts:
                return SeriesRange(since, now, bucket_for(hours * 3600.0, points))
            start = min(max(since, min(firsts)), now)
            return SeriesRange(start, now, bucket_for(max(1.0, (now - start).total_seconds(), length * points * 0.999), points))
    spans = [(row.first_window_start, row.last_window_end, row.windows)
             for row in store.aggregate(("fleet", "device"), since=since, until=now + CLOCK_AHEAD, **filters)
             if row.first_window_start is not None and row.last_window_end is not None]  # fmt: skip
    if not spans:
        return SeriesRange(since, now, bucket_for(hours * 3600.0, points))
    start = min(max(since, min(first for first, _, _ in spans)), now)  # a device clock ahead of now moves nothing
    # each device's mean window length (rollups count the windows they hold); the median device's
    lengths = sorted((last - first).total_seconds() / max(1, windows) for first, last, windows in spans)
    median_s = lengths[len(lengths) // 2]
    return SeriesRange(start, now, bucket_for(max(1.0, (now - start).total_seconds(), median_s * points * 0.999), points))


class SeriesRanges:
    """:func:`series_range` answers kept for ``ttl_s``: the page asks again every 10 s and the bucket length rarely
    changes, while finding it costs a query over the whole range (about half of a 24 h fleet series)."""

    def __init__(self, ttl_s: float = 60.0) -> None:
        self.ttl_s = ttl_s
        self._kept: dict[tuple[Any, ...], tuple[float, SeriesRange]] = {}

    def __call__(self, store: FleetStore, *, hours: float, points: int, now: dt.datetime, window_s: WindowLength | None = None,
                 **filters: Any) -> SeriesRange:  # fmt: skip
        key = (hours, points, repr(sorted(filters.items())))
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept[0] < self.ttl_s:
            return SeriesRange(max(kept[1].since, now - dt.timedelta(hours=hours)), now, kept[1].bucket_s)
        found = series_range(store, hours=hours, points=points, now=now, window_s=window_s, **filters)
        if len(self._kept) > 256:
            self._kept.clear()
        self._kept[key] = (time.monotonic(), found)
        return found


def device_series(store: FleetStore, fleet: str, device: str, *, hours: float = 24.0, points: int = DEFAULT_POINTS,
                  now: dt.datetime | None = None, ranges: SeriesRanges | None = None) -> dict[str, Any]:  # fmt: skip
    """One device's latency, power, energy and temperature over the last ``hours``, at most ``points`` buckets."""
    now = now or dt.datetime.now(dt.timezone.utc)
    span = (ranges or series_range)(store, hours=hours, points=points, now=now, devices=[(fleet, device)])
    rows = store.aggregate(("device",), devices=[(fleet, device)], since=now - dt.timedelta(hours=hours), until=now + CLOCK_AHEAD,
                           bucket_s=span.bucket_s)  # fmt: skip
    return {"fleet": fleet, "device": device, "hours": hours, **span.to_json(), "series": _series(rows, SERIES_FIELDS)}


def fleet_series(store: FleetStore, *, fleet: str | None = None, by: str = "bundle_id", hours: float = 24.0,
                 points: int = DEFAULT_POINTS, now: dt.datetime | None = None, ranges: SeriesRanges | None = None,
                 window_s: WindowLength | None = None) -> dict[str, Any]:  # fmt: skip
    """Fleet-wide latency and power per bundle (or target, or reported power mode) over time: what changed when a
    bundle rolled out, and what each target or power mode costs."""
    if by not in FLEET_GROUPS:
        raise ValueError(f"by must be one of {FLEET_GROUPS}, got {by!r}")
    now = now or dt.datetime.now(dt.timezone.utc)
    span = (ranges or series_range)(store, hours=hours, points=points, now=now, window_s=window_s, fleet=fleet)
    if by == "model":
        return _model_series(store, fleet=fleet, hours=hours, now=now, span=span)
    rows = store.aggregate((by,), fleet=fleet, since=now - dt.timedelta(hours=hours), until=now + CLOCK_AHEAD, bucket_s=span.bucket_s)
    groups: dict[str, list[Aggregate]] = {}
    for row in rows:
        groups.setdefault(getattr(row, by) or ("(not reported)" if by == "power_mode" else "(none)"), []).append(row)
    return {"fleet": fleet, "by": by, "hours": hours, **span.to_json(),
            "groups": {name: _series(group, FLEET_SERIES_FIELDS) | {"devices": max(r.devices for r in group)}
                       for name, group in sorted(groups.items())}}  # fmt: skip


def _model_series(store: FleetStore, *, fleet: str | None, hours: float, now: dt.datetime, span: SeriesRange) -> dict[str, Any]:
    rows = store.model_aggregate(("model",), fleet=fleet, since=now - dt.timedelta(hours=hours), until=now + CLOCK_AHEAD,
                                 bucket_s=span.bucket_s)  # fmt: skip
    groups: dict[str, list[ModelAggregate]] = {}
    for row in rows:
        groups.setdefault(row.model or "(none)", []).append(row)
    return {"fleet": fleet, "by": "model", "hours": hours, **span.to_json(),
            "groups": {name: _series(group, MODEL_SERIES_FIELDS) | {"devices": max(r.devices for r in group)}
                       for name, group in sorted(groups.items())}}  # fmt: skip


def bundle_series(store: FleetStore, *, fleet: str | None = None, hours: float = 24.0, points: int = DEFAULT_POINTS,
                  now: dt.datetime | None = None, ranges: SeriesRanges | None = None,
                  window_s: WindowLength | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`fleet_series` by bundle, with the groups under ``bundles``."""
    data = fleet_series(store, fleet=fleet, by="bundle_id", hours=hours, points=points, now=now, ranges=ranges, window_s=window_s)
    data["bundles"] = data.pop("groups")
    return data


def aggregate_json(row: Aggregate) -> dict[str, Any]:
    data = asdict(row)
    for key in ("bucket_start", "first_window_start", "last_window_end"):
        data[key] = _iso(data[key])
    return data
