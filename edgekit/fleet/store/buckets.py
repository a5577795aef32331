"""Aggregates kept as windows arrive (issue 27): what every fleet-wide read uses instead of raw windows.

:meth:`FleetStore.add_windows` hands the windows it actually stored (new, not duplicates) to :func:`ingest`, in
the same transaction. It sums them, in Python, into

- ``fleet_buckets``: per fleet, bundle, target and power mode, per 1-minute and 1-hour bucket (the sums the
  per-device rollups keep, so means merge exactly) and the number of devices with a window in the bucket;
- ``fleet_model_buckets``: the same per fleet, model and bundle;
- ``device_latest``: per device, its totals over all history and its newest window (``fleet status``);
- ``device_bundles``: per device and bundle, its first and last window (the report's bundle switches).

A bucket's ``devices`` grows when a window is its device's first in that bucket and group, which
``device_latest.marks`` remembers per tier (the newest bucket counted and its groups). Windows that arrive out of
order (an older bucket than the mark: spool replay) add their sums but not a device: counts are exact for
devices that report in order, which agents do. A minute bucket's ``hour_devices`` counts the devices whose first window
in the hour (and group) fell in that minute, so the minutes of an hour sum to the hour's ``devices``: on TimescaleDB
the hour tier is a continuous aggregate of the minute tier (:mod:`edgekit.fleet.store.timescale_aggregates`). Target and power mode are the device's as known when the window
arrived (its status or ``set_device_target``; the window's own ``power_mode``, else its reported identity's).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.fleet.store.base import TelemetryWindow

if TYPE_CHECKING:
    from edgekit.fleet.store.dialect import SqlDialect

#: Bucket lengths kept, seconds: minutes for ranges up to a couple of days, hours beyond.
TIERS = (60, 3600)
_UTC = dt.timezone.utc

#: fleet_buckets columns after the key, and how a bucket that exists merges a new part: sum, max, min, or a sum
#: of values that may be NULL (no reading at all stays NULL).
FLEET_SUMS: tuple[tuple[str, str], ...] = (
    ("devices", "sum"), ("windows", "sum"), ("inferences", "sum"), ("errors", "sum"), ("latency_count", "sum"),
    ("p50_sum", "sum"), ("p99_sum", "sum"), ("p99_max_ms", "max"), ("power_s", "sum"), ("power_mw_s", "sum"),
    ("energy_mj", "nullable_sum"), ("energy_active_mj", "nullable_sum"), ("energy_count", "sum"),
    ("temperature_max_c", "max"), ("window_start_min", "min"), ("window_end_max", "max"),
)  # fmt: skip
FLEET_KEY = ("fleet", "bundle_id", "target", "power_mode", "bucket_s", "bucket_start")
MODEL_SUMS: tuple[tuple[str, str], ...] = (
    ("devices", "sum"), ("windows", "sum"), ("inferences", "sum"), ("errors", "sum"), ("latency_count", "sum"),
    ("p50_sum", "sum"), ("p99_sum", "sum"), ("p99_max_ms", "max"), ("memory_mb_max", "max"), ("seconds", "sum"),
    ("window_start_min", "min"), ("window_end_max", "max"),
)  # fmt: skip
MODEL_KEY = ("fleet", "model", "bundle_id", "bucket_s", "bucket_start")
_TIME_SUMS = ("window_start_min", "window_end_max")
#: device_bundles columns after (fleet, device, bundle_id): a device's sums on one bundle over all its history.
BUNDLE_SUMS = tuple(item for item in FLEET_SUMS if item[0] != "devices")
#: The minute tier's extra column where the hour tier is a continuous aggregate of it (see ``hour_devices`` above).
HOUR_DEVICES = (("hour_devices", "sum"),)


def _merge(how: str, old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    if how in ("sum", "nullable_sum"):
        return old + new
    return max(old, new) if how == "max" else min(old, new)


class _Merger:
    """Merges a part's sums into a bucket's, by kind of column (the hot loop of ingest: a few per window)."""

    def __init__(self, sums: Sequence[tuple[str, str]]) -> None:
        self.sums = tuple(name for name, how in sums if how == "sum")
        self.nullable = tuple(name for name, how in sums if how == "nullable_sum")
        self.maxima = tuple(name for name, how in sums if how == "max")
        self.minima = tuple(name for name, how in sums if how == "min")

    def __call__(self, buckets: dict[Any, dict[str, Any]], key: Any, part: dict[str, Any]) -> None:
        target = buckets.get(key)
        if target is None:
            buckets[key] = dict(part)
            return
        for name in self.sums:
            target[name] += part[name]
        for name in self.nullable:
            new = part[name]
            if new is not None:
                old = target[name]
                target[name] = new if old is None else old + new
        for name in self.maxima:
            new = part[name]
            if new is not None:
                old = target[name]
                if old is None or new > old:
                    target[name] = new
        for name in self.minima:
            new = part[name]
            if new is not None:
                old = target[name]
                if old is None or new < old:
                    target[name] = new


_MERGE_FLEET, _MERGE_MODEL, _MERGE_BUNDLE = _Merger(FLEET_SUMS), _Merger(MODEL_SUMS), _Merger(BUNDLE_SUMS)
_MERGE_FLEET_HOURLY, _MERGE_MODEL_HOURLY = _Merger(FLEET_SUMS + HOUR_DEVICES), _Merger(MODEL_SUMS + HOUR_DEVICES)


def _epoch(moment: dt.datetime) -> float:
    return moment.timestamp()


def bucket_start(epoch_s: float, bucket_s: int) -> float:
    return float(int(epoch_s // bucket_s) * bucket_s)


@dataclass
class Part:
    """One window's (or one old rollup's) contribution to the aggregates; times as epoch seconds."""

    fleet: str
    device: str
    bundle_id: str
    start: float
    end: float
    sums: dict[str, Any]
    power_mode: str | None = None
    seq_min: int | None = None
    seq_max: int | None = None
    received_at_max: float | None = None
    latest: tuple[Any, ...] | None = None  # bundle, p50, p99, power, energy/inference, temperature (newest window)
    models: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (model, bundle, sums)
    #: False for a part that only carries model sums (history summed in from the per-model tables)
    device_wide: bool = True


def window_part(w: TelemetryWindow) -> Part:
    """A raw window's contribution."""
    start, end = _epoch(w.window_start), _epoch(w.window_end)
    seconds = max(end - start, 0.001)
    count = w.count
    sums = {
        "devices": 0, "windows": 1, "inferences": count, "errors": w.errors,
        "latency_count": 0 if w.p50_ms is None else count, "p50_sum": (w.p50_ms or 0.0) * count,
        "p99_sum": (w.p99_ms or 0.0) * count, "p99_max_ms": w.p99_ms,
        "power_s": 0.0 if w.power_mean_mw is None else seconds, "power_mw_s": (w.power_mean_mw or 0.0) * seconds,
        "energy_mj": w.energy_mj, "energy_active_mj": w.energy_mj if count > 0 else None,
        "energy_count": count if count > 0 and w.energy_mj is not None else 0,
        "temperature_max_c": w.temperature_max_c, "window_start_min": start, "window_end_max": end,
    }  # fmt: skip
    mode = w.payload.get("power_mode") if isinstance(w.payload, dict) else None
    models = []
    for m in w.models or ():
        models.append((m.model or "", m.bundle_id or "", _model_sums(m.count, m.errors, m.p50_ms, m.p99_ms, m.memory_mb, start, end)))
    if not w.models:
        models.append((w.model or "", w.bundle_id or "", _model_sums(count, w.errors, w.p50_ms, w.p99_ms, None, start, end)))
    return Part(w.fleet, w.device, w.bundle_id or "", start, end, sums, str(mode) if mode is not None else None,
                w.seq, w.seq, _epoch(w.received_at),
                (w.bundle_id, w.p50_ms, w.p99_ms, w.power_mean_mw, w.energy_per_inference_mj, w.temperature_max_c), models)  # fmt: skip


