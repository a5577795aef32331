"""The embedded default store: one SQLite file in WAL mode (readers never block the collector's writes).

Times are kept as seconds since the Unix epoch (REAL); payloads as JSON text. Telemetry inserts use
``INSERT OR IGNORE`` on the (fleet, device, seq) key, so redelivered windows are stored once.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any, Sequence

from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.store import queries
from edgekit.fleet.store.base import TelemetryWindow
from edgekit.fleet.store.retention import RETENTION_BATCH_ROWS, SeqRun
from edgekit.fleet.store.sql import SqlFleetStore

#: How long a write waits for another process's write lock before giving up.
BUSY_TIMEOUT_S = 10.0
#: Free pages returned to the file system per step after retention (4 KiB pages: 16 MB).
FREE_PAGES_PER_STEP = 4096
_UTC = dt.timezone.utc


class SqliteStore(SqlFleetStore):
    """``SqliteStore(path)``; ``path`` may be ``":memory:"`` (one connection, gone on close)."""

    dialect = "sqlite"
    lower_sql = "edgekit_lower"
    insert_ignore = ("INSERT OR IGNORE INTO", "")

    def __init__(self, path: str | Path, *, url: str | None = None) -> None:
        super().__init__(url or f"sqlite:///{path}")
        self.path = str(path)
        if self.path != ":memory:":
            parent = Path(self.path).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreError(f"cannot create fleet store {self.url}: folder {parent} does not exist",
                                 hint="create the folder first, or give a path in an existing one")  # fmt: skip
        new = self.path == ":memory:" or not Path(self.path).expanduser().is_file() or Path(self.path).expanduser().stat().st_size == 0
        try:
            self._connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                               check_same_thread=False)  # fmt: skip
            if self.path != ":memory:" and new:
                # before the first table: a new store returns the pages retention frees (an existing one keeps its
                # mode; setting it there would wait for another process's write lock for nothing)
                self._connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
                self._connection.execute("PRAGMA journal_mode=WAL")
            # SQLite's LOWER folds ASCII only: the device search folds every letter, as PostgreSQL does (ÜBER finds über)
            self._connection.create_function("edgekit_lower", 1, _lower, deterministic=True)
            self._connection.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
            self._connection.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open fleet store {self.url}: {exc}",
                             hint="check that the path is a writable SQLite file (or a new file name)") from exc  # fmt: skip
        try:
            self._migrate()
        except BaseException:
            self._connection.close()
            raise

    # -- dialect hooks ------------------------------------------------------------------------
    def _cursor(self) -> sqlite3.Cursor:
        return self._connection.cursor()

    def _begin(self, cursor: Any, *, write: bool = True) -> None:
        # writers take the write lock up front (no upgrade deadlocks); readers read a WAL snapshot, never waiting
        cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")

    def _commit(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    def _rollback(self, cursor: Any) -> None:
        if self._connection.in_transaction:
            cursor.execute("ROLLBACK")

    def _translate(self, exc: Exception, doing: str) -> StoreError | None:
        if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
            return StoreUnavailableError(f"fleet store {self.url} is busy while {doing}: {exc}",
                                         hint="another process holds the database's write lock; retry")  # fmt: skip
        if isinstance(exc, sqlite3.OperationalError) and ("disk" in str(exc) or "I/O" in str(exc)):
            return StoreUnavailableError(f"fleet store {self.url} failed while {doing}: {exc}",
                                         hint="check free disk space and the file system")  # fmt: skip
        if isinstance(exc, (sqlite3.Error, OverflowError, UnicodeEncodeError)):
            return StoreError(f"fleet store {self.url} failed while {doing}: {exc}")
        return None

    def _sql(self, text: str) -> str:
        return text

    def time_in(self, moment: dt.datetime) -> float:
        if moment.tzinfo is None:
            raise StoreError(f"time {moment.isoformat()} has no time zone", hint="use timezone-aware UTC datetimes")
        return moment.timestamp()

    def time_out(self, value: Any) -> dt.datetime:
        return dt.datetime.fromtimestamp(float(value), _UTC)

    def json_in(self, payload: dict[str, Any]) -> str:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)

    def json_out(self, value: Any) -> dict[str, Any]:
        return json.loads(value) if isinstance(value, str) else dict(value or {})

    def list_in(self, values: Sequence[str]) -> str:
        return json.dumps(list(values))

    def in_list_sql(self, expression: str, name: str) -> str:
        return f"{expression} IN (SELECT value FROM json_each(:{name}))"

    def seconds_sql(self, start: str, end: str) -> str:
        return f"({end} - {start})"

    def bucket_sql(self, moment: str, seconds_param: str) -> str:
        return f"(CAST({moment} / :{seconds_param} AS INTEGER) * :{seconds_param})"

    def json_text_sql(self, column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"MAX(COALESCE({a}, {b}), COALESCE({b}, {a}))"  # SQLite's MAX(x, NULL) is NULL

    def least_sql(self, a: str, b: str) -> str:
        return f"MIN(COALESCE({a}, {b}), COALESCE({b}, {a}))"

    def _old_windows(self, table: str) -> str:
        # A batch's windows by their end. Left to itself SQLite's planner reads the whole table in primary-key
        # order instead (fleet, device, seq: the order the GROUP BY and ROW_NUMBER want) and filters it: at 10,000
        # devices with 24 h of windows that made a 20,000-window batch hold the write lock 12 s, past the busy
        # timeout of every writer and reader that opened the store meanwhile. Through the index: 1.2 s.
        return f"{table} w INDEXED BY {table}_by_end"

    def _roll_up(self, cursor: Any, where: str, params: dict[str, Any], bucket_s: int, source: str) -> list[SeqRun]:
        # BEGIN IMMEDIATE holds the write lock, so all three statements see the same windows.
        params = {**params, "bucket_s": bucket_s}
        cursor.execute(queries.ISLANDS_SQL.format(source=source, where=where), params)
        runs = [SeqRun(*row) for row in cursor.fetchall()]
        cursor.execute(queries.rollup_insert_sql(self, source, where), params)
        cursor.execute(f"DELETE FROM telemetry_windows WHERE {where}", params)
        return runs

    def _insert_new_windows(self, cursor: Any, windows: Sequence[TelemetryWindow]) -> list[TelemetryWindow]:
        # BEGIN IMMEDIATE holds the write lock: the keys read here stay as they are until the commit.
        unique: dict[tuple[str, str, int], TelemetryWindow] = {}
        for w in windows:
            unique.setdefault((w.fleet, w.device, w.seq), w)
        params: dict[str, Any] = {"seq_low": min(w.seq for w in windows), "seq_high": max(w.seq for w in windows)}
        where = queries.device_filter(self, "w", params, sorted({(w.fleet, w.device) for w in windows}))
        cursor.execute(f"SELECT w.fleet, w.device, w.seq FROM telemetry_windows w WHERE {where} "
                       "AND w.seq BETWEEN :seq_low AND :seq_high", params)  # fmt: skip
        for key in cursor.fetchall():
            unique.pop(tuple(key), None)  # type: ignore[arg-type]
        new = list(unique.values())
        head, tail = self._window_insert()
        self.execute_rows(cursor, head, [self._window_row(w) for w in new], tail)
        return new

    def _forget_rollups(self, table: str, before: dt.datetime) -> None:
        while True:  # a batch a transaction: readers and the collector wait at most one
            with self._transaction(f"deleting {table} before {before.isoformat()}") as cursor:
                cursor.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE bucket_start < ? "
                               f"LIMIT {RETENTION_BATCH_ROWS})", (self.time_in(before),))  # fmt: skip
                if cursor.rowcount < RETENTION_BATCH_ROWS:
                    return

    def _return_free_space(self) -> None:
        with self._lock:
            if self._closed or self._connection.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # 2: incremental
                return
            for _ in range(1000):  # a few thousand pages at a time: writers wait milliseconds, not the whole vacuum
                if not self._connection.execute("PRAGMA freelist_count").fetchone()[0]:
                    return
                try:
                    self._connection.execute(f"PRAGMA incremental_vacuum({FREE_PAGES_PER_STEP})").fetchall()
                except sqlite3.OperationalError:  # busy: the next retention pass returns them
                    return

    def _close_connection(self) -> None:
        self._connection.close()


def _lower(text: Any) -> Any:
    return text.lower() if isinstance(text, str) else text


__all__ = ["SqliteStore"]
