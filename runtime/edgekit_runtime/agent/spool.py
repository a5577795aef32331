"""The agent's outgoing queue on disk: SQLite in WAL mode, bounded, persisted until acknowledged.

Every message is committed here before it is published and leaves only when the broker
acknowledges it (:meth:`Spool.ack`). The queue is bounded by message count and payload bytes; when
an append goes over, the oldest messages are dropped and counted in :meth:`Spool.dropped_total`, a
counter kept in the same database. :meth:`Spool.next_seq` hands out per-device sequence numbers
that are committed before they are returned, so a number is never handed out twice, even after
the process is killed; :meth:`Spool.append_numbered` takes the number and queues the message in one
commit, so a number is used only by a message that is on disk.

A full disk is a state, not a crash: a write that fails for want of space is rolled back (no message,
no number used) and raises :class:`SpoolFullError`; :attr:`Spool.disk_full` and
:attr:`Spool.write_error` say so until a write succeeds again. Acknowledgements that cannot be
committed while the disk is full are kept in memory and committed with the next write that succeeds
(their messages are not handed out by :meth:`Spool.peek` meanwhile).

On a small disk the spool keeps working (see :mod:`edgekit_runtime.agent.spool_space`): its WAL is
bounded and truncated when space runs short or at open (a leftover WAL), it keeps ``headroom_bytes`` free
by dropping its oldest telemetry windows, and writes that must succeed (events, counters) may use a
reserve file kept beside it. Dropped windows keep their sequence numbers (a gap the collector sees) and are
summarised in a ``telemetry_dropped`` event (:meth:`Spool.set_drop_reporter`).

``synchronous=FULL`` (the default) also keeps the last commits across a power cut; ``NORMAL`` is
faster and still survives the process being killed. One process at a time may open a spool (an
``flock`` on ``<path>.lock`` enforces it); inside that process it is safe to share between threads.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

from edgekit_runtime.agent import spool_acks, spool_space
from edgekit_runtime.agent.spool_space import DEFAULT_HEADROOM_BYTES, DEFAULT_RESERVE_BYTES, DropReporter, DropSummary
from edgekit_runtime.agent.spool_space import SpoolError as SpoolError  # re-exported: callers import it from here
from edgekit_runtime.agent.spool_space import is_disk_full as _is_disk_full

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
TELEMETRY_COUNTER = "telemetry"
_DROPPED_COUNTER = spool_space.DROPPED_COUNTER
_SCHEMA_VERSION = 1

#: The tables every spool file holds (the statements below and spool_space.DROPS_SCHEMA create them).
_TABLES = frozenset({"messages", "counters", "dropped_windows"})
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL,"
    " qos INTEGER NOT NULL, created_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


class SpoolFullError(SpoolError):
    """The spool's file system is full: the write was rolled back; it succeeds again once space is freed."""


_FREE_SPACE_HINT = "free space on the spool's file system (the agent keeps new messages in memory meanwhile)"


@dataclass(frozen=True)
class SpoolEntry:
    """One queued message; ``id`` orders entries (oldest first) and is never reused."""

    id: int
    topic: str
    payload: bytes
    qos: int
    created_at: float