def _model_sums(count: int, errors: int, p50: float | None, p99: float | None, memory: float | None, start: float,
                end: float) -> dict[str, Any]:  # fmt: skip
    return {"devices": 0, "windows": 1, "inferences": count, "errors": errors,
            "latency_count": 0 if p50 is None else count, "p50_sum": (p50 or 0.0) * count, "p99_sum": (p99 or 0.0) * count,
            "p99_max_ms": p99, "memory_mb_max": memory, "seconds": max(end - start, 0.001), "window_start_min": start,
            "window_end_max": end}  # fmt: skip


#: device_latest's columns after (fleet, device), as :func:`ingest` reads and writes them.
DEVICE_COLUMNS = ("windows", "seq_min", "seq_max", "received_at_max", "window_end_max", "latest_seq", "bundle_id", "p50_ms",
                  "p99_ms", "power_mean_mw", "energy_per_inference_mj", "temperature_max_c", "interval_s", "marks")  # fmt: skip


@dataclass
class _Device:
    """One device's device_latest row, read under the transaction's lock and updated by a batch (times epoch s)."""

    marks: dict[str, list[Any]] = field(default_factory=dict)
    windows: int = 0
    seq_min: int | None = None
    seq_max: int | None = None
    received_at_max: float | None = None
    window_end_max: float | None = None
    latest_seq: int | None = None
    latest: tuple[Any, ...] = (None,) * 6
    interval_s: float | None = None


