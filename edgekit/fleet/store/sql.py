"""The SQL implementation of :class:`FleetStore`, shared by SQLite and PostgreSQL.

Subclasses supply the connection, the placeholder style and the few expressions that differ
(time values, durations, time buckets, GREATEST/LEAST); every query is written once, here and in
:mod:`edgekit.fleet.store.queries`. A store is safe to share between threads: each call holds a lock.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import re
import threading
from collections import Counter
from typing import Any, Iterator, Sequence

from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.store import buckets, fleet_reads, queries
from edgekit.fleet.store.base import (
    DAMAGED_RECORD,
    AGGREGATE_KEYS,
    KNOWN_VALUE_KEYS,
    MODEL_AGGREGATE_KEYS,
    Aggregate,
    BundleSpan,
    DeviceEvent,
    DeviceIdentityRecord,
    DeviceStatus,
    DeviceSummary,
    FleetStore,
    ModelAggregate,
    RejectedMessage,
    TelemetryWindow,
)
from edgekit.fleet.store.device_reads import DeviceReadsMixin
from edgekit.fleet.store.migrate import SchemaMigrations
from edgekit.fleet.store.status_writes import StatusWritesMixin
from edgekit.fleet.store.retention import (  # re-exported (__all__): the stores and older callers import them here
    DEFAULT_GAPS_OPEN_FOR,
    RetentionMixin,
    RolledSeqs,
    SeqRun,
    merge_rolled_seqs,
)
from edgekit.fleet.store.summaries import summary_from_row
from edgekit.fleet.store.urls import redact

#: Rows fetched per query when iterating windows.
PAGE_ROWS = 5000
#: Parameters per multi-row statement (SQLite allows 32,766, PostgreSQL 65,535).
PARAMS_PER_STATEMENT = 10_000
WINDOW_COLUMNS = ("fleet", "device", "seq", "window_start", "window_end", "received_at", "bundle_id", "bundle_sha256",
                  "inferences", "errors", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "throughput_per_s",
                  "power_mean_mw", "power_max_mw", "energy_mj", "energy_per_inference_mj", "temperature_max_c",
                  "memory_used_mb", "cpu_load_pct", "gpu_load_pct", "payload")  # fmt: skip
_TIME_COLUMNS = (3, 4, 5)
_EVENT_COLUMNS = ("event_id", "fleet", "device", "kind", "level", "message", "at", "command_id", "payload")
_NAMED_RE = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


class SqlFleetStore(StatusWritesMixin, DeviceReadsMixin, RetentionMixin, SchemaMigrations, FleetStore):
    """Everything but the connection. ``dialect`` names the migrations folder."""

    dialect: str
    #: How to write "insert unless the key exists": (statement start, statement end).
    insert_ignore: tuple[str, str] = ("INSERT INTO", "ON CONFLICT DO NOTHING")
    #: Whether :meth:`execute_rows` writes many rows per statement (else one per row, for pipelining drivers).
    multi_row_values: bool = True
    #: What ends a SELECT that locks its rows for the transaction ("" where the transaction already excludes writers).
    lock_rows_sql: str = ""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()
        self._closed = False

    # -- dialect hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def _cursor(self) -> Any:
        """A DB-API cursor on the open connection."""

    @abc.abstractmethod
    def _begin(self, cursor: Any, *, write: bool = True) -> None:
        """Open a transaction; ``write=False``: one that only reads (SQLite: never waits for a writer in WAL mode)."""

    @abc.abstractmethod
    def _commit(self, cursor: Any) -> None: ...

    @abc.abstractmethod
    def _rollback(self, cursor: Any) -> None: ...

    @abc.abstractmethod
    def _translate(self, exc: Exception, doing: str) -> StoreError | None:
        """The StoreError for a driver exception (None: not the driver's, let it propagate)."""

    @abc.abstractmethod
    def _sql(self, text: str) -> str:
        """Rewrite ``?`` and ``:name`` placeholders into the driver's style."""

    @abc.abstractmethod
    def time_in(self, moment: dt.datetime) -> Any: ...

    @abc.abstractmethod
    def time_out(self, value: Any) -> dt.datetime: ...

    @abc.abstractmethod
    def json_in(self, payload: dict[str, Any]) -> Any: ...

    @abc.abstractmethod
    def json_out(self, value: Any) -> dict[str, Any]: ...

    @abc.abstractmethod
    def list_in(self, values: Sequence[str]) -> Any: ...

    @abc.abstractmethod
    def in_list_sql(self, expression: str, name: str) -> str:
        """SQL testing ``expression`` against the list parameter ``name``."""

    @abc.abstractmethod
    def seconds_sql(self, start: str, end: str) -> str:
        """SQL for the seconds from time expression ``start`` to ``end``, as a float."""

    @abc.abstractmethod
    def bucket_sql(self, moment: str, seconds_param: str) -> str:
        """SQL for the start of the ``:seconds_param``-second bucket ``moment`` falls in (a time value)."""

    @abc.abstractmethod
    def json_text_sql(self, column: str, key: str) -> str:
        """SQL for the text of top-level ``key`` in the JSON ``column`` (NULL when absent or null)."""
        raise NotImplementedError

    def greatest_sql(self, a: str, b: str) -> str: ...

    @abc.abstractmethod
    def least_sql(self, a: str, b: str) -> str: ...

    # -- plumbing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self, doing: str, *, write: bool = True) -> Iterator[Any]:
        with self._lock:
            if self._closed:
                raise StoreError(f"fleet store {redact(self.url)} is closed", hint="open it again with open_store(url)")
            cursor = None
            try:
                cursor = self._cursor()
                self._begin(cursor, write=write)
                yield cursor
                self._commit(cursor)
            except Exception as exc:
                if cursor is not None:
                    with contextlib.suppress(Exception):
                        self._rollback(cursor)
                translated = self._translate(exc, doing)
                if translated is None:
                    raise
                raise translated from exc

    def _query(self, doing: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        """Rows of one SELECT, in a read-only transaction; asked once more on a new connection when the one it used
        turns out to have been cut (a database restart): the first read after an outage then succeeds."""
        for last_try in (False, True):
            try:
                with self._transaction(doing, write=False) as cursor:
                    cursor.execute(self._sql(sql), params)
                    return list(cursor.fetchall())
            except StoreUnavailableError:
                if last_try or not self._connection_was_cut():
                    raise
        raise AssertionError("unreachable: the last try returns or raises")

    def _connection_was_cut(self) -> bool:
        """Whether the last failure closed a connection that had been open (the next use makes a new one)."""
        return False

    def _sum_in_history(self, cursor: Any) -> None:
        """Sum the windows and rollups a store kept before it had aggregates into them (once, when migrating)."""
        # Oldest first: rollups before raw windows, so each device is counted in its buckets as they arrived (a
        # part older than one already counted adds its sums but no device).
        cursor.execute(self._sql(queries.SELECT_ROLLUPS_AS_PARTS))
        buckets.ingest(self, cursor, buckets.rollup_parts(cursor.fetchall(), self.time_out))
        cursor.execute(self._sql(f"SELECT {', '.join(WINDOW_COLUMNS)} FROM telemetry_windows ORDER BY fleet, device, seq"))
        while rows := cursor.fetchmany(PAGE_ROWS):
            parts = [buckets.window_part(self._window_from_row(row)) for row in rows]
            for part in parts:
                part.models = []  # from the per-model tables below, which hold every model's windows
            buckets.ingest(self, self._cursor(), parts)
        cursor.execute(self._sql(queries.SELECT_MODEL_HISTORY))
        buckets.ingest(self, cursor, buckets.model_history_parts(cursor.fetchall(), self.time_out))

    @property
    def schema_version(self) -> int:
        rows = self._query("reading the schema version", "SELECT MAX(version) FROM schema_version")
        return int(rows[0][0] or 0)

    # -- writes -------------------------------------------------------------------------------
    def add_windows(self, windows: Sequence[TelemetryWindow]) -> int:
        if not windows:
            return 0
        with self._transaction(f"storing {len(windows)} telemetry windows") as cursor:
            self._lock_rolled_seqs(cursor, exclusive=False)
            fresh = self._not_rolled_up(cursor, windows)
            if not fresh:
                return 0
            added = self._insert_new_windows(cursor, fresh)
            if len(added) < len(fresh):  # some keys were held: redeliveries, or a device whose seqs started again
                inserted = {id(w) for w in added}
                held = [w for w in fresh if id(w) not in inserted]
                if self._make_room_for_a_new_spool(cursor, held):
                    added += self._insert_new_windows(cursor, held)
            if added:
                self.execute_rows(cursor, queries.INSERT_MODEL_WINDOW, [row for w in added for row in self._model_rows(w)],
                                  queries.INSERT_MODEL_WINDOW_END)  # fmt: skip
                buckets.ingest(self, cursor, [buckets.window_part(w) for w in added])
            return len(added)

    def _execute_each_row(self, cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str, *,
                          returning: bool) -> list[tuple[Any, ...]]:  # fmt: skip
        """:meth:`execute_rows` as one statement per row (drivers that pipeline executemany)."""
        cursor.executemany(self._sql(f"{head} ({', '.join('?' * len(rows[0]))}) {tail}"), rows)
        return []

    def _window_insert(self) -> tuple[str, str]:
        """The head and tail of a multi-row insert of windows that skips stored keys (see :meth:`execute_rows`)."""
        start, end = self.insert_ignore
        return f"{start} telemetry_windows ({', '.join(WINDOW_COLUMNS)}) VALUES", end

    def execute_rows(self, cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str = "", *,
                     returning: bool = False) -> list[tuple[Any, ...]]:  # fmt: skip
        """``head (?, ...), (?, ...) tail`` over ``rows`` in statements of at most :data:`PARAMS_PER_STATEMENT`
        parameters: one round trip per few hundred rows instead of one per row. With ``returning``, the rows the
        statements returned."""
        found: list[tuple[Any, ...]] = []
        if not rows:
            return found
        if not self.multi_row_values:
            return self._execute_each_row(cursor, head, rows, tail, returning=returning)
        width = len(rows[0])
        per_statement = max(1, PARAMS_PER_STATEMENT // width)
        row_sql = "(" + ", ".join("?" * width) + ")"
        for first in range(0, len(rows), per_statement):
            chunk = rows[first : first + per_statement]
            cursor.execute(self._sql(f"{head} {', '.join([row_sql] * len(chunk))} {tail}"),
                           [value for row in chunk for value in row])  # fmt: skip
            if returning:
                found.extend(cursor.fetchall())
        return found

    @abc.abstractmethod
    def _insert_new_windows(self, cursor: Any, windows: Sequence[TelemetryWindow]) -> list[TelemetryWindow]:
        """Insert the windows not stored yet (by fleet, device, seq; the first of a batch's repeats) and return
        them, exactly those, also when another collector inserts the same windows at the same moment."""

    def _model_rows(self, w: TelemetryWindow) -> list[tuple[Any, ...]]:
        """The window's rows in telemetry_model_windows: its models' own windows, else itself (model '' when unnamed)."""
        start, end = self.time_in(w.window_start), self.time_in(w.window_end)
        if not w.models:
            return [(w.fleet, w.device, w.seq, w.model or "", w.bundle_id, start, end, w.count, w.errors, w.p50_ms,
                     w.p99_ms, w.throughput_per_s, None)]  # fmt: skip
        return [(w.fleet, w.device, w.seq, m.model or "", m.bundle_id, start, end, m.count, m.errors, m.p50_ms, m.p99_ms,
                 m.throughput_per_s, m.memory_mb) for m in w.models]  # fmt: skip

    def _not_rolled_up(self, cursor: Any, windows: Sequence[TelemetryWindow]) -> Sequence[TelemetryWindow]:
        """``windows`` less those already rolled up: seq in a device's rolled run, ending no later than its windows."""
        devices = sorted({(w.fleet, w.device) for w in windows})
        params: dict[str, Any] = {"seq_low": min(w.seq for w in windows), "seq_high": max(w.seq for w in windows)}
        where = queries.device_filter(self, "r", params, devices)
        cursor.execute(self._sql(f"{queries.SELECT_ROLLED_SEQS} WHERE {where} AND r.seq_last >= :seq_low "
                                 "AND r.seq_first <= :seq_high"), params)  # fmt: skip
        runs: dict[tuple[str, str], list[tuple[int, int, Any]]] = {}
        for fleet, device, first, last, window_end_max, _ in cursor.fetchall():
            runs.setdefault((fleet, device), []).append((int(first), int(last), window_end_max))
        if not runs:
            return windows
        # Times compared as the store keeps them (epoch floats, timestamptz), exactly as they were written.
        return [w for w in windows if not any(first <= w.seq <= last and self.time_in(w.window_end) <= window_end_max
                                              for first, last, window_end_max in runs.get((w.fleet, w.device), ()))]  # fmt: skip

    def _window_row(self, w: TelemetryWindow) -> tuple[Any, ...]:
        return (w.fleet, w.device, w.seq, self.time_in(w.window_start), self.time_in(w.window_end),
                self.time_in(w.received_at), w.bundle_id, w.bundle_sha256, w.count, w.errors, w.p50_ms, w.p90_ms,
                w.p99_ms, w.max_ms, w.mean_ms, w.throughput_per_s, w.power_mean_mw, w.power_max_mw, w.energy_mj,
                w.energy_per_inference_mj, w.temperature_max_c, w.memory_used_mb, w.cpu_load_pct, w.gpu_load_pct,
                w.payload_json if w.payload_json is not None else self.json_in(w.payload))  # fmt: skip

    def device_identities(self, fleet: str | None = None) -> list[DeviceIdentityRecord]:
        sql = queries.SELECT_IDENTITIES.format(fleet_filter="fleet = :fleet" if fleet is not None else "1 = 1")
        rows = self._query("reading device identities", sql, {"fleet": fleet} if fleet is not None else {})
        return [DeviceIdentityRecord(fleet=r[0], device=r[1], board=r[2], soc=r[3], os=r[4], l4t=r[5], jetpack=r[6],
                                     cuda=r[7], tensorrt=r[8], onnxruntime=r[9], power_mode=r[10],
                                     clocks_locked=None if r[11] is None else bool(r[11]), payload=self.json_out(r[12]),
                                     updated_at=self.time_out(r[13])) for r in rows]  # fmt: skip

    def known_values(self, key: str, *, fleet: str | None = None) -> list[str]:
        if key not in KNOWN_VALUE_KEYS:
            raise StoreError(f"no known values of {key!r}", hint=f"ask for one of {list(KNOWN_VALUE_KEYS)}")
        sql = queries.known_values_sql(key, in_fleet=fleet is not None)
        params = {"fleet": fleet} if fleet is not None else {}
        return [row[0] for row in self._query(f"listing the known {key} values", sql, params)]

    def set_device_target(self, fleet: str, device: str, target: str) -> None:
        with self._transaction(f"storing the target of {fleet}/{device}") as cursor:
            self._set_target(cursor, fleet, device, target)

    def _set_target(self, cursor: Any, fleet: str, device: str, target: str) -> None:
        cursor.execute(self._sql(queries.UPSERT_TARGET), (fleet, device, target, self.time_in(_now())))

    def add_events(self, events: Sequence[DeviceEvent]) -> int:
        if not events:
            return 0
        start, end = self.insert_ignore
        sql = f"{start} device_events ({', '.join(_EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(_EVENT_COLUMNS))}) {end}"
        rows = [(e.event_id, e.fleet, e.device, e.kind, e.level, e.message, self.time_in(e.at), e.command_id,
                 self.json_in(e.payload)) for e in events]  # fmt: skip
        with self._transaction(f"storing {len(rows)} events") as cursor:
            cursor.executemany(self._sql(sql), rows)
            return max(int(cursor.rowcount), 0)

    def add_rejected(self, rejected: Sequence[RejectedMessage]) -> None:
        if not rejected:
            return
        rows = [(r.topic, r.reason, r.detail, r.size_bytes, self.time_in(r.at)) for r in rejected]
        totals: Counter[str] = Counter()
        for r in rejected:
            totals[r.reason] += r.count
        with self._transaction(f"storing {len(rows)} rejected messages") as cursor:
            cursor.executemany(self._sql(queries.INSERT_REJECTED), rows)
            cursor.executemany(self._sql(queries.ADD_REJECTED_TOTAL), sorted(totals.items()))

    # -- reads --------------------------------------------------------------------------------
    def device_summaries(self, fleet: str | None = None) -> list[DeviceSummary]:
        params = {"fleet": fleet} if fleet is not None else {}
        sql = queries.SUMMARIES.format(fleet_filter="fleet = :fleet" if fleet is not None else "1 = 1")
        rows = self._query("reading device summaries", sql, params)
        now, time_out = _now(), self.time_out
        return [summary_from_row(row, now, time_out) for row in rows]

    def windows(self, fleet: str | None = None, device: str | None = None, since: dt.datetime | None = None,
                until: dt.datetime | None = None, bundle_id: str | None = None,
                limit: int | None = None) -> Iterator[TelemetryWindow]:  # fmt: skip
        where, params = self._window_filters(fleet, device, since, until, bundle_id)
        remaining = limit
        after: tuple[str, str, int] | None = None
        while remaining is None or remaining > 0:
            page = PAGE_ROWS if remaining is None else min(PAGE_ROWS, remaining)
            clauses = list(where)
            if after is not None:
                clauses.append("(fleet, device, seq) > (:after_fleet, :after_device, :after_seq)")
                params.update(after_fleet=after[0], after_device=after[1], after_seq=after[2])
            sql = (f"SELECT {', '.join(WINDOW_COLUMNS)} FROM telemetry_windows"
                   f"{' WHERE ' + ' AND '.join(clauses) if clauses else ''} ORDER BY fleet, device, seq LIMIT {page}")  # fmt: skip
            rows = self._query("reading telemetry windows", sql, params)
            for row in rows:
                yield self._window_from_row(row)
            if len(rows) < page:
                return
            after = (rows[-1][0], rows[-1][1], rows[-1][2])
            if remaining is not None:
                remaining -= len(rows)

    def _window_filters(self, fleet: str | None, device: str | None, since: dt.datetime | None,
                        until: dt.datetime | None, bundle_id: str | None) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
        clauses: list[str] = []
        params: dict[str, Any] = {}
        for column, value in (("fleet", fleet), ("device", device), ("bundle_id", bundle_id)):
            if value is not None:
                clauses.append(f"{column} = :{column}")
                params[column] = value
        if since is not None:
            clauses.append("window_end >= :since")
            params["since"] = self.time_in(since)
        if until is not None:
            clauses.append("window_end < :until")
            params["until"] = self.time_in(until)
        return clauses, params

    def _window_from_row(self, row: Sequence[Any]) -> TelemetryWindow:
        values = list(row)
        for index in _TIME_COLUMNS:
            values[index] = self.time_out(values[index])
        values[24] = self.json_out(values[24])
        for index in (2, 8, 9):
            values[index] = int(values[index])
        return TelemetryWindow(*values[:8], count=values[8], errors=values[9], p50_ms=values[10], p90_ms=values[11],  # type: ignore[misc]
                               p99_ms=values[12], max_ms=values[13], mean_ms=values[14], throughput_per_s=values[15],
                               power_mean_mw=values[16], power_max_mw=values[17], energy_mj=values[18],
                               energy_per_inference_mj=values[19], temperature_max_c=values[20],
                               memory_used_mb=values[21], cpu_load_pct=values[22], gpu_load_pct=values[23],
                               payload=values[24], model=values[24].get("model"))  # fmt: skip

    def events(self, fleet: str | None = None, device: str | None = None, since: dt.datetime | None = None,
               limit: int = 200, *, kinds: Sequence[str] = ()) -> list[DeviceEvent]:  # fmt: skip
        clauses, params = queries.event_filters(fleet, device, kinds)
        if since is not None:
            clauses.append("at >= :since")
            params["since"] = self.time_in(since)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {', '.join(_EVENT_COLUMNS)} FROM device_events{where} ORDER BY at DESC, event_id LIMIT {int(limit)}"
        return [DeviceEvent(fleet=r[1], device=r[2], event_id=r[0], kind=r[3], level=r[4], message=r[5],
                            at=self.time_out(r[6]), command_id=r[7], payload=self.json_out(r[8]))
                for r in self._query("reading events", sql, params)]  # fmt: skip

    def rejected_counts(self) -> dict[str, int]:
        rows = self._query("reading rejected-message counts", "SELECT reason, count FROM rejected_totals ORDER BY reason")
        return {str(reason): int(count) for reason, count in rows}

    def missing_seqs(self, fleet: str, device: str) -> list[tuple[int, int]]:
        rows = self._query(f"finding sequence gaps of {fleet}/{device}", queries.MISSING_SEQS,
                           {"fleet": fleet, "device": device})  # fmt: skip
        return [(int(first), int(last)) for first, last in rows]

    def aggregate(self, by: Sequence[str] = ("bundle_id", "target"), *, fleet: str | None = None,
                  devices: Sequence[tuple[str, str]] | None = None, bundle_id: str | None = None,
                  target: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  bucket_s: int | None = None) -> list[Aggregate]:  # fmt: skip
        keys = tuple(by)
        unknown = [key for key in keys if key not in AGGREGATE_KEYS]
        if unknown or len(set(keys)) != len(keys):
            raise StoreError(f"cannot aggregate by {list(keys)}", hint=f"group by distinct keys among {list(AGGREGATE_KEYS)}")
        if bucket_s is not None and (isinstance(bucket_s, bool) or not isinstance(bucket_s, int) or bucket_s < 1):
            raise StoreError(f"bucket_s must be a whole number of seconds >= 1, got {bucket_s!r}")
        if devices is not None and not devices:
            return []
        params: dict[str, Any] = {}
        if fleet_reads.serves(keys, devices, bucket_s):
            sql = fleet_reads.fleet_aggregate_sql(self, keys, params, fleet=fleet, bundle_id=bundle_id, target=target,
                                                  since=since, until=until, bucket_s=bucket_s)  # fmt: skip
        else:
            sql = queries.aggregate_sql(self, keys, params, fleet=fleet, devices=devices, bundle_id=bundle_id,
                                        target=target, since=since, until=until, bucket_s=bucket_s)  # fmt: skip
        rows = self._query("aggregating telemetry", sql, params)
        # A bucket with windows is kept also when it counted no device (its windows came out of order).
        return [self._aggregate_from_row(keys, row) for row in rows if row[len(AGGREGATE_KEYS) + 2]]

    def _aggregate_from_row(self, keys: tuple[str, ...], row: Sequence[Any]) -> Aggregate:
        key_values = dict(zip(AGGREGATE_KEYS, row[: len(AGGREGATE_KEYS)]))
        bucket, *figures = row[len(AGGREGATE_KEYS):]
        return Aggregate(
            fleet=key_values["fleet"], device=key_values["device"], bundle_id=key_values["bundle_id"] or None,
            target=key_values["target"], power_mode=key_values["power_mode"],
            bucket_start=self.time_out(bucket) if bucket is not None else None,
            devices=int(figures[0]), windows=int(figures[1]), inferences=int(figures[2]), errors=int(figures[3]),
            p50_ms=_float(figures[4]), p99_ms=_float(figures[5]), p99_max_ms=_float(figures[6]),
            power_mean_mw=_float(figures[7]), energy_mj=_float(figures[8]), energy_per_inference_mj=_float(figures[9]),
            temperature_max_c=_float(figures[10]),
            first_window_start=self.time_out(figures[11]) if figures[11] is not None else None,
            last_window_end=self.time_out(figures[12]) if figures[12] is not None else None,
        )  # fmt: skip

    def model_aggregate(self, by: Sequence[str] = ("model", "bundle_id"), *, fleet: str | None = None,
                        devices: Sequence[tuple[str, str]] | None = None, model: str | None = None,
                        since: dt.datetime | None = None, until: dt.datetime | None = None,
                        bucket_s: int | None = None) -> list[ModelAggregate]:  # fmt: skip
        keys = tuple(by)
        unknown = [key for key in keys if key not in MODEL_AGGREGATE_KEYS]
        if unknown or len(set(keys)) != len(keys):
            raise StoreError(f"cannot aggregate models by {list(keys)}",
                             hint=f"group by distinct keys among {list(MODEL_AGGREGATE_KEYS)}")  # fmt: skip
        if bucket_s is not None and (isinstance(bucket_s, bool) or not isinstance(bucket_s, int) or bucket_s < 1):
            raise StoreError(f"bucket_s must be a whole number of seconds >= 1, got {bucket_s!r}")
        if devices is not None and not devices:
            return []
        params: dict[str, Any] = {}
        if fleet_reads.serves(keys, devices, bucket_s):
            sql = fleet_reads.model_aggregate_sql(self, keys, params, fleet=fleet, model=model, since=since, until=until,
                                                  bucket_s=bucket_s)  # fmt: skip
        else:
            sql = queries.model_aggregate_sql(self, keys, params, fleet=fleet, devices=devices, model=model, since=since,
                                              until=until, bucket_s=bucket_s)  # fmt: skip
        rows = self._query("aggregating telemetry per model", sql, params)
        found = []
        for row in rows:
            bucket, *figures = row[len(MODEL_AGGREGATE_KEYS):]
            if not figures[1]:
                continue
            found.append(ModelAggregate(
                fleet=row[0], device=row[1], model=row[2] or None, bundle_id=row[3] or None,
                bucket_start=self.time_out(bucket) if bucket is not None else None, devices=int(figures[0]),
                windows=int(figures[1]), inferences=int(figures[2]), errors=int(figures[3]), p50_ms=_float(figures[4]),
                p99_ms=_float(figures[5]), p99_max_ms=_float(figures[6]), throughput_per_s=_float(figures[7]),
                memory_mb_max=_float(figures[8]),
                first_window_start=self.time_out(figures[9]) if figures[9] is not None else None,
                last_window_end=self.time_out(figures[10]) if figures[10] is not None else None,
            ))  # fmt: skip
        return found

    def bundle_spans(self, fleet: str | None = None, since: dt.datetime | None = None,
                     until: dt.datetime | None = None) -> list[BundleSpan]:  # fmt: skip
        params: dict[str, Any] = {}
        sql = queries.bundle_spans_sql(self, params, fleet=fleet, since=since, until=until)
        return [BundleSpan(fleet=r[0], device=r[1], bundle_id=r[2] or None, first_window_start=self.time_out(r[3]),
                           last_window_end=self.time_out(r[4]), windows=int(r[5]))
                for r in self._query("reading bundle spans", sql, params)]  # fmt: skip

    def device_targets(self, fleet: str | None = None) -> dict[tuple[str, str], str]:
        sql = "SELECT fleet, device, target FROM device_targets" + (" WHERE fleet = :fleet" if fleet is not None else "")
        rows = self._query("reading device targets", sql, {"fleet": fleet} if fleet is not None else {})
        return {(row[0], row[1]): row[2] for row in rows}

    def bundle_totals(self, devices: Sequence[tuple[str, str]], bundle_id: str | None) -> Aggregate | None:
        if not devices:
            return None
        params: dict[str, Any] = {"bundle_id": bundle_id or ""}
        where = queries.device_filter(self, "b", params, devices)
        rows = self._query("summing bundle totals", queries.BUNDLE_TOTALS.format(where=where), params)
        if not rows or not rows[0][1]:
            return None
        return self._aggregate_from_row((), (None, None, bundle_id, None, None, None, *rows[0]))

    # -- rollouts -----------------------------------------------------------------------------
    def save_rollout(self, record: dict[str, Any]) -> None:
        missing = [key for key in ("rollout_id", "fleet", "bundle_id", "state", "started_at", "updated_at") if not record.get(key)]
        if missing:
            raise StoreError(f"a rollout record needs {', '.join(missing)}", hint="save RolloutRecord.to_json()")
        times = [self.time_in(dt.datetime.fromisoformat(record[key])) for key in ("started_at", "updated_at")]
        with self._transaction(f"storing rollout {record['rollout_id']}") as cursor:
            cursor.execute(self._sql(queries.UPSERT_ROLLOUT), (record["rollout_id"], record["fleet"], record["bundle_id"],
                                                               record["state"], *times, self.json_in(record)))  # fmt: skip

    def rollouts(self, fleet: str | None = None, *, rollout_id: str | None = None, bundle_id: str | None = None,
                 since: dt.datetime | None = None, until: dt.datetime | None = None, limit: int = 50) -> list[dict[str, Any]]:  # fmt: skip
        clauses, params = [], {}
        for column, value in (("fleet", fleet), ("rollout_id", rollout_id), ("bundle_id", bundle_id)):
            if value is not None:
                clauses.append(f"{column} = :{column}")
                params[column] = value
        for clause, name, moment in (("started_at >= :since", "since", since), ("started_at < :until", "until", until)):
            if moment is not None:
                clauses.append(clause)
                params[name] = self.time_in(moment)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT rollout_id, record FROM edgekit_rollouts{where} ORDER BY started_at DESC, rollout_id LIMIT {int(limit)}"
        found = []
        for found_id, record in self._query("reading rollouts", sql, params):
            try:
                found.append(self.json_out(record))
            except ValueError as exc:  # a damaged row: named, so one bad record does not hide the others
                found.append({"rollout_id": found_id, DAMAGED_RECORD: f"its JSON cannot be read: {exc}"})
        return found

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_connection()

    @abc.abstractmethod
    def _close_connection(self) -> None: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


# -- summaries --------------------------------------------------------------------------------


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def named_to_pyformat(text: str) -> str:
    """``?`` -> ``%s`` and ``:name`` -> ``%(name)s`` (psycopg's placeholder style)."""
    return _NAMED_RE.sub(r"%(\1)s", text.replace("?", "%s"))


__all__ = [
    "DEFAULT_GAPS_OPEN_FOR", "PAGE_ROWS", "RolledSeqs", "SeqRun", "SqlFleetStore", "WINDOW_COLUMNS", "merge_rolled_seqs",
    "named_to_pyformat",
]  # fmt: skip