class Spool:
    """A bounded, persistent FIFO of MQTT messages plus persistent counters."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        for label, value in (("max_messages", max_messages), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpoolError(f"Spool {label} must be an int >= 1, got {value!r}", hint="e.g. max_messages=10000")
        if synchronous not in ("FULL", "NORMAL"):
            raise SpoolError(f"Spool synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path = Path(path)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self._last_numbered_bytes = 4096  # the size of the last numbered payload: room to make before the next
        self._deferred_acks: set[int] = set()
        self._write_error: SpoolError | None = None
        self._window_error: SpoolFullError | None = None  # why the last window was refused, until one is stored
        self._drops = spool_space.DropReports()
        self._handed_out_upto = 0  # the largest id peek() returned
        self._lock_file = self._acquire_process_lock()
        self._space = spool_space.SpoolSpace(self.path, headroom_bytes=headroom_bytes, reserve_bytes=reserve_bytes)
        try:
            try:
                self._db = self._open_database(synchronous)
            except SpoolError as exc:  # a full disk (a leftover WAL, no room for its index): use the reserve
                if not isinstance(exc.__cause__, sqlite3.DatabaseError) or not self._space.reserve.release():
                    raise
                self._db = self._open_database(synchronous)
            # A WAL left by a crash goes into the database now; on a full disk the reserve makes the room.
            if not spool_space.checkpoint_truncate(self._db) and self._space.reserve.release():
                spool_space.checkpoint_truncate(self._db)
            self._space.keep_reserve()
            self._closed = False
            self._reload_sizes()
            # Messages already here may have been published before a restart (the broker may be holding them for
            # the collector): like those peek() hands out, they are not dropped for space, so a window is never
            # both stored and reported dropped (the 10-minute small-disk fault run counted 233 such windows).
            self._handed_out_upto = int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0])
        except BaseException:
            os.close(self._lock_file)
            raise

    # -- opening --------------------------------------------------------------------------------

    def _acquire_process_lock(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SpoolError(
                f"cannot create the spool at {self.path}: {exc.strerror}",
                hint="point the agent's spool path at a writable directory",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolError(
                f"spool {self.path} is already open in another agent process (or another Spool object)",
                hint="run one agent per spool file, or close the other Spool first",
            ) from None
        return fd

    def _open_database(self, synchronous: str) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        except sqlite3.DatabaseError as exc:
            raise SpoolError(f"cannot open the spool database {self.path}: {exc}") from exc
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise SpoolError(f"spool {self.path}: SQLite refused WAL mode (got {mode!r})",
                                 hint="put the spool on a local filesystem, not a network share")  # fmt: skip
            spool_space.configure_journal(db, self._space.wal_pages)
            db.execute(f"PRAGMA synchronous={synchronous}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise SpoolError(
                    f"spool {self.path} has format version {version}; this agent reads version {_SCHEMA_VERSION}",
                    hint="upgrade the agent, or move the old spool file away",
                )
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if version != _SCHEMA_VERSION or not _TABLES <= tables:  # a new file: its tables (a spool that has them
                # writes nothing to open: on a file system full to the last byte it still opens)
                with _transaction(db):
                    for statement in (*_SCHEMA, spool_space.DROPS_SCHEMA):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except BaseException as exc:
            db.close()
            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            if _is_disk_full(exc):  # not damaged: moving it away would lose its windows
                raise SpoolFullError(f"cannot open the spool database {self.path}: the file system is full ({exc})",
                                     hint=_FREE_SPACE_HINT) from exc  # fmt: skip
            raise SpoolError(
                f"cannot open the spool database {self.path}: {exc}",
                hint="if the file is not an edgekit spool (or is damaged), move it away; the agent creates a new one",
            ) from exc
        return db

    # -- queue ----------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes, qos: int = 1) -> int:
        """Commit one message and return its id; drop the oldest messages if now over the bound.

        Raises :class:`SpoolFullError` (nothing queued) when the file system is full."""
        payload = self._checked_payload(topic, payload, qos)

        def insert() -> int:
            with self._writing(f"cannot queue a message for {topic!r}"):
                return self._insert(topic, payload, qos)

        with self._lock:
            return self._with_room(insert, need_bytes=len(payload), vital=not topic.endswith("/telemetry"))

    def append_numbered(
        self, topic: str, make_payload: Callable[[int], bytes], *, counter: str = TELEMETRY_COUNTER, qos: int = 1
    ) -> tuple[int, int]:
        """Take the next number of ``counter``, queue ``make_payload(number)`` and return ``(id, number)``.

        Both happen in one commit: when it fails (a full disk raises :class:`SpoolFullError`) the number
        is not used, so numbers on disk have no gaps and none is handed out twice."""
        def insert() -> tuple[int, int]:
            with self._writing(f"cannot queue a numbered message for {topic!r}"):
                number = self._add_to_counter(counter, 1)
                payload = self._checked_payload(topic, make_payload(number), qos)
                return self._insert(topic, payload, qos), number

        with self._lock:
            return self._with_room(insert, need_bytes=self._last_numbered_bytes, vital=False)

    def _checked_payload(self, topic: str, payload: object, qos: int) -> bytes:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise SpoolError(f"spool payload for {topic!r} must be bytes, got {type(payload).__name__}",
                             hint="encode the message first (edgekit_runtime.agent.telemetry.encode_message)")  # fmt: skip
        if qos not in (0, 1, 2):
            raise SpoolError(f"spool qos for {topic!r} must be 0, 1 or 2, got {qos!r}")
        payload = bytes(payload)
        if len(payload) > self.max_bytes:
            raise SpoolError(
                f"message for {topic!r} is {len(payload)} bytes, more than the spool's max_bytes={self.max_bytes}",
                hint="raise the spool's max_bytes or send a smaller message",
            )
        return payload

    def _insert(self, topic: str, payload: bytes, qos: int) -> int:
        """Inside :meth:`_writing`: insert one message and keep the bound."""
        cursor = self._db.execute(
            "INSERT INTO messages (topic, payload, qos, created_at) VALUES (?, ?, ?, ?)",
            (topic, payload, qos, time.time()),
        )
        if topic.endswith("/telemetry"):
            self._last_numbered_bytes = len(payload)
        self._count += 1
        self._bytes += len(payload)
        self._enforce_bound()
        return int(cursor.lastrowid or 0)

    def _writing(self, what: str) -> _write:
        return _write(self, what)

    def _with_room(self, write: Callable[[], _T], *, need_bytes: int, vital: bool) -> _T:
        """Under the lock: keep the headroom, then ``write()``; when the file system is full anyway, make
        room (and for a ``vital`` write release the reserve) and try once more. A write that is not vital
        (a window) is refused while the headroom cannot be kept: that room is for the vital ones."""
        self._checked_db()
        if self._deferred_acks:  # delivered messages to remove first: they are the room this write needs
            spool_acks.settle_in_small_steps(self)
        self._space.keep_headroom(self, need_bytes)
        try:
            if not vital and self._space.short_by(need_bytes):
                raise _write(self, "cannot queue a window").refused_for_space(self._space.headroom_bytes)
            try:
                result = write()
            except SpoolFullError:
                self._space.recover(self, vital=vital, need_bytes=need_bytes)
                result = write()
        except SpoolFullError as exc:
            if not vital:  # windows stay refused (disk_full) until one is stored, whatever vital writes succeed
                self._window_error = exc
            raise
        if not vital and self._window_error is not None:
            logger.warning("spool %s: windows are stored again", self.path)
            self._window_error = None
        self._drops.report_if_due(self)
        return result

    @property
    def disk_full(self) -> bool:
        """Whether the last write, or the last window, failed because the file system is full (False again
        after a write succeeds and a window is stored)."""
        return isinstance(self.write_error, SpoolFullError)

    @property
    def write_error(self) -> SpoolError | None:
        """Why the last write (or window) failed; None once a write has succeeded (and a window was stored) since."""
        return self._write_error or self._window_error

    def _enforce_bound(self) -> None:
        dropped, windows = 0, None
        while self._count > self.max_messages or self._bytes > self.max_bytes:
            # Over on count: drop the surplus at once; over on bytes only: drop the oldest one.
            surplus = max(self._count - self.max_messages, 1)
            last_id, count, size = self._db.execute(
                "SELECT MAX(id), COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM "
                "(SELECT id, payload FROM messages ORDER BY id LIMIT ?)",
                (surplus,),
            ).fetchone()
            if not count:
                break
            part = spool_space.summary_of_rows(spool_space.windows_up_to(self._db, last_id), "bound")
            windows = windows if part is None else part if windows is None else windows.merged(part)
            self._db.execute("DELETE FROM messages WHERE id <= ?", (last_id,))
            self._count -= int(count)
            self._bytes -= int(size)
            dropped += int(count)
        if windows is not None:
            self._drops.record(self._db, windows)  # its report may take the bound one over, until the next append
        if dropped:
            self._add_to_counter(_DROPPED_COUNTER, dropped)
            logger.warning("spool %s over its bound: dropped the %d oldest message(s)", self.path, dropped)

    def peek(self, n: int, *, after_id: int = 0) -> list[SpoolEntry]:
        """Up to ``n`` queued messages with ``id > after_id``, oldest first; nothing is removed.

        Messages acknowledged while the disk was full (removal deferred) are left out."""
        with self._lock:
            rows = self._checked_db().execute(
                "SELECT id, topic, payload, qos, created_at FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, max(n, 0)),
            ).fetchall()
            deferred = self._deferred_acks
            if rows:  # handed to the link (maybe sent): not dropped for space, so never both stored and reported dropped
                self._handed_out_upto = max(self._handed_out_upto, int(rows[-1][0]))
        return [SpoolEntry(int(r[0]), str(r[1]), bytes(r[2]), int(r[3]), float(r[4])) for r in rows if r[0] not in deferred]

    def entries(self, entry_ids: Iterable[int]) -> list[SpoolEntry]:
        """The messages among ``entry_ids`` that are still queued, oldest first (to publish them again)."""
        ids = sorted(set(entry_ids))
        found: list[SpoolEntry] = []
        with self._lock:
            db = self._checked_db()
            for start in range(0, len(ids), spool_acks.ACK_CHUNK):
                chunk = ids[start : start + spool_acks.ACK_CHUNK]
                rows = db.execute(
                    "SELECT id, topic, payload, qos, created_at FROM messages "
                    f"WHERE id IN ({','.join('?' * len(chunk))}) ORDER BY id",
                    chunk,
                ).fetchall()
                found += [SpoolEntry(int(r[0]), str(r[1]), bytes(r[2]), int(r[3]), float(r[4]))
                          for r in rows if r[0] not in self._deferred_acks]  # fmt: skip
        return found

    def ack(self, entry_id: int) -> bool:
        """Remove message ``entry_id`` (delivered); False when it was already gone."""
        return self.ack_many([entry_id]) == 1

    def ack_many(self, entry_ids: Iterable[int]) -> int:
        """Remove several delivered messages in one commit; returns how many were still queued."""
        ids = list(entry_ids)
        if not ids:
            return 0
        removed = 0
        with self._lock:
            if self._space.short_by(self._space.headroom_bytes):  # under twice the headroom: small deletes, pages back
                self._deferred_acks.update(ids)
                return spool_acks.settle_in_small_steps(self)
            try:
                with self._writing("cannot remove acknowledged messages"):
                    for start in range(0, len(ids), spool_acks.ACK_CHUNK):
                        chunk = ids[start : start + spool_acks.ACK_CHUNK]
                        placeholders = ",".join("?" * len(chunk))
                        count, size = self._db.execute(
                            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM messages "
                            f"WHERE id IN ({placeholders})",
                            chunk,
                        ).fetchone()
                        self._db.execute(f"DELETE FROM messages WHERE id IN ({placeholders})", chunk)
                        self._count -= int(count)
                        self._bytes -= int(size)
                        removed += int(count)
            except SpoolFullError:
                # Delivered, but the delete did not fit: remembered, and removed a few at a time (below).
                self._deferred_acks.update(ids)
                return spool_acks.settle_in_small_steps(self)
        return removed

    def backlog(self) -> int:
        """Messages waiting for an acknowledgement."""
        with self._lock:
            self._checked_db()
            return self._count

    def backlog_bytes(self) -> int:
        with self._lock:
            self._checked_db()
            return self._bytes

    # -- counters -------------------------------------------------------------------------------

    def next_seq(self, counter: str = TELEMETRY_COUNTER) -> int:
        """The next number of ``counter`` (1, 2, ...), committed before it is returned."""
        def take() -> int:
            with self._writing(f"cannot take the next {counter!r} number"):
                return self._add_to_counter(counter, 1)

        with self._lock:
            return self._with_room(take, need_bytes=0, vital=True)

    def add_dropped(self, count: int) -> int:
        """Add ``count`` messages dropped before they reached the spool (e.g. an in-memory overflow)
        to :meth:`dropped_total`; returns the new total."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SpoolError(f"add_dropped count must be an int >= 0, got {count!r}")
        def add() -> int:
            with self._writing("cannot count dropped messages"):
                return self._add_to_counter(_DROPPED_COUNTER, count)

        with self._lock:
            return self._with_room(add, need_bytes=0, vital=True)

    # -- dropped windows ------------------------------------------------------------------------

    def set_drop_reporter(self, topic: str, make_payload: DropReporter, *, every_s: float = 60.0,
                          quiet_s: float = 5.0) -> None:  # fmt: skip
        """Report dropped windows by a message on ``topic`` built by ``make_payload(summary)`` (e.g.
        :func:`edgekit_runtime.agent.spool_space.drop_event_reporter`), queued after a write once no window
        was dropped for ``quiet_s``, or ``every_s`` after the first unreported drop while drops go on; a
        report still queued when space runs short is dropped and merged into the next. Without a reporter
        the summary waits in the spool (:meth:`pending_drops`)."""
        with self._lock:
            self._drops.reporter = (topic, make_payload)
            self._drops.every_s, self._drops.quiet_s = every_s, quiet_s

    def drop_windows(self, count: int, *, first_window_start: str | None = None, last_window_start: str | None = None,
                     counter: str = TELEMETRY_COUNTER, reason: str = "in_memory") -> tuple[int, int]:  # fmt: skip
        """Record ``count`` windows that never reached the spool as dropped: they take the next ``count``
        numbers of ``counter`` (a gap the collector sees), are added to :meth:`dropped_total` and to the drop
        summary. Returns the ``(first, last)`` numbers they took."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SpoolError(f"drop_windows count must be an int >= 1, got {count!r}")

        def record() -> tuple[int, int]:
            with self._writing("cannot record dropped windows"):
                last = self._add_to_counter(counter, count)
                self._add_to_counter(_DROPPED_COUNTER, count)
                summary = spool_space.seq_summary(count, last - count + 1, last, first_window_start, last_window_start,
                                                  reason)  # fmt: skip
                self._drops.record(self._db, summary)
                return last - count + 1, last

        with self._lock:
            return self._with_room(record, need_bytes=0, vital=True)

    def pending_drops(self) -> DropSummary | None:
        """Dropped windows not yet reported (always None while a reporter is set and writes succeed)."""
        with self._lock:
            return spool_space.pending_drops(self._checked_db())

    def last_seq(self, counter: str = TELEMETRY_COUNTER) -> int:
        """The last number :meth:`next_seq` handed out for ``counter`` (0 when none)."""
        return self._read_counter(counter)

    def dropped_total(self) -> int:
        """Messages dropped by the bound since the spool file was created."""
        return self._read_counter(_DROPPED_COUNTER)

    def _add_to_counter(self, name: str, amount: int) -> int:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, amount),
        )
        return int(self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0])

    def _read_counter(self, name: str) -> int:
        with self._lock:
            row = self._checked_db().execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    # -- lifetime -------------------------------------------------------------------------------

    def _reload_sizes(self) -> None:
        count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM messages").fetchone()
        self._count, self._bytes = int(count), int(size)

    def _checked_db(self) -> sqlite3.Connection:
        if self._closed:
            raise SpoolError(f"spool {self.path} is closed", hint="open a new Spool on the same path")
        return self._db

    def close(self) -> None:
        """Checkpoint and close the database, then release the process lock; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.DatabaseError as exc:  # busy: the WAL stays and is replayed on the next open
                logger.debug("spool %s: checkpoint on close failed: %s", self.path, exc)
            self._db.close()
            os.close(self._lock_file)

    def __enter__(self) -> Spool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"backlog={self._count}"
        return f"Spool({str(self.path)!r}, max_messages={self.max_messages}, max_bytes={self.max_bytes}, {state})"