def _counts_device(marks: dict[str, list[Any]], tier_key: str, group: str, start: float) -> bool:
    """Whether a part in bucket ``start`` of ``group`` is its device's first there; remembers it when it is. A mark
    is [the newest bucket start counted, the groups counted in it]."""
    mark = marks.get(tier_key)
    if mark is not None and mark[0] > start:
        return False  # an older bucket than one already counted: out of order, sums only
    if mark is None or mark[0] < start:
        marks[tier_key] = [start, [group]]
        return True
    if group in mark[1]:
        return False
    mark[1].append(group)
    return True


def ingest(store: SqlDialect, cursor: Any, parts: Sequence[Part]) -> None:
    """Add ``parts`` (new windows, or old rollups being summed in) to the aggregates, in the open transaction."""
    if not parts:
        return
    devices = sorted({(p.fleet, p.device) for p in parts})
    known = _lock_devices(store, cursor, devices)
    targets, modes = _device_context(store, cursor, devices)
    fleet: dict[tuple[Any, ...], dict[str, Any]] = {}
    model: dict[tuple[Any, ...], dict[str, Any]] = {}
    spans: dict[tuple[str, str, str], list[Any]] = {}
    changed: dict[tuple[str, str], _Device] = {}
    written = getattr(store, "bucket_tiers", TIERS)  # TimescaleDB: the minute tier; the hour tier is a continuous aggregate
    extra = HOUR_DEVICES if TIERS[1] not in written else ()
    merge_fleet, merge_model = (_MERGE_FLEET_HOURLY, _MERGE_MODEL_HOURLY) if extra else (_MERGE_FLEET, _MERGE_MODEL)
    for part in sorted(parts, key=lambda p: (p.fleet, p.device, p.seq_min if p.seq_min is not None else -1, p.start)):
        key = (part.fleet, part.device)
        device = changed.setdefault(key, known.get(key) or _Device())
        mode = part.power_mode if part.power_mode is not None else modes.get(key)
        group = [part.fleet, part.bundle_id, targets.get(key) or "", mode or ""]
        hour_new: dict[str, int] = {}  # whether the part is its device's first in its hour, per group: a minute's hour_devices
        for tier in reversed(TIERS):
            start = bucket_start(part.start, tier)
            if part.device_wide:
                sums = dict(part.sums)
                sums["devices"] = 1 if _counts_device(device.marks, f"f{tier}", "\x1f".join(group), start) else 0
                sums["hour_devices"] = hour_new.setdefault("", sums["devices"])
                if tier in written:
                    merge_fleet(fleet, (*group, tier, start), sums)
            for model_name, bundle, model_sums in part.models:
                msums = dict(model_sums)
                msums["devices"] = 1 if _counts_device(device.marks, f"m{tier}:{model_name}", bundle, start) else 0
                msums["hour_devices"] = hour_new.setdefault(f"m:{model_name}\x1f{bundle}", msums["devices"])
                if tier in written:
                    merge_model(model, (part.fleet, model_name, bundle, tier, start), msums)
        if not part.device_wide:
            continue
        _MERGE_BUNDLE(spans, (part.fleet, part.device, part.bundle_id), part.sums)
        _add_to_device(device, part)
    tables = getattr(store, "bucket_tables", {})
    _write(store, cursor, tables.get("fleet_buckets", "fleet_buckets"), FLEET_KEY, FLEET_SUMS + extra, fleet)
    _write(store, cursor, tables.get("fleet_model_buckets", "fleet_model_buckets"), MODEL_KEY, MODEL_SUMS + extra, model)
    _write_spans(store, cursor, spans)
    _write_devices(store, cursor, changed)


