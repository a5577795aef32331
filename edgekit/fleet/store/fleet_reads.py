"""Fleet-wide reads over the aggregates kept at ingest (``fleet_buckets``, ``fleet_model_buckets``).

A read picks its rows by time: with a bucket length, the 1-hour tier when the length is whole hours, else the
1-minute tier; without one (totals over a range), whole hours inside the range from the hour tier and the
partial hours at its ends from the minute tier, so a 7-day report reads a few thousand rows, not millions of
windows. A bucket belongs to a range when it starts in it (a range's start is taken back to its minute), as
rolled-up buckets always have.

``devices`` is the peak number of devices reporting in one bucket of the tier read (a minute, or an hour), not
the distinct devices over a row's span: each stored bucket counts its distinct devices per group (fleet, bundle,
target, power mode) as windows arrive, a row takes the most of its buckets, and groups a read merges are summed.
So it is the fleet's size only for a fleet whose every device reports at least once a bucket; a fleet reporting
every 5 minutes shows about a fifth of its devices on the minute tier, and a device that changed group within a
bucket (a rollout) counts once per group there. Exact distinct counts come from the per-device reads (``devices=``).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from edgekit.fleet.store.base import ModelAggregate
from edgekit.fleet.store.buckets import TIERS, bucket_start

if TYPE_CHECKING:
    from edgekit.fleet.store.dialect import SqlDialect

    class ReadingStore(SqlDialect, Protocol):
        """A SQL store that reads (:class:`edgekit.fleet.store.sql.SqlFleetStore`, named by protocol: it imports us)."""

        def _query(self, doing: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]: ...

MINUTE, HOUR = TIERS
_UTC = dt.timezone.utc

#: Aggregate key -> column of fleet_buckets ('' kept for none; shown as NULL).
FLEET_KEY_COLUMNS = {"fleet": "b.fleet", "device": "NULL", "bundle_id": "NULLIF(b.bundle_id, '')",
                     "target": "NULLIF(b.target, '')", "power_mode": "NULLIF(b.power_mode, '')"}  # fmt: skip
MODEL_KEY_COLUMNS = {"fleet": "b.fleet", "device": "NULL", "model": "b.model", "bundle_id": "b.bundle_id"}

_FLEET_INNER = """SUM(b.devices) AS devices, SUM(b.windows) AS windows, SUM(b.inferences) AS inferences,
    SUM(b.errors) AS errors, SUM(b.latency_count) AS latency_count, SUM(b.p50_sum) AS p50_sum, SUM(b.p99_sum) AS p99_sum,
    MAX(b.p99_max_ms) AS p99_max_ms, SUM(b.power_s) AS power_s, SUM(b.power_mw_s) AS power_mw_s, SUM(b.energy_mj) AS energy_mj,
    SUM(b.energy_active_mj) AS energy_active_mj, SUM(b.energy_count) AS energy_count,
    MAX(b.temperature_max_c) AS temperature_max_c, MIN(b.window_start_min) AS t_start, MAX(b.window_end_max) AS t_end"""
_FLEET_OUTER = """MAX(u.devices), SUM(u.windows), SUM(u.inferences), SUM(u.errors),
    SUM(u.p50_sum) / NULLIF(SUM(u.latency_count), 0), SUM(u.p99_sum) / NULLIF(SUM(u.latency_count), 0), MAX(u.p99_max_ms),
    SUM(u.power_mw_s) / NULLIF(SUM(u.power_s), 0), SUM(u.energy_mj), SUM(u.energy_active_mj) / NULLIF(SUM(u.energy_count), 0),
    MAX(u.temperature_max_c), MIN(u.t_start), MAX(u.t_end)"""
_MODEL_INNER = """SUM(b.devices) AS devices, SUM(b.windows) AS windows, SUM(b.inferences) AS inferences,
    SUM(b.errors) AS errors, SUM(b.latency_count) AS latency_count, SUM(b.p50_sum) AS p50_sum, SUM(b.p99_sum) AS p99_sum,
    MAX(b.p99_max_ms) AS p99_max_ms, MAX(b.memory_mb_max) AS memory_mb_max, SUM(b.seconds) AS seconds,
    MIN(b.window_start_min) AS t_start, MAX(b.window_end_max) AS t_end"""
_MODEL_OUTER = """MAX(u.devices), SUM(u.windows), SUM(u.inferences), SUM(u.errors),
    SUM(u.p50_sum) / NULLIF(SUM(u.latency_count), 0), SUM(u.p99_sum) / NULLIF(SUM(u.latency_count), 0), MAX(u.p99_max_ms),
    SUM(u.inferences) / NULLIF(SUM(u.seconds), 0), MAX(u.memory_mb_max), MIN(u.t_start), MAX(u.t_end)"""


def serves(keys: Sequence[str], devices: Sequence[tuple[str, str]] | None, bucket_s: int | None) -> bool:
    """Whether a read can come from the fleet aggregates: no device in it, buckets no shorter than a minute."""
    return devices is None and "device" not in keys and (bucket_s is None or bucket_s >= MINUTE)


def _at(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, _UTC)


def time_ranges(since: dt.datetime | None, until: dt.datetime | None,
                bucket_s: int | None) -> list[tuple[int, dt.datetime | None, dt.datetime | None]]:  # fmt: skip
    """(tier, first bucket start, end) pieces covering [since, until): bucket starts in [first, end)."""
    low = _at(bucket_start(since.timestamp(), MINUTE)) if since is not None else None
    if bucket_s is not None:
        return [(HOUR if bucket_s % HOUR == 0 else MINUTE, low, until)]
    first_hour = _at(-(-since.timestamp() // HOUR) * HOUR) if since is not None else None
    last_hour = _at(bucket_start(until.timestamp(), HOUR)) if until is not None else None
    if first_hour is not None and last_hour is not None and first_hour >= last_hour:
        return [(MINUTE, low, until)]
    pieces: list[tuple[int, dt.datetime | None, dt.datetime | None]] = [(HOUR, first_hour, last_hour)]
    if since is not None and low is not None and first_hour is not None and low < first_hour:
        pieces.append((MINUTE, low, first_hour))
    if until is not None and last_hour is not None and last_hour < until:
        pieces.append((MINUTE, last_hour, until))
    return pieces


def _time_where(store: SqlDialect, params: dict[str, Any], pieces: Sequence[tuple[int, Any, Any]]) -> str:
    clauses = []
    for index, (tier, low, high) in enumerate(pieces):
        parts = [f"b.bucket_s = {int(tier)}"]
        if low is not None:
            params[f"piece_low_{index}"] = store.time_in(low)
            parts.append(f"b.bucket_start >= :piece_low_{index}")
        if high is not None:
            params[f"piece_high_{index}"] = store.time_in(high)
            parts.append(f"b.bucket_start < :piece_high_{index}")
        clauses.append("(" + " AND ".join(parts) + ")")
    return "(" + " OR ".join(clauses) + ")"


def _grouped(store: SqlDialect, table: str, key_columns: dict[str, str], keys: Sequence[str], inner: str, outer: str,
             where: str, params: dict[str, Any], bucket_s: int | None) -> str:  # fmt: skip
    selected = [key_columns[key] if key in keys else "NULL" for key in key_columns]
    inner_keys = [f"{column} AS k{index}" for index, column in enumerate(selected)]
    outer_keys = [f"u.k{index}" if key in keys else "NULL" for index, key in enumerate(key_columns)]
    groups = [str(index + 1) for index, key in enumerate(key_columns) if key in keys]
    if bucket_s is not None:
        params["agg_bucket_s"] = bucket_s
        outer_keys.append(store.bucket_sql("u.bucket_start", "agg_bucket_s"))
        groups.append(str(len(key_columns) + 1))
    else:
        outer_keys.append("NULL")
    inner_groups = ", ".join([str(index + 1) for index, key in enumerate(key_columns) if key in keys] + [str(len(key_columns) + 1)])
    group_by = f"GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}" if groups else ""
    return f"""SELECT {', '.join(outer_keys)}, {outer} FROM (
    SELECT {', '.join(inner_keys)}, b.bucket_start AS bucket_start, {inner}
    FROM {table} b WHERE {where} GROUP BY {inner_groups}
) u {group_by}"""


def fleet_aggregate_sql(store: SqlDialect, keys: Sequence[str], params: dict[str, Any], *, fleet: str | None,
                        bundle_id: str | None, target: str | None, since: dt.datetime | None, until: dt.datetime | None,
                        bucket_s: int | None) -> str:  # fmt: skip
    """Rows as :func:`edgekit.fleet.store.queries.aggregate_sql` returns them, from fleet_buckets."""
    where = [_time_where(store, params, time_ranges(since, until, bucket_s))]
    for column, value in (("fleet", fleet), ("bundle_id", bundle_id), ("target", target)):
        if value is not None:
            where.append(f"b.{column} = :{column}")
            params[column] = value
    return _grouped(store, "fleet_buckets", FLEET_KEY_COLUMNS, keys, _FLEET_INNER, _FLEET_OUTER, " AND ".join(where),
                    params, bucket_s)  # fmt: skip


def model_aggregate_sql(store: SqlDialect, keys: Sequence[str], params: dict[str, Any], *, fleet: str | None,
                        model: str | None, since: dt.datetime | None, until: dt.datetime | None,
                        bucket_s: int | None) -> str:  # fmt: skip
    """Rows as :func:`edgekit.fleet.store.queries.model_aggregate_sql` returns them, from fleet_model_buckets."""
    where = [_time_where(store, params, time_ranges(since, until, bucket_s))]
    for column, value in (("fleet", fleet), ("model", model)):
        if value is not None:
            where.append(f"b.{column} = :{column}")
            params[column] = value
    return _grouped(store, "fleet_model_buckets", MODEL_KEY_COLUMNS, keys, _MODEL_INNER, _MODEL_OUTER, " AND ".join(where),
                    params, bucket_s)  # fmt: skip


#: The longest window ingest accepts (edgekit.fleet.ingest.MAX_WINDOW): a window ending now started at most this long ago.
LONGEST_WINDOW = dt.timedelta(days=1)


def recent_model_aggregate(store: ReadingStore, *, fleet: str | None, ended_since: dt.datetime,
                           now: dt.datetime | None = None) -> list[ModelAggregate]:  # fmt: skip
    """Per (fleet, model, bundle), the minute buckets holding a window that ended at ``ended_since`` or later (the
    metrics server's per-model series): picked by ``window_end_max``, not by the bucket's start, so a device sending
    5-minute windows is not left out because its windows start more than the lookback ago. The buckets' start is
    bounded by the longest window ingest accepts, which keeps the read on the primary key's range
    (bucket_s, bucket_start, ...): a day of minute buckets per (fleet, model, bundle), whatever the fleet's size."""
    keys = ("fleet", "model", "bundle_id")
    now = now or dt.datetime.now(_UTC)
    params: dict[str, Any] = {"recent_low": store.time_in(_at(bucket_start((now - LONGEST_WINDOW).timestamp(), MINUTE))),
                              "recent_end": store.time_in(ended_since)}  # fmt: skip
    where = [f"b.bucket_s = {int(MINUTE)}", "b.bucket_start >= :recent_low", "b.window_end_max >= :recent_end"]
    if fleet is not None:
        where.append("b.fleet = :fleet")
        params["fleet"] = fleet
    sql = _grouped(store, "fleet_model_buckets", MODEL_KEY_COLUMNS, keys, _MODEL_INNER, _MODEL_OUTER, " AND ".join(where),
                   params, None)  # fmt: skip
    found = []
    for row in store._query("reading the recent per-model aggregates", sql, params):
        figures = row[len(MODEL_KEY_COLUMNS) + 1:]
        if not figures[1]:
            continue
        found.append(ModelAggregate(
            fleet=row[0], device=None, model=row[2] or None, bundle_id=row[3] or None, bucket_start=None,
            devices=int(figures[0]), windows=int(figures[1]), inferences=int(figures[2]), errors=int(figures[3]),
            p50_ms=_number(figures[4]), p99_ms=_number(figures[5]), p99_max_ms=_number(figures[6]),
            throughput_per_s=_number(figures[7]), memory_mb_max=_number(figures[8]),
            first_window_start=store.time_out(figures[9]) if figures[9] is not None else None,
            last_window_end=store.time_out(figures[10]) if figures[10] is not None else None,
        ))  # fmt: skip
    return found


def _number(value: Any) -> float | None:
    return float(value) if value is not None else None


__all__ = ["fleet_aggregate_sql", "model_aggregate_sql", "recent_model_aggregate", "serves", "time_ranges"]