class _write:
    """A write transaction on the spool: SQLite errors become :class:`SpoolError` (:class:`SpoolFullError`
    for a full disk) and are remembered in ``spool.write_error``; a commit also settles deferred acks."""

    def __init__(self, spool: Spool, what: str) -> None:
        self._spool, self._what = spool, what
        self._transaction = _transaction(spool._checked_db())

    def __enter__(self) -> sqlite3.Connection:
        spool = self._spool
        try:
            db = self._transaction.__enter__()
            if spool._deferred_acks:
                spool_acks.settle_deferred(spool)
            return db
        except sqlite3.DatabaseError as exc:
            raise self._failed(exc) from exc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        spool = self._spool
        try:
            self._transaction.__exit__(exc_type, exc, traceback)
        except sqlite3.DatabaseError as commit_exc:
            cause = exc if isinstance(exc, sqlite3.DatabaseError) else commit_exc
            raise self._failed(cause) from cause
        if exc_type is None:
            spool._deferred_acks.clear()
            if spool._write_error is not None:
                logger.warning("spool %s: writes succeed again", spool.path)
            spool._write_error = None
        elif isinstance(exc, sqlite3.DatabaseError):
            spool._reload_sizes()
            raise self._failed(exc) from exc
        else:
            spool._reload_sizes()

    def refused_for_space(self, headroom_bytes: int) -> SpoolFullError:
        error = SpoolFullError(f"spool {self._spool.path}: {self._what}: the file system is full (less than the "
                               f"{headroom_bytes} bytes kept free for commands and events)", hint=_FREE_SPACE_HINT)  # fmt: skip
        if self._spool.write_error is None:
            logger.error("%s", error.message)
        return error

    def _failed(self, exc: sqlite3.DatabaseError) -> SpoolError:
        spool = self._spool
        try:
            if spool._db.in_transaction:
                spool._db.execute("ROLLBACK")
            spool._reload_sizes()
        except sqlite3.DatabaseError:
            pass  # the next write tries again
        if _is_disk_full(exc):
            error: SpoolError = SpoolFullError(f"spool {spool.path}: {self._what}: the file system is full ({exc})",
                                               hint=_FREE_SPACE_HINT)  # fmt: skip
        else:
            error = SpoolError(f"spool {spool.path}: {self._what}: {exc}",
                               hint="check free disk space and the spool file's permissions")  # fmt: skip
        if spool._write_error is None:
            logger.error("%s", error.message)
        spool._write_error = error
        return error


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        elif self._db.in_transaction:  # SQLite may already have rolled back (e.g. SQLITE_FULL)
            self._db.execute("ROLLBACK")
