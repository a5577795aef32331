"""PostgreSQL with TimescaleDB: the time-bucketed tables as hypertables and rollup retention as retention policies.

Detected when a :class:`~edgekit.fleet.store.postgres.PostgresStore` opens (:func:`detect`): the extension is used
when it is created in the database already, or when the server offers it (``pg_available_extensions``) and
``CREATE EXTENSION IF NOT EXISTS timescaledb`` succeeds (it needs ``shared_preload_libraries = 'timescaledb'`` and
a role allowed to create it). ``EDGEKIT_FLEET_TIMESCALEDB=off`` (or ``PostgresStore(url, timescaledb="off")``)
keeps the native layout even where the extension is there.

What changes on the TimescaleDB path (:data:`HYPERTABLES`):

- the per-device 5-minute rollups (``telemetry_rollups``, ``telemetry_model_rollups``) become hypertables with
  one-day chunks instead of daily declarative partitions, and rollup retention is a retention policy
  (``add_retention_policy``, run by TimescaleDB's background workers) plus ``drop_chunks`` when retention runs;
- the fleet 1-minute buckets (``fleet_buckets``, ``fleet_model_buckets``) become hypertables with one-day chunks,
  renamed ``fleet_minute_buckets`` / ``fleet_model_minute_buckets``, and the 1-hour tier becomes a continuous
  aggregate of them, read through views under the old names (:mod:`edgekit.fleet.store.timescale_aggregates`).

Unchanged, on purpose: raw windows stay a plain table, because their key (fleet, device, seq) has no time in it
and TimescaleDB, like native partitioning, can only keep a unique key that includes the time column; a key with
the window's start in it would store a second window with a seq already held (a device whose seqs start again
while the first is still raw), and the readers of raw windows (missing seqs, the rolled-seq runs) take a seq for
one window. Their retention is a roll-up anyway: every row is read and summed as it goes (one DELETE ... RETURNING,
which also keeps two collectors' retention from counting a window twice), so dropping chunks would add a pass,
not save one. Raw windows live an hour by default and are rolled up in short batches.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Any, NamedTuple

LOG = logging.getLogger("edgekit.fleet.store")
#: Environment variable that turns the TimescaleDB path off (``off``) or leaves it to detection (``auto``).
MODE_ENV = "EDGEKIT_FLEET_TIMESCALEDB"
MODES = ("auto", "off")
EXTENSION = "timescaledb"
#: Hypertables: table -> chunk interval (what one chunk holds; retention drops whole chunks).
HYPERTABLES: dict[str, str] = {
    "telemetry_rollups": "1 day",
    "telemetry_model_rollups": "1 day",
    "fleet_buckets": "1 day",  # the minute tier (timescale_aggregates renames it); the hour tier aggregates it
    "fleet_model_buckets": "1 day",
}
#: Hypertables whose retention is a retention policy (the per-device rollups; the rollup retention names them).
RETAINED_BY_POLICY = ("telemetry_rollups", "telemetry_model_rollups")
NATIVE = "native"
TIMESCALEDB = "timescaledb"


class Detection(NamedTuple):
    """What :func:`detect` found: ``path`` is :data:`TIMESCALEDB` or :data:`NATIVE`, ``reason`` says why, and
    ``schema`` is where the extension's functions live (None on the native path)."""

    path: str
    reason: str
    schema: str | None = None


def wanted_mode(mode: str | None = None) -> str:
    """``mode``, else :data:`MODE_ENV`, else ``auto``; refuses anything but :data:`MODES`."""
    from edgekit.fleet.errors import StoreError

    chosen = (mode if mode is not None else os.environ.get(MODE_ENV, "auto")).strip().lower()
    if chosen not in MODES:
        source = "timescaledb=" if mode is not None else f"environment variable {MODE_ENV}="
        raise StoreError(f"{source}{chosen!r} is not one of {', '.join(MODES)}",
                         hint=f"set {MODE_ENV}=off to keep the native PostgreSQL layout, or auto (the default)")  # fmt: skip
    return chosen


