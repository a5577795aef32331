"""The scale-out store: PostgreSQL (or TimescaleDB) through psycopg 3, shared by several collectors.

Times are ``timestamptz``, payloads ``jsonb``. Inserts use ``ON CONFLICT DO NOTHING`` on the
(fleet, device, seq) key, so two collectors writing the same redelivered window store it once.
The connection URL is libpq's (``postgresql://user@host:5432/db?options=-csearch_path%3Dfleet``);
a lost connection is reopened on the next call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from functools import lru_cache
from typing import Any, Callable, Sequence

from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.store import partitions, queries, timescale
from edgekit.fleet.store import timescale_aggregates as aggregates
from edgekit.fleet.store.base import TelemetryWindow
from edgekit.fleet.store.retention import DEFAULT_GAPS_OPEN_FOR, ROLLUP_TABLES
from edgekit.fleet.store.sql import SeqRun, SqlFleetStore, named_to_pyformat
from edgekit.fleet.store.urls import redact

CONNECT_TIMEOUT_S = 10
_ROLLED_COLUMNS = ("fleet, device, seq, bundle_id, window_start, window_end, received_at, inferences, errors, p50_ms, "
                   "p90_ms, p99_ms, mean_ms, max_ms, power_mean_mw, power_max_mw, energy_mj, temperature_max_c, "
                   "memory_used_mb")  # fmt: skip
#: Rows per multi-row statement when writing a batch (one statement text for every whole chunk: parsed once).
ROWS_PER_STATEMENT = 50
#: Session-level advisory lock key that serialises migrations of one database ("edgekit" in ASCII).
MIGRATION_LOCK_KEY = 0x6564_6765_6B69_74
#: Transaction-level advisory lock key between window inserts (shared) and retention (exclusive): "rolled".
ROLLED_SEQS_LOCK_KEY = 0x726F_6C6C_6564


class PostgresStore(SqlFleetStore):
    """``PostgresStore("postgresql://...")``; the schema is migrated on open."""

    ROLLUP_TABLES = ROLLUP_TABLES
    dialect = "postgres"
    lock_rows_sql = " FOR UPDATE"
    multi_row_values = False  # psycopg pipelines executemany; parsing a 10,000-parameter statement costs more
    text_order_sql = ' COLLATE "C"'  # device tables sort names by code point, as Python does, whatever the locale

    def _execute_each_row(self, cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str, *,
                          returning: bool) -> list[tuple[Any, ...]]:  # fmt: skip
        # Whole chunks of ROWS_PER_STATEMENT rows as one statement whose text repeats (the server prepares it once),
        # the rest a statement a row, pipelined. The statements are written with $n placeholders and run through a
        # RawCursor: psycopg caches its %s-to-$n conversion only for statements of at most 50 parameters, and
        # converting a 50-row statement again on every call cost about a third of the collector's writing.
        if not hasattr(self._psycopg, "RawCursor"):  # psycopg 3.1
            return self._execute_chunks(cursor, rows, returning, lambda width, count: self._sql(
                f"{head} {', '.join(['(' + ', '.join('?' * width) + ')'] * count)} {tail}"))  # fmt: skip
        with self._psycopg.RawCursor(cursor.connection) as raw:
            return self._execute_chunks(raw, rows, returning, lambda width, count: _numbered_rows_sql(head, tail, width, count))  # fmt: skip

    def _execute_chunks(self, cursor: Any, rows: Sequence[Sequence[Any]], returning: bool,
                        statement: Callable[[int, int], str]) -> list[tuple[Any, ...]]:  # fmt: skip
        """``rows`` through ``statement(width, rows per statement)``: whole chunks, then the rest a row a statement."""
        found: list[tuple[Any, ...]] = []
        whole = len(rows) - len(rows) % ROWS_PER_STATEMENT
        width = len(rows[0])
        if whole:
            chunks = [[value for row in rows[first : first + ROWS_PER_STATEMENT] for value in row]
                      for first in range(0, whole, ROWS_PER_STATEMENT)]  # fmt: skip
            found += self._executemany(cursor, statement(width, ROWS_PER_STATEMENT), chunks, returning)
        if whole < len(rows):
            found += self._executemany(cursor, statement(width, 1), rows[whole:], returning)
        return found

    @staticmethod
    def _executemany(cursor: Any, sql: str, params: Sequence[Sequence[Any]], returning: bool) -> list[tuple[Any, ...]]:
        cursor.executemany(sql, params, returning=returning)
        found: list[tuple[Any, ...]] = []
        while returning:
            found.extend(cursor.fetchall())
            if not cursor.nextset():
                break
        return found

    def __init__(self, url: str, *, timescaledb: str | None = None) -> None:
        """``timescaledb``: ``auto`` (use the extension where the server has it) or ``off``; default from the
        environment variable ``EDGEKIT_FLEET_TIMESCALEDB``, else ``auto`` (see :mod:`timescale`)."""
        super().__init__(url)
        self._psycopg = _import_psycopg(url)
        self._connection: Any = None
        mode = timescale.wanted_mode(timescaledb)
        self._connect()
        with self._transaction("detecting TimescaleDB") as cursor:
            self._lock_for_migration(cursor)
            #: What detection found at open (path taken for a new store, and why).
            self.timescale_detection = timescale.detect(cursor, mode)
        self._migrate()
        with self._transaction("reading the store's layout", write=False) as cursor:
            #: ``timescaledb`` where the rollup tables are hypertables, else ``native`` (daily partitions).
            self.layout = timescale.TIMESCALEDB if timescale.is_hypertable(cursor, "telemetry_rollups") else timescale.NATIVE
            self._extension_schema = timescale.extension_schema(cursor)
        #: ``continuous aggregate`` where TimescaleDB keeps the fleet hour tier, else ``table`` (written at ingest).
        self.hour_tier = "table"
        if self.layout == timescale.TIMESCALEDB:
            with self._transaction("making the fleet hour tier a continuous aggregate") as cursor:
                self._lock_for_migration(cursor)
                if aggregates.present(cursor) or aggregates.create(cursor, self._ts_schema()):
                    self.hour_tier = "continuous aggregate"
                    self.bucket_tiers = (60,)  # ingest writes minutes; the server aggregates hours
                    self.bucket_tables = {view: tiers[0] for view, tiers in aggregates.TIERED.items()}
        timescale.log_path(redact(url), self.timescale_detection, self.layout)

    def storage_layout(self) -> dict[str, Any]:
        """How this store keeps time series: ``layout``, ``detected`` (why), and TimescaleDB's retention policies."""
        with self._transaction("reading retention policies", write=False) as cursor:
            policies = timescale.retention_policies(cursor)
            refresh = aggregates.refresh_policies(cursor) if self.hour_tier != "table" else {}
        return {"layout": self.layout, "detected": self.timescale_detection.reason, "retention_policies": policies,
                "hour_tier": self.hour_tier, "refresh_policies": refresh}  # fmt: skip

    def add_windows(self, windows: Sequence[TelemetryWindow]) -> int:
        added = super().add_windows(windows)
        if added and self.hour_tier != "table":  # a late window under the watermark: its hours are refreshed now
            starts = [w.window_start for w in windows]
            with self._transaction("reading the hour aggregates' watermark", write=False) as cursor:
                mark = aggregates.watermark(cursor)
                late = aggregates.late_range(min(starts), max(starts), mark, aggregates.horizon(cursor)[1])
            if late is not None:
                self._refresh_hours(*late)
        return added

    def _connect(self) -> None:
        psycopg = self._psycopg
        try:
            self._connection = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            self._connection.execute("SET TIME ZONE 'UTC'")
            # JIT compiling costs more than it saves on these short queries (0.4 s of a 0.9 s device summary read at
            # 10,000 devices, when bloat made the planner expect millions of rows)
            self._connection.execute("SET jit = off")
        except psycopg.Error as exc:
            if self._connection is not None:
                with contextlib.suppress(Exception):
                    self._connection.close()
            self._connection = None  # nothing to ask again on: the server is not there (see _connection_was_cut)
            raise StoreUnavailableError(f"cannot connect to fleet store {redact(self.url)}: {str(exc).strip()}",
                                        hint="check that PostgreSQL runs, and the URL's host, port, user and "
                                             "database (postgresql://user@host:5432/dbname)") from exc  # fmt: skip

    # -- dialect hooks ------------------------------------------------------------------------
    def _connection_was_cut(self) -> bool:
        return self._connection is not None and bool(self._connection.closed)

    def _cursor(self) -> Any:
        if self._connection is None or self._connection.closed:
            self._connect()
        return self._connection.cursor()

    #: Each statement of a read-only transaction is cut after this many seconds (None: never); set on the metrics
    #: server's own store only (:meth:`bound_reads`), never on the collector's writer.
    read_timeout_s: float | None = None

    def bound_reads(self, seconds: float) -> None:
        """Cut each statement of this store's read-only transactions after ``seconds`` (``SET LOCAL
        statement_timeout``), so a locked table or an overloaded server fails a read instead of hanging it: what the
        metrics server's reader asks of its own store. Writes are not bounded."""
        self.read_timeout_s = seconds if seconds and seconds > 0 else None

    def _begin(self, cursor: Any, *, write: bool = True) -> None:
        cursor.execute("BEGIN")
        if not write and self.read_timeout_s is not None:
            cursor.execute(f"SET LOCAL statement_timeout = {max(int(self.read_timeout_s * 1000), 1)}")

    def _commit(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    def _rollback(self, cursor: Any) -> None:
        if not self._connection.closed:
            cursor.execute("ROLLBACK")

    def _lock_for_migration(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))

    def _translate(self, exc: Exception, doing: str) -> StoreError | None:
        psycopg = self._psycopg
        where = redact(self.url)
        if isinstance(exc, psycopg.Error) and str(getattr(exc, "sqlstate", None) or "").startswith("54"):
            # program limit exceeded (a statement too complex, an index row too large): this data fails every time,
            # so it is refused (the collector writes the batch one by one) rather than retried forever
            return StoreError(f"fleet store {where} failed while {doing}: {str(exc).strip()}")
        if isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) == "57014" and self.read_timeout_s is not None:
            return StoreUnavailableError(f"fleet store {where} did not answer within {self.read_timeout_s:g} s while {doing}: "
                                         f"{str(exc).strip()}", hint="a table is locked or the server is overloaded; the "
                                         "read is tried again (the metrics server's statement timeout)")  # fmt: skip
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return StoreUnavailableError(f"fleet store {where} failed while {doing}: {str(exc).strip()}",
                                         hint="the database connection was lost or refused; it is retried")  # fmt: skip
        if isinstance(exc, psycopg.Error):
            return StoreError(f"fleet store {where} failed while {doing}: {str(exc).strip()}")
        return None

    def _sql(self, text: str) -> str:
        return named_to_pyformat(text)

    def time_in(self, moment: dt.datetime) -> dt.datetime:
        if moment.tzinfo is None:
            raise StoreError(f"time {moment.isoformat()} has no time zone", hint="use timezone-aware UTC datetimes")
        return moment

    def time_out(self, value: Any) -> dt.datetime:
        return value.astimezone(dt.timezone.utc)  # type: ignore[no-any-return]

    def json_in(self, payload: dict[str, Any]) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb(payload)

    def json_out(self, value: Any) -> dict[str, Any]:
        return dict(value or {})

    def list_in(self, values: Sequence[str]) -> list[str]:
        return list(values)

    def in_list_sql(self, expression: str, name: str) -> str:
        return f"{expression} = ANY(:{name})"

    def seconds_sql(self, start: str, end: str) -> str:
        return f"CAST(EXTRACT(EPOCH FROM ({end} - {start})) AS DOUBLE PRECISION)"

    def bucket_sql(self, moment: str, seconds_param: str) -> str:
        seconds = f"CAST(EXTRACT(EPOCH FROM {moment}) AS DOUBLE PRECISION)"
        return f"to_timestamp(floor({seconds} / :{seconds_param}) * :{seconds_param})"

    def json_text_sql(self, column: str, key: str) -> str:
        return f"({column} ->> '{key}')"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def least_sql(self, a: str, b: str) -> str:
        return f"LEAST({a}, {b})"

    def _lock_rolled_seqs(self, cursor: Any, exclusive: bool) -> None:
        # Writers share the lock; retention takes it alone, so no window is checked against the rolled seqs
        # while its raw row is being rolled up (it would be found in neither).
        cursor.execute("SELECT pg_advisory_xact_lock(%s)" if exclusive else "SELECT pg_advisory_xact_lock_shared(%s)",
                       (ROLLED_SEQS_LOCK_KEY,))  # fmt: skip

    def _organise_rollups(self, cursor: Any) -> None:
        if self.timescale_detection.schema is not None:
            timescale.make_hypertables(cursor, self.timescale_detection.schema)
        else:
            partitions.partition_tables(cursor)

    def apply_retention(self, raw_for: dt.timedelta, rollup_minutes: int = 5, now: dt.datetime | None = None, *,
                        gaps_open_for: dt.timedelta = DEFAULT_GAPS_OPEN_FOR,
                        rollups_for: dt.timedelta | None = None) -> int:  # fmt: skip
        if rollups_for is not None and self.layout == timescale.TIMESCALEDB and rollups_for.total_seconds() >= 0:
            with self._transaction("setting TimescaleDB retention policies") as cursor:
                for table in timescale.RETAINED_BY_POLICY:
                    timescale.ensure_retention_policy(cursor, self._ts_schema(), table, rollups_for)
                if self.hour_tier != "table":  # the refresh policy must not reach minutes retention removes
                    for _, hour, _, _ in aggregates.TIERED.values():
                        aggregates.ensure_refresh_policy(cursor, self._ts_schema(), hour, rollups_for - aggregates.END_OFFSET)
        return super().apply_retention(raw_for, rollup_minutes, now, gaps_open_for=gaps_open_for, rollups_for=rollups_for)

    def _ts_schema(self) -> str:
        """The schema of TimescaleDB's functions (on the TimescaleDB layout only)."""
        if self._extension_schema is None:
            raise StoreError(f"fleet store {redact(self.url)} has no timescaledb extension, but its layout needs it",
                             hint="CREATE EXTENSION timescaledb in the database, or restore it from a backup that has it")  # fmt: skip
        return str(self._extension_schema)

    def _refresh_hours(self, start: dt.datetime | None, end: dt.datetime | None) -> None:
        """Materialize the hour aggregates from ``start`` to ``end`` (a procedure that runs outside transactions)."""
        with self._lock:
            try:
                aggregates.refresh(self._cursor(), self._ts_schema(), start, end)
            except Exception as exc:
                translated = self._translate(exc, f"refreshing the hour aggregates from {start} to {end}")
                if translated is None:
                    raise
                raise translated from exc

    def _drop_rollups_before(self, before: dt.datetime) -> None:
        if self.hour_tier == "table":
            super()._drop_rollups_before(before)
            return
        # the hours of the minutes about to go are materialized first: the hour tier outlives them, as natively
        with self._transaction("reading the minute tier's horizon", write=False) as cursor:
            complete_from = aggregates.horizon(cursor)[1]
        end = aggregates.ceil_hour(before)
        if complete_from is None or complete_from < end:
            self._refresh_hours(complete_from, end)
        for table in self.ROLLUP_TABLES:
            self._forget_rollups(table, before)
        with self._transaction(f"dropping fleet minute buckets before {before.isoformat()}") as cursor:
            aggregates.drop_minutes_before(cursor, self._ts_schema(), before)

    def _forget_rollups(self, table: str, before: dt.datetime) -> None:
        with self._transaction(f"dropping {table} partitions before {before.isoformat()}") as cursor:
            self._lock_rolled_seqs(cursor, exclusive=True)  # no retention creating partitions meanwhile
            if self.layout == timescale.TIMESCALEDB:
                timescale.drop_chunks_before(cursor, self._ts_schema(), table, before)
            else:
                partitions.drop_partitions_before(cursor, table, before)

    def _ensure_rollup_partitions(self, cursor: Any, table: str, source: str, where: str, params: dict[str, Any],
                                  bucket_s: int) -> None:  # fmt: skip
        """The partitions of ``table`` that rolling up ``source``'s windows matching ``where`` into ``bucket_s``
        buckets writes into: those of the days the buckets start in (hypertables make their chunks themselves)."""
        if self.layout == timescale.TIMESCALEDB:
            return
        day = partitions.day_number_sql(self.bucket_sql("window_start", "bucket_s"))
        cursor.execute(self._sql(f"SELECT DISTINCT {day} FROM {source} WHERE {where}"), {**params, "bucket_s": bucket_s})
        partitions.ensure_partitions(cursor, table, [partitions.day_of_number(n) for (n,) in cursor.fetchall()],
                                     now=self._retention_now)  # fmt: skip

    def _roll_up_models(self, cursor: Any, where: str, params: dict[str, Any], bucket_s: int, source: str) -> None:
        self._ensure_rollup_partitions(cursor, "telemetry_model_rollups", "telemetry_model_windows", where, params, bucket_s)
        super()._roll_up_models(cursor, where, params, bucket_s, source)

    def _roll_up(self, cursor: Any, where: str, params: dict[str, Any], bucket_s: int, source: str) -> list[SeqRun]:
        self._ensure_rollup_partitions(cursor, "telemetry_rollups", "telemetry_windows", where, params, bucket_s)
        # One statement: only the rows this DELETE removed are summed, so collectors running retention at the
        # same time never roll a window up twice.
        insert = queries.rollup_insert_sql(self, "moved w", "1 = 1")
        sql = (f"WITH moved AS (DELETE FROM telemetry_windows WHERE {where} RETURNING {_ROLLED_COLUMNS}),\n"
               f"rolled AS ({insert})\n{queries.ISLANDS_SQL.format(source='moved w', where='1 = 1')}")  # fmt: skip
        cursor.execute(self._sql(sql), {**params, "bucket_s": bucket_s})
        return [SeqRun(*row) for row in cursor.fetchall()]

    def _lock_device_seqs(self, cursor: Any, fleet: str, device: str) -> None:
        # Two 32-bit keys: a space apart from the rolled-seqs lock's one 64-bit key.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (fleet, device))

    def _insert_new_windows(self, cursor: Any, windows: Sequence[TelemetryWindow]) -> list[TelemetryWindow]:
        # RETURNING names the rows this statement inserted: a window another collector stored first is not among them.
        by_key: dict[tuple[str, str, int], TelemetryWindow] = {}
        for w in windows:
            by_key.setdefault((w.fleet, w.device, w.seq), w)
        head, tail = self._window_insert()
        # In key order: two collectors inserting overlapping windows wait on each other's keys in one order, never
        # in a circle (a deadlock, which failed one collector's batch).
        inserted = self.execute_rows(cursor, head, [self._window_row(by_key[key]) for key in sorted(by_key)],
                                     f"{tail} RETURNING fleet, device, seq", returning=True)  # fmt: skip
        return [by_key[(fleet, device, int(seq))] for fleet, device, seq in inserted]

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()


@lru_cache(maxsize=64)
def _numbered_rows_sql(head: str, tail: str, width: int, count: int) -> str:
    """``head ($1, $2, …), (…) tail`` for ``count`` rows of ``width`` values (a RawCursor's placeholders; the heads
    and tails of :meth:`PostgresStore.execute_rows` take no parameters of their own)."""
    rows_sql = ", ".join("(" + ", ".join(f"${row * width + column + 1}" for column in range(width)) + ")"
                         for row in range(count))  # fmt: skip
    return f"{head} {rows_sql} {tail}"


def _import_psycopg(url: str) -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError(f"fleet store {redact(url)} needs psycopg 3, which is not installed",
                         hint="pip install 'edgekit[fleet]' (or: pip install 'psycopg[binary]')") from exc  # fmt: skip
    return psycopg


__all__ = ["PostgresStore", "redact"]