def _add_to_device(device: _Device, part: Part) -> None:
    # The newest window is the one with the highest seq, or one that starts after every window so far ended: a
    # device whose seqs started again (a new spool, a reflash) would otherwise show its old figures until its
    # seqs passed the old ones.
    newest = part.latest is not None and part.seq_max is not None and (
        device.latest_seq is None or part.seq_max > device.latest_seq
        or (device.window_end_max is not None and part.start >= device.window_end_max))  # fmt: skip
    device.windows += int(part.sums["windows"])
    device.seq_min = _merge("min", device.seq_min, part.seq_min)
    device.seq_max = _merge("max", device.seq_max, part.seq_max)
    device.received_at_max = _merge("max", device.received_at_max, part.received_at_max)
    device.window_end_max = _merge("max", device.window_end_max, part.end)
    if newest:
        device.latest_seq, device.latest, device.interval_s = part.seq_max, part.latest, max(part.end - part.start, 0.0)


def _lock_devices(store: SqlDialect, cursor: Any, devices: Sequence[tuple[str, str]]) -> dict[tuple[str, str], _Device]:
    """The devices' device_latest rows, created if new and (PostgreSQL) locked for this transaction in key order,
    so that two collectors writing the same devices never wait on each other in a circle."""
    from edgekit.fleet.store import queries

    params: dict[str, Any] = {}
    where = queries.device_filter(store, "d", params, devices)
    cursor.execute(store._sql(f"SELECT d.fleet, d.device FROM device_latest d WHERE {where}"), params)
    missing = sorted(set(devices) - {(row[0], row[1]) for row in cursor.fetchall()})
    if missing:
        start, end = store.insert_ignore
        cursor.executemany(store._sql(f"{start} device_latest (fleet, device) VALUES (?, ?) {end}"), missing)
    cursor.execute(store._sql(f"SELECT d.fleet, d.device, {', '.join('d.' + c for c in DEVICE_COLUMNS)} FROM device_latest d "
                              f"WHERE {where} ORDER BY d.fleet, d.device{store.lock_rows_sql}"), params)  # fmt: skip
    found = {}
    for row in cursor.fetchall():
        values = dict(zip(DEVICE_COLUMNS, row[2:]))
        marks = values["marks"]
        found[(row[0], row[1])] = _Device(
            marks=json.loads(marks) if isinstance(marks, str) else dict(marks or {}), windows=int(values["windows"] or 0),
            seq_min=values["seq_min"], seq_max=values["seq_max"],
            received_at_max=_epoch(store.time_out(values["received_at_max"])) if values["received_at_max"] is not None else None,
            window_end_max=_epoch(store.time_out(values["window_end_max"])) if values["window_end_max"] is not None else None,
            latest_seq=values["latest_seq"],
            latest=(values["bundle_id"], values["p50_ms"], values["p99_ms"], values["power_mean_mw"],
                    values["energy_per_inference_mj"], values["temperature_max_c"]),
            interval_s=values["interval_s"])  # fmt: skip
    return found


