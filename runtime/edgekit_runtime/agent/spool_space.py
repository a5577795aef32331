"""How the spool lives on a small disk: a bounded write-ahead log, headroom kept free, and drops summarised.

SQLite's defaults let the WAL grow to ~4 MB before a checkpoint (1,000 pages); on a 2 MB disk it filled the
file system, the checkpoint that would have shrunk it then had no room to copy pages into the database, and
the spool stayed full for good, across restarts. The spool therefore

* checkpoints every :data:`WAL_AUTOCHECKPOINT_PAGES` pages on a small file system (a 64th of it, up to
  SQLite's 1,000 from 256 MB on: fewer checkpoints and fsyncs where there is room) and cuts the WAL back to
  as many bytes, at least :data:`JOURNAL_SIZE_LIMIT_BYTES` (``PRAGMA wal_autocheckpoint`` /
  ``journal_size_limit``), and truncates
  it (``wal_checkpoint(TRUNCATE)``) whenever the file system runs short and when it opens (a leftover WAL);
* keeps :attr:`SpoolSpace.headroom_bytes` free on its file system: below that it drops its oldest telemetry
  windows and hands the pages back (``auto_vacuum=INCREMENTAL``), so the disk, not only ``max_bytes``, bounds
  the spool; events (deploy results, command answers) are never dropped for space;
* holds a :class:`~edgekit_runtime.agent.disk_reserve.DiskReserve` that vital writes (events, counters, the
  command replay record beside the spool) release when the file system is full anyway.

Windows that are dropped, from the spool or before they reached it, are summarised: their count, the range of
their sequence numbers and of their ``window_start`` go into one pending :class:`DropSummary`, which the spool
turns into a ``telemetry_dropped`` event in the same commit when a reporter is set
(:meth:`~edgekit_runtime.agent.spool.Spool.set_drop_reporter`). Dropped windows keep their numbers, so the
collector sees the gap in ``seq`` as well.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.disk_reserve import DEFAULT_RESERVE_BYTES, DiskReserve, free_bytes
from edgekit_runtime.agent.topics import TelemetryError

logger = logging.getLogger(__name__)

#: checkpoint once the WAL holds this many pages on a small file system (SQLite's default is 1,000: ~4 MB)
WAL_AUTOCHECKPOINT_PAGES = 32
WAL_AUTOCHECKPOINT_MAX_PAGES = 1000
#: after a checkpoint the WAL file is cut back to at most this many bytes
JOURNAL_SIZE_LIMIT_BYTES = 128 * 1024
#: free space the spool keeps on its file system (beyond its reserve) before it drops its oldest windows
DEFAULT_HEADROOM_BYTES = 256 * 1024
#: the messages that may be dropped for space: telemetry windows, and earlier drop reports (merged into the
#: next one); other events (deploy results, command answers) are kept
_DROPPABLE = ("(topic LIKE '%/telemetry' OR (topic LIKE '%/events' AND "
              "instr(payload, CAST('\"kind\":\"telemetry_dropped\"' AS BLOB)) > 0))")
#: the event kind that reports dropped windows
EVENT_TELEMETRY_DROPPED = "telemetry_dropped"
_RESERVE_CHECK_S = 1.0
#: the spool's counter of dropped messages (``Spool.dropped_total``)
DROPPED_COUNTER = "dropped"

DROPS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS dropped_windows (id INTEGER PRIMARY KEY CHECK (id = 1), windows INTEGER NOT NULL,"
    " first_seq INTEGER, last_seq INTEGER, first_window_start TEXT, last_window_start TEXT, reasons TEXT NOT NULL,"
    " seq_ranges TEXT NOT NULL DEFAULT '[]')"
)



class SpoolError(TelemetryError):
    """The spool file cannot be opened, is in use, or a message cannot be queued (defined here, below
    :mod:`~edgekit_runtime.agent.spool`, which re-exports it: the space checks raise it too)."""


@dataclass(frozen=True)
class DropSummary:
    """Telemetry windows dropped and not yet reported: how many, their seqs and window starts, and why
    (``disk_full``: no room on the file system; ``bound``: over ``max_messages``/``max_bytes``;
    ``in_memory``: dropped while waiting for the spool to be writable). ``seq_ranges`` lists the dropped
    seqs exactly (``(first, last)`` runs, never a stored seq); ``first_seq``/``last_seq`` are their span. A
    summary of more than :data:`MAX_SEQ_RANGES` runs is reported at once, as several events of at most that many
    (:meth:`parts`)."""

    windows: int
    first_seq: int | None
    last_seq: int | None
    first_window_start: str | None
    last_window_start: str | None
    reasons: tuple[str, ...]
    seq_ranges: tuple[tuple[int, int], ...] = ()

    def merged(self, other: DropSummary) -> DropSummary:
        def low(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else min(a, b)

        def high(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else max(a, b)

        return DropSummary(
            self.windows + other.windows, low(self.first_seq, other.first_seq), high(self.last_seq, other.last_seq),
            low(self.first_window_start, other.first_window_start), high(self.last_window_start, other.last_window_start),
            tuple(sorted(set(self.reasons) | set(other.reasons))), _joined(self.seq_ranges + other.seq_ranges),
        )  # fmt: skip

    def parts(self) -> list[DropSummary]:
        """This summary as reports of at most :data:`MAX_SEQ_RANGES` runs each, the windows counted per part (a
        remainder without seqs goes to the last part); the window starts are the whole summary's."""
        if len(self.seq_ranges) <= MAX_SEQ_RANGES:
            return [self]
        chunks = [self.seq_ranges[i : i + MAX_SEQ_RANGES] for i in range(0, len(self.seq_ranges), MAX_SEQ_RANGES)]
        counts = [sum(last - first + 1 for first, last in chunk) for chunk in chunks]
        counts[-1] += max(self.windows - sum(counts), 0)
        return [DropSummary(count, chunk[0][0], chunk[-1][1], self.first_window_start, self.last_window_start, self.reasons,
                            chunk) for chunk, count in zip(chunks, counts)]  # fmt: skip

    def to_details(self) -> dict[str, Any]:
        return {
            "windows": self.windows, "first_seq": self.first_seq, "last_seq": self.last_seq,
            "first_window_start": self.first_window_start, "last_window_start": self.last_window_start,
            "reasons": list(self.reasons), "seq_ranges": [list(run) for run in self.seq_ranges],
        }  # fmt: skip

    def describe(self) -> str:
        seqs = "" if self.first_seq is None else f" (seq {self.first_seq}-{self.last_seq})"
        span = "" if self.first_window_start is None else f", windows from {self.first_window_start} to {self.last_window_start}"
        return f"{self.windows} telemetry window(s) dropped{seqs}{span}: {', '.join(self.reasons)}"