def extension_schema(cursor: Any) -> str | None:
    cursor.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                   "WHERE e.extname = %s", (EXTENSION,))  # fmt: skip
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def detect(cursor: Any, mode: str) -> Detection:
    """Which path the store takes, creating the extension when the server offers it and the store is new (in the
    open transaction; a refused CREATE EXTENSION is rolled back to a savepoint and the native path taken)."""
    if mode == "off":
        return Detection(NATIVE, f"TimescaleDB turned off ({MODE_ENV}=off)")
    schema = extension_schema(cursor)
    if schema is not None:
        return Detection(TIMESCALEDB, "extension timescaledb is created in this database", schema)
    cursor.execute("SELECT default_version FROM pg_available_extensions WHERE name = %s", (EXTENSION,))
    offered = cursor.fetchone()
    if offered is None:
        return Detection(NATIVE, "the server has no timescaledb extension installed (pg_available_extensions)")
    cursor.execute("SELECT current_setting('shared_preload_libraries')")
    if EXTENSION not in [name.strip().strip('"') for name in str(cursor.fetchone()[0]).split(",")]:
        return Detection(NATIVE, f"the server offers timescaledb {offered[0]} but does not preload it "
                                 "(shared_preload_libraries = 'timescaledb' and a restart would enable it)")  # fmt: skip
    if to_regclass(cursor, "telemetry_rollups"):
        return Detection(NATIVE, f"the server offers timescaledb {offered[0]}, but this store was laid out natively "
                                 "before; the extension is not created for it")  # fmt: skip
    cursor.execute("SAVEPOINT edgekit_timescaledb")
    try:
        cursor.execute(f"CREATE EXTENSION IF NOT EXISTS {EXTENSION}")
    except Exception as exc:  # noqa: BLE001 - any refusal (not preloaded, no privilege) means the native path
        cursor.execute("ROLLBACK TO SAVEPOINT edgekit_timescaledb")
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Detection(NATIVE, f"CREATE EXTENSION timescaledb {offered[0]} was refused: {first_line}")
    cursor.execute("RELEASE SAVEPOINT edgekit_timescaledb")
    return Detection(TIMESCALEDB, f"created extension timescaledb {offered[0]}", extension_schema(cursor))


def to_regclass(cursor: Any, table: str) -> bool:
    """Whether ``table`` exists (on the search path)."""
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
    return bool(cursor.fetchone()[0])


def is_hypertable(cursor: Any, table: str) -> bool:
    """Whether ``table`` (in the current schema) is a hypertable; False where the extension is not created."""
    if extension_schema(cursor) is None:
        return False
    cursor.execute("SELECT 1 FROM timescaledb_information.hypertables "
                   "WHERE hypertable_schema = current_schema() AND hypertable_name = %s", (table,))  # fmt: skip
    return cursor.fetchone() is not None


def make_hypertables(cursor: Any, schema: str) -> list[str]:
    """Turn the plain :data:`HYPERTABLES` into hypertables, moving their rows; returns those turned. A table that
    is natively partitioned already (a store laid out before the extension came) is left as it is."""
    turned = []
    for table, interval in HYPERTABLES.items():
        cursor.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (table,))
        row = cursor.fetchone()
        if row is None or str(row[0]) != "r" or is_hypertable(cursor, table):
            continue
        cursor.execute(f"SELECT {schema}.create_hypertable(%s::regclass, 'bucket_start', "
                       f"chunk_time_interval => INTERVAL '{interval}', migrate_data => true)", (table,))  # fmt: skip
        turned.append(table)
    return turned


def drop_chunks_before(cursor: Any, schema: str, table: str, before: dt.datetime) -> int:
    """Drop ``table``'s chunks whose whole time range is before ``before``; returns how many."""
    cursor.execute(f"SELECT {schema}.drop_chunks(%s::regclass, older_than => %s)", (table, before))
    return len(cursor.fetchall())


def ensure_retention_policy(cursor: Any, schema: str, table: str, keep_for: dt.timedelta) -> None:
    """A retention policy on ``table`` dropping chunks older than ``keep_for`` (replaced when it differs)."""
    cursor.execute("SELECT job_id, config ->> 'drop_after' FROM timescaledb_information.jobs "
                   "WHERE proc_name = 'policy_retention' AND hypertable_schema = current_schema() "
                   "AND hypertable_name = %s", (table,))  # fmt: skip
    found = cursor.fetchall()
    want = f"{int(keep_for.total_seconds())} seconds"
    if found:
        cursor.execute("SELECT %s::interval = %s::interval", (found[0][1], want))
        if cursor.fetchone()[0]:
            return
        cursor.execute(f"SELECT {schema}.remove_retention_policy(%s::regclass)", (table,))
    cursor.execute(f"SELECT {schema}.add_retention_policy(%s::regclass, drop_after => %s::interval)", (table, want))


def retention_policies(cursor: Any) -> dict[str, str]:
    """The retention policies on this schema's hypertables: table -> drop_after (as TimescaleDB shows it)."""
    if extension_schema(cursor) is None:
        return {}
    cursor.execute("SELECT hypertable_name, config ->> 'drop_after' FROM timescaledb_information.jobs "
                   "WHERE proc_name = 'policy_retention' AND hypertable_schema = current_schema()")  # fmt: skip
    return {str(table): str(drop_after) for table, drop_after in cursor.fetchall()}


def log_path(url: str, detection: Detection, layout: str) -> None:
    """Say which path the store took, and why, once when it opens."""
    if layout == detection.path:
        LOG.info("fleet store %s: %s layout (%s)", url, layout, detection.reason)
    else:
        LOG.info("fleet store %s: %s layout, kept from when the store was created (%s)", url, layout, detection.reason)


__all__ = ["Detection", "HYPERTABLES", "extension_schema", "MODE_ENV", "MODES", "NATIVE", "RETAINED_BY_POLICY", "TIMESCALEDB", "detect",
           "drop_chunks_before", "ensure_retention_policy", "is_hypertable", "log_path", "make_hypertables",
           "retention_policies", "wanted_mode"]