def _device_context(store: SqlDialect, cursor: Any,
                    devices: Sequence[tuple[str, str]]) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:  # fmt: skip
    """Each device's target and reported power mode, as known now."""
    from edgekit.fleet.store import queries

    params: dict[str, Any] = {}
    where = queries.device_filter(store, "t", params, devices)
    cursor.execute(store._sql(f"SELECT t.fleet, t.device, t.target FROM device_targets t WHERE {where}"), params)
    targets = {(r[0], r[1]): r[2] for r in cursor.fetchall()}
    params = {}
    where = queries.device_filter(store, "i", params, devices)
    cursor.execute(store._sql(f"SELECT i.fleet, i.device, i.power_mode FROM device_identity i WHERE {where} "
                              "AND i.power_mode IS NOT NULL"), params)  # fmt: skip
    modes = {(r[0], r[1]): r[2] for r in cursor.fetchall()}
    return targets, modes


def _upsert_sql(store: SqlDialect, table: str, key: Sequence[str], sums: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """Head and tail of a multi-row upsert that merges ``sums`` into rows that exist."""
    columns = [*key, *(name for name, _ in sums)]
    merges = []
    for name, how in sums:
        old, new = f"{table}.{name}", f"excluded.{name}"
        if how == "sum":
            merges.append(f"{name} = {old} + {new}")
        elif how == "nullable_sum":
            merges.append(f"{name} = CASE WHEN {old} IS NULL THEN {new} WHEN {new} IS NULL THEN {old} ELSE {old} + {new} END")
        else:
            merges.append(f"{name} = {(store.greatest_sql if how == 'max' else store.least_sql)(old, new)}")
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES", f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(merges)}"


def _write(store: SqlDialect, cursor: Any, table: str, key: Sequence[str], sums: Sequence[tuple[str, str]],
           buckets: dict[tuple[Any, ...], dict[str, Any]], *, tiered: bool = True) -> None:  # fmt: skip
    if not buckets:
        return
    rows = []
    for bucket_key in sorted(buckets):  # one order for every writer: no lock cycles between collectors
        values = buckets[bucket_key]
        if tiered:
            *labels, tier, start = bucket_key
            row = [*labels, tier, store.time_in(_at(start))]
        else:
            row = list(bucket_key)
        row += [store.time_in(_at(values[name])) if name in _TIME_SUMS else values.get(name) for name, _ in sums]
        rows.append(tuple(row))
    head, tail = _upsert_sql(store, table, key, sums)
    store.execute_rows(cursor, head, rows, tail)


def _write_spans(store: SqlDialect, cursor: Any, spans: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    _write(store, cursor, "device_bundles", ("fleet", "device", "bundle_id"), BUNDLE_SUMS,
           {key: values for key, values in spans.items()}, tiered=False)  # fmt: skip


#: Per-model marks a device keeps, those of its newest buckets: a device naming ever new models cannot grow its
#: device_latest row without bound (an agent serves at most 64 at a time). A dropped mark only means that an
#: out-of-order window of that model in that bucket counts its device there once more.
MAX_MODEL_MARKS = 512


def _trimmed(marks: dict[str, list[Any]]) -> dict[str, list[Any]]:
    model_keys = [key for key in marks if key.startswith("m")]
    if len(model_keys) <= MAX_MODEL_MARKS:
        return marks
    kept = set(sorted(model_keys, key=lambda key: marks[key][0], reverse=True)[:MAX_MODEL_MARKS])
    return {key: mark for key, mark in marks.items() if not key.startswith("m") or key in kept}


def _write_devices(store: SqlDialect, cursor: Any, changed: dict[tuple[str, str], _Device]) -> None:
    rows = [(d.windows, d.seq_min, d.seq_max, _time(store, d.received_at_max), _time(store, d.window_end_max), d.latest_seq,
             *d.latest, d.interval_s, json.dumps(_trimmed(d.marks), separators=(",", ":")), fleet_id, device_id)
            for (fleet_id, device_id), d in sorted(changed.items())]  # fmt: skip
    # the rows exist and are locked (_lock_devices): an upsert that replaces them writes a batch in a few statements
    sets = ", ".join(f"{column} = excluded.{column}" for column in DEVICE_COLUMNS)
    store.execute_rows(cursor, f"INSERT INTO device_latest ({', '.join(DEVICE_COLUMNS)}, fleet, device) VALUES", rows,
                       f"ON CONFLICT (fleet, device) DO UPDATE SET {sets}")  # fmt: skip


def _at(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, _UTC)


def _time(store: SqlDialect, epoch_s: float | None) -> Any:
    return None if epoch_s is None else store.time_in(_at(epoch_s))


def rollup_parts(rows: Iterable[Sequence[Any]], time_out: Any) -> list[Part]:
    """Old rollups (fleet, device, bundle, windows, inferences, errors, latency_count, p50_sum, p99_sum, p99_max_ms,
    power_s, power_mw_s, energy_mj, energy_active_mj, energy_count, temperature_max_c, window_start_min,
    window_end_max, seq_min, seq_max, received_at_max) as parts, for summing in history kept before version 7."""
    parts = []
    for r in rows:
        start, end = _epoch(time_out(r[16])), _epoch(time_out(r[17]))
        names = ("windows", "inferences", "errors", "latency_count", "p50_sum", "p99_sum", "p99_max_ms", "power_s",
                 "power_mw_s", "energy_mj", "energy_active_mj", "energy_count", "temperature_max_c")  # fmt: skip
        sums = dict(zip(names, r[3:16]))
        sums.update(devices=0, window_start_min=start, window_end_max=end)
        parts.append(Part(r[0], r[1], r[2] or "", start, end, sums, None, int(r[18]), int(r[19]),
                          _epoch(time_out(r[20]))))  # fmt: skip
    return parts


def model_history_parts(rows: Iterable[Sequence[Any]], time_out: Any) -> list[Part]:
    """Rows of :data:`edgekit.fleet.store.queries.SELECT_MODEL_HISTORY` as model-only parts."""
    parts = []
    for fleet_id, device, model, bundle, windows, inferences, errors, latency_count, p50_sum, p99_sum, p99_max, memory, \
            start_at, end_at in rows:  # fmt: skip
        start, end = _epoch(time_out(start_at)), _epoch(time_out(end_at))
        sums = {"devices": 0, "windows": windows, "inferences": inferences, "errors": errors, "latency_count": latency_count,
                "p50_sum": p50_sum, "p99_sum": p99_sum, "p99_max_ms": p99_max, "memory_mb_max": memory,
                "seconds": max(end - start, 0.001), "window_start_min": start, "window_end_max": end}  # fmt: skip
        parts.append(Part(fleet_id, device, bundle or "", start, end, {"windows": 0}, models=[(model, bundle or "", sums)],
                          device_wide=False))  # fmt: skip
    return parts


__all__ = ["FLEET_SUMS", "HOUR_DEVICES", "MODEL_SUMS", "Part", "TIERS", "bucket_start", "ingest", "model_history_parts", "rollup_parts", "window_part"]