DropReporter = Callable[[DropSummary], bytes]
#: how many runs of dropped seqs a summary lists
MAX_SEQ_RANGES = 64


def _joined(runs: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Sorted, overlapping and adjacent runs merged (never across a gap: a gap is stored seqs)."""
    merged: list[list[int]] = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return tuple((first, last) for first, last in merged)


def seq_summary(count: int, first: int, last: int, first_start: str | None, last_start: str | None,
                reason: str) -> DropSummary:  # fmt: skip
    """``count`` windows numbered ``first``..``last`` dropped for ``reason``."""
    return DropSummary(count, first, last, first_start, last_start, (reason,), ((first, last),))


def drop_event_reporter(*, device: str, fleet: str) -> DropReporter:
    """A reporter for :meth:`Spool.set_drop_reporter`: the summary as an ``event.v1`` ``telemetry_dropped``."""
    from edgekit_runtime.agent.telemetry import build_event, encode_message

    def report(summary: DropSummary) -> bytes:
        event = build_event(device=device, fleet=fleet, kind=EVENT_TELEMETRY_DROPPED, level="warning",
                            message=summary.describe(), details=summary.to_details())  # fmt: skip
        return encode_message(event)

    return report


def summary_of(payload: bytes, reason: str) -> DropSummary:
    """What dropping one spooled message drops: a telemetry window (its seq and window start), or an earlier
    drop report (its summary, to be reported again in the next one)."""
    try:
        message = json.loads(payload)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        return DropSummary(1, None, None, None, None, (reason,))
    details = message.get("details")
    if message.get("kind") == EVENT_TELEMETRY_DROPPED and isinstance(details, dict):
        runs = tuple((int(a), int(b)) for a, b in details.get("seq_ranges") or ())
        return DropSummary(int(details.get("windows") or 0), details.get("first_seq"), details.get("last_seq"),
                           details.get("first_window_start"), details.get("last_window_start"),
                           tuple(str(r) for r in details.get("reasons") or ()), runs)  # fmt: skip
    seq, start = message.get("seq"), window_start_of(message)
    if not isinstance(seq, int):
        return DropSummary(1, None, None, None, None, (reason,))
    return seq_summary(1, seq, seq, start, start, reason)


def window_start_of(message: dict[str, Any]) -> str | None:
    """When a ``telemetry.v1`` window began (``window.start``; ``window_start`` in older payloads), else None."""
    window = message.get("window")
    start = window.get("start") if isinstance(window, dict) else None
    if start is None:
        start = message.get("window_start")
    return start if isinstance(start, str) else None


def summary_of_rows(rows: list[tuple[bytes]], reason: str) -> DropSummary | None:
    """The summary of dropped droppable rows (their payloads); None for none."""
    summary = None
    for (payload,) in rows:
        part = summary_of(bytes(payload), reason)
        summary = part if summary is None else summary.merged(part)
    return summary


class DropReports:
    """When the spool reports its pending drops (see :meth:`~edgekit_runtime.agent.spool.Spool.set_drop_reporter`)."""

    def __init__(self) -> None:
        self.reporter: tuple[str, DropReporter] | None = None
        self.every_s, self.quiet_s = 60.0, 5.0
        self._pending_since: float | None = None  # monotonic time of the first drop not yet reported
        self._last_drop_at = 0.0
        self._checked = False  # whether drops left pending by an earlier run were looked for

    def record(self, db: sqlite3.Connection, summary: DropSummary | None) -> None:
        """Inside a write: add ``summary`` to the pending drops."""
        if summary is None:
            return
        add_pending_drops(db, summary)
        self._last_drop_at = time.monotonic()
        if self._pending_since is None:
            self._pending_since = self._last_drop_at

    def report_if_due(self, spool: Any) -> None:
        """Under the spool's lock, after a write: queue the report when one is due."""

        if self.reporter is None:
            return
        now = time.monotonic()
        if self._pending_since is None:
            if self._checked:
                return  # nothing dropped since the last report
        elif now - self._last_drop_at < self.quiet_s and now - self._pending_since < self.every_s and \
                not self._many_runs(spool):  # fmt: skip
            return
        topic, make_payload = self.reporter
        try:
            with spool._writing("cannot queue the report of dropped windows"):
                pending = pending_drops(spool._db)
                for part in pending.parts() if pending is not None else ():
                    spool._db.execute("INSERT INTO messages (topic, payload, qos, created_at) VALUES (?, ?, 1, ?)",
                                      (topic, make_payload(part), time.time()))  # fmt: skip
                if pending is not None:
                    spool._reload_sizes()
                    clear_pending_drops(spool._db)
                    logger.warning("spool %s: %s", spool.path, pending.describe())
        except SpoolError:
            return  # the summary stays pending; the next write tries again
        self._checked, self._pending_since = True, None

    def _many_runs(self, spool: Any) -> bool:
        """Whether the pending drops already fill a report's runs (report them now, before they grow)."""
        pending = pending_drops(spool._db)
        return pending is not None and len(pending.seq_ranges) >= MAX_SEQ_RANGES


# -- inside a write transaction ----------------------------------------------------------------------


def pending_drops(db: sqlite3.Connection) -> DropSummary | None:
    row = db.execute("SELECT windows, first_seq, last_seq, first_window_start, last_window_start, reasons, seq_ranges "
                     "FROM dropped_windows WHERE id = 1").fetchone()  # fmt: skip
    if row is None or not row[0]:
        return None
    runs = tuple((int(a), int(b)) for a, b in json.loads(row[6] or "[]"))
    return DropSummary(int(row[0]), row[1], row[2], row[3], row[4], tuple(r for r in str(row[5]).split(",") if r), runs)


def add_pending_drops(db: sqlite3.Connection, summary: DropSummary) -> DropSummary:
    """Merge ``summary`` into the pending one; returns the merged summary."""
    pending = pending_drops(db)
    merged = summary if pending is None else pending.merged(summary)
    db.execute("INSERT OR REPLACE INTO dropped_windows (id, windows, first_seq, last_seq, first_window_start, "
               "last_window_start, reasons, seq_ranges) VALUES (1, ?, ?, ?, ?, ?, ?, ?)",
               (merged.windows, merged.first_seq, merged.last_seq, merged.first_window_start, merged.last_window_start,
                ",".join(merged.reasons), json.dumps([list(run) for run in merged.seq_ranges])))  # fmt: skip
    return merged


def clear_pending_drops(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM dropped_windows WHERE id = 1")


def oldest_windows_for(db: sqlite3.Connection, need_bytes: int, *, after_id: int = 0) -> list[tuple[int, bytes]]:
    """The oldest droppable rows ``(id, payload)`` after ``after_id`` (those before were handed to the link)
    whose payloads add up to ``need_bytes`` (at least one, when there is one)."""
    found: list[tuple[int, bytes]] = []
    total = 0
    query = f"SELECT id, payload FROM messages WHERE {_DROPPABLE} AND id > ? ORDER BY id LIMIT 64"
    after = after_id
    while total < need_bytes or not found:
        rows = db.execute(query, (after,)).fetchall()
        if not rows:
            break
        for entry_id, payload in rows:
            found.append((int(entry_id), bytes(payload)))
            total += len(payload) + 64  # the row's own overhead
            after = int(entry_id)
            if total >= need_bytes:
                break
    return found


def windows_up_to(db: sqlite3.Connection, last_id: int) -> list[tuple[bytes]]:
    """Payloads of the telemetry rows with ``id <= last_id`` (about to be dropped by the bound)."""
    return db.execute(f"SELECT payload FROM messages WHERE {_DROPPABLE} AND id <= ?", (last_id,)).fetchall()


# -- the database's journal -------------------------------------------------------------------------


#: The delete reserve (see SpoolSpace): enough WAL for a small delete and the incremental vacuum after it.
DELETE_RESERVE_NAME = ".edgekit-delete-reserve"
DELETE_RESERVE_BYTES = 64 * 1024


def is_disk_full(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed for want of space (SQLITE_FULL)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == sqlite3.SQLITE_FULL)
    return "disk is full" in str(exc)


def wal_pages_for(file_system_bytes: int) -> int:
    """The WAL's checkpoint size in (4 KiB) pages for a file system this large: a 64th of it, 32 to 1,000."""
    return min(WAL_AUTOCHECKPOINT_MAX_PAGES, max(WAL_AUTOCHECKPOINT_PAGES, file_system_bytes // 64 // 4096))


def configure_journal(db: sqlite3.Connection, wal_pages: int = WAL_AUTOCHECKPOINT_PAGES) -> None:
    """Bound the WAL (called right after ``journal_mode=WAL``) and let freed pages go back to the disk."""
    db.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
    db.execute(f"PRAGMA journal_size_limit={max(JOURNAL_SIZE_LIMIT_BYTES, wal_pages * 4096)}")
    # Debian's SQLite zeroes every freed page (secure_delete=ON): removing acknowledged windows then writes each
    # freed page to the WAL, more than a small disk has. FAST zeroes only what the commit writes anyway.
    db.execute("PRAGMA secure_delete=FAST")
    if int(db.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect now on a new file, after VACUUM on an old one
        if int(db.execute("PRAGMA page_count").fetchone()[0]) > 0:
            try:
                db.execute("VACUUM")
            except sqlite3.DatabaseError as exc:  # no room for the copy: pages are reused, only not handed back
                logger.info("spool: VACUUM to enable incremental vacuum failed (%s); freed pages stay in the file", exc)


def checkpoint_truncate(db: sqlite3.Connection) -> bool:
    """Copy the WAL into the database and truncate it to 0 bytes; False when that failed (busy or no room)."""
    try:
        row = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.DatabaseError as exc:
        logger.debug("WAL checkpoint failed: %s", exc)
        return False
    return row is not None and int(row[0]) == 0


def hand_back_free_pages(db: sqlite3.Connection) -> None:
    """Return the database's free pages to the file system (needs ``auto_vacuum=INCREMENTAL``)."""
    db.execute("PRAGMA incremental_vacuum").fetchall()  # each row is one page freed: run it to the end


class SpoolSpace:
    """The spool's view of its file system: free space, the headroom it keeps, its reserve."""

    def __init__(self, spool_path: Path, *, headroom_bytes: int, reserve_bytes: int) -> None:
        self.directory = spool_path.parent
        try:  # on a tiny file system both shrink to an eighth of it each
            stats = os.statvfs(self.directory)
            size = int(stats.f_blocks) * int(stats.f_frsize)
        except OSError:
            size = 1 << 62
        eighth = size // 8
        self.wal_pages = wal_pages_for(size)
        self.headroom_bytes = min(max(int(headroom_bytes), 0), eighth)
        self.reserve = DiskReserve(self.directory, min(max(int(reserve_bytes), 0), eighth))
        # Vital writes may take the whole file system, the reserve included; removing delivered messages then needs
        # room in the WAL for even a small delete. This one is released only for that, so the spool always gets out.
        self.delete_reserve = DiskReserve(self.directory, min(DELETE_RESERVE_BYTES, size // 32) if self.reserve.size_bytes else 0,
                                          name=DELETE_RESERVE_NAME, purpose="removing delivered messages")  # fmt: skip
        self._next_reserve_check = 0.0

    def free(self) -> int:
        try:
            return free_bytes(self.directory)
        except OSError:
            return 1 << 62  # cannot tell: do not drop anything for space

    def short_by(self, extra_bytes: int = 0) -> int:
        """How many bytes are missing to the headroom (plus ``extra_bytes``); 0 when there is enough."""
        if self.headroom_bytes == 0:
            return 0
        return max(self.headroom_bytes + extra_bytes - self.free(), 0)

    def keep_reserve(self) -> None:
        """Put the reserve back when it was released and there is room for it and the headroom (throttled)."""
        now = time.monotonic()
        if now < self._next_reserve_check:
            return
        self._next_reserve_check = now + _RESERVE_CHECK_S
        if self.delete_reserve.ensure():  # first: it is what gets a spool out of a file system full to the last byte
            self.reserve.ensure(keep_free_bytes=self.headroom_bytes)


    # -- making room (called by the spool under its lock, outside a transaction) ---------------------

    def keep_headroom(self, spool: Any, extra_bytes: int) -> None:
        """Before a write of ``extra_bytes``: when the file system is short of the headroom, truncate the WAL,
        hand back the pages acknowledged messages left free, then drop the spool's oldest windows (summarised)
        and hand their pages back, until it is not."""
        if self.short_by(extra_bytes) == 0:
            self.keep_reserve()
            return
        checkpoint_truncate(spool._db)
        if int(spool._db.execute("PRAGMA freelist_count").fetchone()[0]) > 0:
            self.hand_back(spool)
        for _ in range(8):
            short = self.short_by(extra_bytes)
            if short == 0 or not self.drop_windows_for(spool, short + self.headroom_bytes // 4):  # a margin: fewer rounds
                break
        self.keep_reserve()

    def hand_back(self, spool: Any) -> None:
        """Return the database's free pages to the file system (one commit, then a WAL truncation)."""

        try:
            with spool._writing("cannot hand free pages back to the file system"):
                hand_back_free_pages(spool._db)
        except SpoolError:
            return
        checkpoint_truncate(spool._db)

    def drop_windows_for(self, spool: Any, need_bytes: int) -> int:
        """Drop the oldest telemetry windows worth ``need_bytes`` in one commit, hand their pages back to the
        file system and truncate the WAL; returns how many windows were dropped."""

        try:
            with spool._writing("cannot drop old windows to make room"):
                rows = oldest_windows_for(spool._db, need_bytes, after_id=spool._handed_out_upto)
                if not rows:
                    return 0
                ids = [entry_id for entry_id, _ in rows]
                spool._db.execute(f"DELETE FROM messages WHERE id IN ({','.join('?' * len(ids))})", ids)
                spool._reload_sizes()
                summary = summary_of_rows([(payload,) for _, payload in rows], "disk_full")
                spool._add_to_counter(DROPPED_COUNTER, sum(1 for _, p in rows if b'"kind":"telemetry_dropped"' not in p))
                spool._drops.record(spool._db, summary)
                hand_back_free_pages(spool._db)
        except SpoolError:
            return 0
        logger.info("spool %s: file system short of its %d bytes of headroom: dropped the %d oldest window(s)",
                       spool.path, self.headroom_bytes, len(rows))  # fmt: skip
        checkpoint_truncate(spool._db)
        return len(rows)

    def recover(self, spool: Any, *, vital: bool, need_bytes: int) -> None:
        """After a write failed for want of space, before its one more try: truncate the WAL, drop old windows,
        and for a vital write release the reserve when the file system is still short of ``need_bytes``."""
        need_bytes = max(need_bytes, 16 * 1024)
        checkpoint_truncate(spool._db)
        if self.headroom_bytes and self.free() < need_bytes:  # headroom 0: the spool keeps no space, drops nothing
            self.drop_windows_for(spool, need_bytes)
        if vital and self.free() < need_bytes and self.reserve.release():
            checkpoint_truncate(spool._db)


__all__ = ["DEFAULT_RESERVE_BYTES", "DROPS_SCHEMA", "DropSummary", "SpoolSpace", "drop_event_reporter",
           "window_start_of"]
