"""TimescaleDB continuous aggregates: the fleet hour tier computed by the server from the minute tier.

On the native layout, ingest writes every window's sums into two tiers of ``fleet_buckets`` and
``fleet_model_buckets`` (``bucket_s`` 60 and 3600). On a store created on TimescaleDB (:func:`create`):

- ingest writes the minute tier only, into the hypertables ``fleet_minute_buckets`` / ``fleet_model_minute_buckets``
  (one-day chunks, :data:`edgekit.fleet.store.timescale.HYPERTABLES`);
- the hour tier is a continuous aggregate of the minute tier (``fleet_hour_buckets`` / ``fleet_model_hour_buckets``):
  every column of a bucket merges by SUM, MIN or MAX, so an hour is its minutes merged. The one that does not is the
  number of distinct devices; each minute carries ``hour_devices`` (the devices whose first window in the hour fell
  in that minute, counted at ingest like ``devices``) and the hour's ``devices`` is their SUM. Percentiles are kept
  as sums (``p50_sum``, ``p99_sum`` over ``latency_count``) and maxima, so nothing needs a sketch to merge;
- ``fleet_buckets`` and ``fleet_model_buckets`` are views (minute rows UNION ALL the aggregate's hour rows, with
  ``bucket_s`` 3600), so every read runs the same SQL as on the native layout and gives the same answer;
- the aggregates use real-time aggregation (``materialized_only = false``): hours past the watermark are computed
  from the minute rows at read time, so a read never waits for a refresh. A refresh policy
  (``add_continuous_aggregate_policy``) materializes finished hours every :data:`SCHEDULE` in the background;
  the store refreshes an hour at once when a late window lands below the watermark (:func:`refresh_late`), and
  before retention drops minute rows (:func:`refresh_before_drop`), so the hour tier outlives its minutes as it
  does natively.

Retention of the minute tier drops its chunks and hides the minutes before the retention cut from the reads
(:data:`HORIZON`), instead of deleting rows: TimescaleDB takes a DELETE for a change and would empty those hours
at their next refresh. Nothing refreshes hours whose chunks are gone: the store's refreshes start where the kept
chunks start, and with a rollup retention the policy's ``start_offset`` is the retention less an hour
(:func:`ensure_refresh_policy`). A window arriving later than the rollup retention is therefore counted in neither
tier (the native layout adds it to its hour).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from edgekit.fleet.store.buckets import FLEET_KEY, FLEET_SUMS, HOUR_DEVICES, MODEL_KEY, MODEL_SUMS

#: view the reads use -> (minute hypertable ingest writes, hour continuous aggregate, its key, its sums)
TIERED: dict[str, tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "fleet_buckets": ("fleet_minute_buckets", "fleet_hour_buckets", FLEET_KEY, FLEET_SUMS + HOUR_DEVICES),
    "fleet_model_buckets": ("fleet_model_minute_buckets", "fleet_model_hour_buckets", MODEL_KEY, MODEL_SUMS + HOUR_DEVICES),
}
#: One row: minute buckets before ``hidden_before`` are gone for the reads (retention, as the native DELETE), and
#: minute rows from ``complete_from`` on are all still there (no chunk of theirs dropped), so hours from there may be
#: recomputed. NULL: nothing dropped yet.
HORIZON = "fleet_minute_horizon"
#: How often the refresh policy materializes finished hours; hours newer than END_OFFSET are left to real time.
SCHEDULE = dt.timedelta(minutes=10)
END_OFFSET = dt.timedelta(hours=1)
_HOUR = dt.timedelta(hours=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_YEAR_1_US = -62_135_596_800_000_000
#: The smallest policy window TimescaleDB takes: start_offset - end_offset must cover two buckets.
_MIN_START_OFFSET = END_OFFSET + 2 * _HOUR
#: The refresh policies of this schema's continuous aggregates: (view, start_offset), from TimescaleDB's catalog.
_POLICIES_SQL = ("SELECT c.user_view_name, j.config ->> 'start_offset' FROM _timescaledb_config.bgw_job j "
                 "JOIN _timescaledb_catalog.continuous_agg c ON c.mat_hypertable_id = j.hypertable_id "
                 "WHERE j.proc_name = 'policy_refresh_continuous_aggregate' AND c.user_view_schema = current_schema()")
_AGGREGATE_SQL = {"sum": "SUM({c})", "nullable_sum": "SUM({c})", "max": "MAX({c})", "min": "MIN({c})"}
_BIGINT_SUMS = {"devices", "windows", "inferences", "errors", "latency_count", "energy_count", "hour_devices"}


def present(cursor: Any) -> bool:
    """Whether this store keeps its hour tier as continuous aggregates."""
    cursor.execute("SELECT to_regclass('fleet_hour_buckets') IS NOT NULL")
    return bool(cursor.fetchone()[0])


def hour_view_sql(schema: str, minute: str, hour: str, key: tuple[str, ...], sums: tuple[tuple[str, str], ...]) -> str:
    """CREATE MATERIALIZED VIEW of the hour tier over ``minute``."""
    labels = [column for column in key if column not in ("bucket_s", "bucket_start")]
    columns = []
    for name, how in sums:
        source = "hour_devices" if name == "devices" else name  # an hour's devices: its minutes' first-in-hour counts
        if name == "hour_devices":
            continue
        expression = _AGGREGATE_SQL[how].format(c=source)
        columns.append(f"{expression}::BIGINT AS {name}" if name in _BIGINT_SUMS else f"{expression} AS {name}")
    bucket = f"{schema}.time_bucket(INTERVAL '1 hour', bucket_start)"
    return (f"CREATE MATERIALIZED VIEW {hour} WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS "
            f"SELECT {', '.join(labels)}, {bucket} AS bucket_start, {', '.join(columns)} FROM {minute} "
            f"GROUP BY {', '.join(labels)}, {bucket} WITH NO DATA")  # fmt: skip


def tiers_view_sql(view: str, minute: str, hour: str, key: tuple[str, ...], sums: tuple[tuple[str, str], ...]) -> str:
    """CREATE VIEW ``view``: the minute rows and the hour aggregate's rows, in the native table's columns."""
    names = [*key, *(name for name, _ in sums)]
    hour_columns = ["3600 AS bucket_s" if name == "bucket_s" else "devices AS hour_devices" if name == "hour_devices" else name
                    for name in names]  # fmt: skip
    return (f"CREATE VIEW {view} AS SELECT {', '.join(names)} FROM {minute} WHERE bucket_s = 60 AND bucket_start >= "
            f"COALESCE((SELECT hidden_before FROM {HORIZON}), '-infinity') "
            f"UNION ALL SELECT {', '.join(hour_columns)} FROM {hour}")  # fmt: skip


def create(cursor: Any, schema: str) -> bool:
    """Turn the (hypertable) ``fleet_buckets`` / ``fleet_model_buckets`` of a store with no buckets yet into minute
    hypertables, hour continuous aggregates and the views the reads use, with refresh policies; returns whether it
    did. A store that holds buckets already keeps writing both tiers itself (they cannot be moved into an aggregate)."""
    for view in TIERED:
        cursor.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (view,))
        row = cursor.fetchone()
        if row is None or str(row[0]) != "r":
            return False
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {view})")
        if cursor.fetchone()[0]:
            return False
    cursor.execute(f"CREATE TABLE {HORIZON} (hidden_before TIMESTAMPTZ, complete_from TIMESTAMPTZ)")
    cursor.execute(f"INSERT INTO {HORIZON} VALUES (NULL, NULL)")
    for view, (minute, hour, key, sums) in TIERED.items():
        cursor.execute(f"ALTER TABLE {view} RENAME TO {minute}")
        cursor.execute(f"ALTER TABLE {minute} ADD COLUMN hour_devices BIGINT NOT NULL DEFAULT 0")
        cursor.execute(hour_view_sql(schema, minute, hour, key, sums))
        cursor.execute(tiers_view_sql(view, minute, hour, key, sums))
        ensure_refresh_policy(cursor, schema, hour, None)
    return True


def ensure_refresh_policy(cursor: Any, schema: str, hour: str, start_offset: dt.timedelta | None) -> None:
    """The refresh policy of ``hour``: every :data:`SCHEDULE`, hours from ``start_offset`` ago (None: all) to
    :data:`END_OFFSET` ago. Replaced when it differs; removed when ``start_offset`` is shorter than TimescaleDB
    takes (then only the store's own refreshes materialize, and real-time aggregation covers the rest)."""
    cursor.execute(f"{_POLICIES_SQL} AND c.user_view_name = %s", (hour,))
    found = [row[1:] for row in cursor.fetchall()]
    usable = start_offset is None or start_offset >= _MIN_START_OFFSET
    want = None if start_offset is None else f"{int(start_offset.total_seconds())} seconds"
    if found and usable:
        cursor.execute("SELECT %s::interval IS NOT DISTINCT FROM %s::interval", (found[0][0], want))
        if cursor.fetchone()[0]:
            return
    if found:
        cursor.execute(f"SELECT {schema}.remove_continuous_aggregate_policy(%s::regclass)", (hour,))
    if usable:
        cursor.execute(f"SELECT {schema}.add_continuous_aggregate_policy(%s::regclass, start_offset => %s::interval, "
                       "end_offset => %s::interval, schedule_interval => %s::interval)",
                       (hour, want, END_OFFSET, SCHEDULE))  # fmt: skip


def refresh_policies(cursor: Any) -> dict[str, str | None]:
    """The refresh policies on this schema's hour aggregates: view -> start_offset (None: all history)."""
    cursor.execute(_POLICIES_SQL)
    return {str(view): (None if offset is None else str(offset)) for view, offset in cursor.fetchall()}


def watermark(cursor: Any) -> dt.datetime | None:
    """The earliest watermark of the hour aggregates (hours before it are materialized); None before any refresh."""
    cursor.execute("SELECT MIN(_timescaledb_functions.cagg_watermark(c.mat_hypertable_id)) "
                   "FROM _timescaledb_catalog.continuous_agg c WHERE c.user_view_schema = current_schema() "
                   "AND c.user_view_name IN ('fleet_hour_buckets', 'fleet_model_hour_buckets')")  # fmt: skip
    found = cursor.fetchone()[0]  # microseconds since 1970; an aggregate never refreshed has the smallest time
    if found is None or found < _YEAR_1_US:
        return None
    return _EPOCH + dt.timedelta(microseconds=int(found))


def horizon(cursor: Any) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(hidden_before, complete_from) of :data:`HORIZON`."""
    cursor.execute(f"SELECT hidden_before, complete_from FROM {HORIZON}")
    hidden, complete = cursor.fetchone()
    return (None if hidden is None else hidden.astimezone(dt.timezone.utc),
            None if complete is None else complete.astimezone(dt.timezone.utc))  # fmt: skip


def drop_minutes_before(cursor: Any, schema: str, before: dt.datetime) -> None:
    """Retention of the minute tier, in the open transaction: drop the minute chunks wholly before ``before`` and
    hide the rest of them from the reads (no DELETE: a deleted minute would be taken for a change and empty its
    hour at the next refresh). Refresh the hours first (:func:`refresh`, up to :func:`ceil_hour` of ``before``)."""
    minutes = [tiers[0] for tiers in TIERED.values()]
    for minute in minutes:
        cursor.execute(f"SELECT {schema}.drop_chunks(%s::regclass, older_than => %s)", (minute, before))
        cursor.fetchall()
    cursor.execute("SELECT MIN(range_start) FROM timescaledb_information.chunks WHERE hypertable_schema = current_schema() "
                   "AND hypertable_name = ANY(%s)", (minutes,))  # fmt: skip
    oldest_kept = cursor.fetchone()[0]
    cursor.execute(f"UPDATE {HORIZON} SET hidden_before = GREATEST(hidden_before, %s), "
                   "complete_from = GREATEST(complete_from, %s)", (before, oldest_kept if oldest_kept is not None else before))  # fmt: skip


def refresh(cursor: Any, schema: str, start: dt.datetime | None, end: dt.datetime | None) -> None:
    """Materialize the hours from ``start`` to ``end`` (None: open) of both aggregates, outside any transaction."""
    for _, hour, _, _ in TIERED.values():
        cursor.execute(f"CALL {schema}.refresh_continuous_aggregate(%s::regclass, %s::timestamptz, %s::timestamptz)",
                       (hour, start, end))  # fmt: skip


def floor_hour(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: dt.datetime) -> dt.datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + _HOUR


def late_range(earliest: dt.datetime, latest: dt.datetime, mark: dt.datetime | None,
               complete_from: dt.datetime | None) -> tuple[dt.datetime, dt.datetime] | None:  # fmt: skip
    """The hours to refresh after windows starting ``earliest``..``latest`` were written: those materialized already
    (before ``mark``, the watermark) whose minutes are all kept (from ``complete_from``); None if none."""
    if mark is None or earliest >= mark:
        return None
    start = floor_hour(earliest) if complete_from is None else max(floor_hour(earliest), ceil_hour(complete_from))
    end = min(mark, floor_hour(latest) + _HOUR)
    return (start, end) if start < end else None


__all__ = ["END_OFFSET", "HORIZON", "SCHEDULE", "TIERED", "ceil_hour", "create", "ensure_refresh_policy", "floor_hour",
           "drop_minutes_before", "horizon", "hour_view_sql", "late_range", "present", "refresh", "refresh_policies", "tiers_view_sql", "watermark"]
