"""PostgreSQL: the per-device rollups partitioned by day, so that their retention drops whole partitions.

``telemetry_rollups`` and ``telemetry_model_rollups`` (what retention keeps of each device's raw windows, per
5-minute bucket) grow by about 2.9 million rows a day at 10,000 devices. They are declaratively partitioned by
``RANGE (bucket_start)``, one partition a UTC day (``telemetry_rollups_p20261127``); retention creates the
partitions of the days a batch has rows in before rolling it up, and :func:`drop_partitions_before` removes whole
days past the rollup retention instead of a DELETE that would scan and lock millions of rows. Buckets before
:data:`EARLY_BEFORE` (a device clock still at 1970, which ingest accepts) share one partition
(``telemetry_rollups_early``): a partition a day from 1970 would be some 20,000 tables, more than one
transaction can lock. Daily partitions are made only for the days around the collector's own clock
(:data:`RECENT_DAYS` back, :data:`AHEAD_DAYS` ahead); buckets of other days (a device offline for weeks, or one whose
broken clock gives another day for every window) go to one DEFAULT partition (``telemetry_rollups_default``), which
retention trims by DELETE, so a wrong clock never makes a table a window. When a day it holds comes into range its
rows move to that day's new partition.

Raw windows stay one table: their key (fleet, device, seq) has no time in it, so PostgreSQL could not keep it
unique across time partitions, and the dedup guarantee (a window stored once, whenever it comes again) rests on
it. They are kept only for the raw retention (an hour by default) and rolled up in short batches.

This is the native layout (it needs nothing but PostgreSQL 11+). Where the TimescaleDB extension is present
when a store is created, the same tables become hypertables instead (:mod:`edgekit.fleet.store.timescale`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Iterable

#: Partitioned tables: name -> primary key columns (the partition key, bucket_start, among them).
PARTITIONED: dict[str, tuple[str, ...]] = {
    "telemetry_rollups": ("fleet", "device", "bundle_id", "bucket_s", "bucket_start"),
    "telemetry_model_rollups": ("fleet", "device", "model", "bundle_id", "bucket_s", "bucket_start"),
}
#: Secondary indexes each partitioned table gets (name suffix -> columns).
INDEXES: dict[str, tuple[tuple[str, str], ...]] = {
    "telemetry_rollups": (("by_start", "bucket_start"), ("by_device_start", "fleet, device, bucket_start")),
    "telemetry_model_rollups": (("by_start", "bucket_start"), ("by_device_start", "fleet, device, bucket_start")),
}
#: Buckets before this all go into one partition, ``<table>_early`` (from MINVALUE): no real fleet's data is older.
EARLY_BEFORE = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
EARLY_SUFFIX = "_early"
#: Days with their own partition, around the collector's UTC day; other days from 2000 on share ``<table>_default``.
RECENT_DAYS = 7
AHEAD_DAYS = 2
DEFAULT_SUFFIX = "_default"
_DAY = dt.timedelta(days=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_PARTITION_RE = re.compile(r"_p(\d{8})$")


def _relkind(cursor: Any, table: str) -> str | None:
    cursor.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (table,))
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def partition_tables(cursor: Any) -> None:
    """Turn the rollup tables into daily-partitioned ones, moving their rows (idempotent: done tables are skipped)."""
    for table, key in PARTITIONED.items():
        if _relkind(cursor, table) in (None, "p"):
            continue
        old = f"{table}_unpartitioned"
        cursor.execute(f"ALTER TABLE {table} RENAME TO {old}")
        cursor.execute(f"ALTER TABLE {old} RENAME CONSTRAINT {table}_pkey TO {old}_pkey")
        for suffix, _ in INDEXES[table]:
            cursor.execute(f"DROP INDEX IF EXISTS {table}_{suffix}")
        cursor.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE (bucket_start)")
        cursor.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({', '.join(key)})")
        for suffix, columns in INDEXES[table]:
            cursor.execute(f"CREATE INDEX {table}_{suffix} ON {table} ({columns})")
        cursor.execute(f"SELECT DISTINCT {day_number_sql('bucket_start')} FROM {old}")
        ensure_partitions(cursor, table, [day_of_number(number) for (number,) in cursor.fetchall()])
        cursor.execute(f"INSERT INTO {table} SELECT * FROM {old}")
        cursor.execute(f"DROP TABLE {old}")


def _day(moment: dt.datetime) -> dt.datetime:
    moment = moment.astimezone(dt.timezone.utc)
    return dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.timezone.utc)


def day_number_sql(moment: str) -> str:
    """SQL for the UTC day (days since 1970-01-01) of the time expression ``moment``; :func:`day_of_number` reads it."""
    return f"CAST(floor(EXTRACT(EPOCH FROM {moment}) / 86400) AS BIGINT)"


def day_of_number(number: int) -> dt.datetime:
    """The UTC midnight of day ``number`` (as :func:`day_number_sql` gives it)."""
    return _EPOCH + int(number) * _DAY


def ensure_partitions(cursor: Any, table: str, moments: Iterable[dt.datetime], now: dt.datetime | None = None) -> None:
    """Create the partitions of ``table`` that hold ``moments`` if missing: the daily partition of each UTC day among
    them within :data:`RECENT_DAYS` before and :data:`AHEAD_DAYS` after ``now``'s (the collector's clock), the one
    default partition for the other days from :data:`EARLY_BEFORE` on, and the one early partition for those before;
    so a device with a wrong clock adds a partition or two, never one a window or one for every day in between."""
    today = _day(now or dt.datetime.now(dt.timezone.utc))
    early = default = False
    for day in sorted({_day(moment) for moment in moments}):
        if day < EARLY_BEFORE:
            early = True
        elif not today - RECENT_DAYS * _DAY <= day <= today + AHEAD_DAYS * _DAY:
            default = True
        elif _relkind(cursor, f"{table}_p{day:%Y%m%d}") is None:
            _create_day(cursor, table, day)
    if early:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {table}{EARLY_SUFFIX} PARTITION OF {table} "
                       f"FOR VALUES FROM (MINVALUE) TO ('{EARLY_BEFORE.isoformat()}')")  # fmt: skip
    if default:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {table}{DEFAULT_SUFFIX} PARTITION OF {table} DEFAULT")


def _create_day(cursor: Any, table: str, day: dt.datetime) -> None:
    """``table``'s partition of ``day``; the rows the default partition holds of that day move into it (PostgreSQL
    refuses a new partition whose range the default partition has rows in)."""
    name, bounds = f"{table}_p{day:%Y%m%d}", f"FROM ('{day.isoformat()}') TO ('{(day + _DAY).isoformat()}')"
    default = f"{table}{DEFAULT_SUFFIX}"
    in_day = f"bucket_start >= '{day.isoformat()}' AND bucket_start < '{(day + _DAY).isoformat()}'"
    if _relkind(cursor, default) is not None:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {default} WHERE {in_day})")
        row = cursor.fetchone()
        if row is not None and row[0]:
            cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)")
            cursor.execute(f"WITH moved AS (DELETE FROM {default} WHERE {in_day} RETURNING *) "
                           f"INSERT INTO {name} SELECT * FROM moved")
            cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}")
            return
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} FOR VALUES {bounds}")


def partitions(cursor: Any, table: str) -> list[tuple[str, dt.datetime]]:
    """``table``'s daily partitions (name, day), oldest first (not the early one)."""
    cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                   "WHERE i.inhparent = to_regclass(%s)", (table,))  # fmt: skip
    found = []
    for (name,) in cursor.fetchall():
        match = _PARTITION_RE.search(name)
        if match is not None:
            found.append((name, dt.datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=dt.timezone.utc)))
    return sorted(found, key=lambda item: item[1])


def drop_partitions_before(cursor: Any, table: str, before: dt.datetime) -> int:
    """Drop ``table``'s partitions whose whole day (or range, the early one) is before ``before``; returns how many."""
    dropped = 0
    if _relkind(cursor, f"{table}{DEFAULT_SUFFIX}") is not None:  # other days' rows: trimmed, the partition stays
        cursor.execute(f"DELETE FROM {table}{DEFAULT_SUFFIX} WHERE bucket_start < %s", (before,))
    if EARLY_BEFORE <= before and _relkind(cursor, f"{table}{EARLY_SUFFIX}") is not None:
        cursor.execute(f"DROP TABLE {table}{EARLY_SUFFIX}")
        dropped += 1
    for name, day in partitions(cursor, table):
        if day + _DAY <= before:
            cursor.execute(f"DROP TABLE {name}")
            dropped += 1
    return dropped


__all__ = ["AHEAD_DAYS", "DEFAULT_SUFFIX", "EARLY_BEFORE", "EARLY_SUFFIX", "PARTITIONED", "RECENT_DAYS", "day_number_sql",
           "day_of_number", "drop_partitions_before", "ensure_partitions", "partition_tables", "partitions"]
