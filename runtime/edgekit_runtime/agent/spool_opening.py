"""Opening the telemetry spool at the agent's start, so that the agent starts whatever the spool file's state.

* A full file system (no room for a new spool, its lock file or its WAL): the agent runs with its in-memory
  outbox (:mod:`~edgekit_runtime.agent.service_outbox`) behind a :class:`PendingSpool`, which refuses writes
  with :class:`~edgekit_runtime.agent.spool.SpoolFullError` (so messages wait in memory) and opens the real
  spool at the first write after :data:`REOPEN_EVERY_S`, once there is room.
* A damaged file (not an SQLite database, or a malformed one): it is moved aside, with its ``-wal`` and
  ``-shm`` files, as ``<spool>.corrupt-<UTC time>``, a new spool is made, and a ``spool_replaced`` warning event
  names the moved file.

Any other failure (the spool open in another agent, a newer format, a read-only folder) still stops the start:
those need the operator.
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.spool import Spool, SpoolFullError
from edgekit_runtime.agent.spool_space import SpoolError

logger = logging.getLogger(__name__)

#: How often a :class:`PendingSpool` tries to open the real spool (at a write) while the disk is full.
REOPEN_EVERY_S = 5.0
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DAMAGE_MESSAGES = ("file is not a database", "database disk image is malformed")
_SIDE_FILES = ("", "-wal", "-shm")

#: ``(kind, level, message, details)`` of an event about the spool.
SpoolNotice = Callable[[str, str, str, dict[str, Any]], None]


def _disk_full(err: SpoolError) -> bool:
    cause = err.__cause__
    return isinstance(err, SpoolFullError) or (isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS)


def _damaged(err: SpoolError) -> bool:
    cause = err.__cause__
    return isinstance(cause, sqlite3.DatabaseError) and any(text in str(cause) for text in _DAMAGE_MESSAGES)


def move_aside(path: Path) -> Path:
    """Move the damaged spool ``path`` (and its ``-wal``, ``-shm``) to ``<path>.corrupt-<UTC time>``; returns it."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in _SIDE_FILES:
        source = path.with_name(path.name + suffix)
        if source.exists():
            os.replace(source, moved.with_name(moved.name + suffix))
    return moved


def open_spool(path: Path, *, max_messages: int, max_bytes: int, notice: SpoolNotice) -> Spool | PendingSpool:
    """The spool at ``path``; a :class:`PendingSpool` on a full disk; a new spool when the file is damaged."""

    def make() -> Spool:
        return Spool(path, max_messages=max_messages, max_bytes=max_bytes)

    try:
        return make()
    except SpoolError as err:
        if _disk_full(err):
            notice("spool_unavailable", "warning", f"the telemetry spool {path} cannot be opened, the file system is "
                   f"full ({err.message}); telemetry and events wait in memory and the spool is opened again once "
                   "there is room", {"path": str(path), "error": str(err), "hint": "free space on the spool's file system"})  # fmt: skip
            return PendingSpool(path, make, max_messages=max_messages, error=err)
        if not _damaged(err):
            raise
        try:
            moved = move_aside(path)
        except OSError as move_err:
            raise SpoolError(f"the telemetry spool {path} is damaged ({err.__cause__}) and cannot be moved aside: "
                             f"{move_err.strerror or move_err}",
                             hint=f"move {path} away by hand; the agent creates a new one") from err  # fmt: skip
        notice("spool_replaced", "warning", f"the telemetry spool {path} was damaged ({err.__cause__}): moved to {moved} "
               "and a new, empty spool made; messages queued in the old one were not sent",
               {"path": str(path), "moved_to": str(moved), "error": str(err.__cause__)})  # fmt: skip
        logger.warning("damaged spool %s moved to %s", path, moved)
        try:
            return make()
        except SpoolError as again:
            if not _disk_full(again):
                raise
            return PendingSpool(path, make, max_messages=max_messages, error=again)


class PendingSpool:
    """The spool's stand-in while its file system is full: it holds nothing, refuses every write (the outbox keeps
    messages in memory), and opens the real spool at a write once :data:`REOPEN_EVERY_S` has passed and there is
    room; from then on everything goes to the real spool."""

    def __init__(self, path: Path, make: Callable[[], Spool], *, max_messages: int, error: SpoolError) -> None:
        self.path = Path(path)
        self.max_messages = max_messages
        self._make = make
        self._error = error if isinstance(error, SpoolFullError) else SpoolFullError(error.message, hint=error.hint)
        self._lock = threading.Lock()
        self._real: Spool | None = None
        self._next_try = time.monotonic() + REOPEN_EVERY_S
        self._drop_reporter: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._closed = False

    @property
    def real(self) -> Spool | None:
        """The real spool, once opened."""
        return self._real

    def _open(self, *, now: bool = False) -> Spool | None:
        with self._lock:
            if self._real is not None or self._closed:
                return self._real
            if not now and time.monotonic() < self._next_try:
                return None
            self._next_try = time.monotonic() + REOPEN_EVERY_S
            try:
                spool = self._make()
            except SpoolError as err:
                if not _disk_full(err):
                    logger.error("the telemetry spool %s still cannot be opened: %s", self.path, err)
                self._error = err if isinstance(err, SpoolFullError) else SpoolFullError(err.message, hint=err.hint)
                return None
            if self._drop_reporter is not None:
                args, kwargs = self._drop_reporter
                spool.set_drop_reporter(*args, **kwargs)
            logger.info("telemetry spool %s opened: there is room again", self.path)
            self._real = spool
            return spool

    def try_open(self) -> bool:
        """Try to open the real spool now; True once it is open."""
        return self._open(now=True) is not None

    def _writer(self) -> Spool:
        spool = self._open()
        if spool is None:
            raise SpoolFullError(self._error.message, hint=self._error.hint)
        return spool

    # -- writes: refused until the real spool opens -------------------------------------------------------

    def append(self, *args: Any, **kwargs: Any) -> Any:
        return self._writer().append(*args, **kwargs)

    def append_numbered(self, *args: Any, **kwargs: Any) -> Any:
        return self._writer().append_numbered(*args, **kwargs)

    def add_dropped(self, *args: Any, **kwargs: Any) -> Any:
        return self._writer().add_dropped(*args, **kwargs)

    def drop_windows(self, *args: Any, **kwargs: Any) -> Any:
        return self._writer().drop_windows(*args, **kwargs)

    def set_drop_reporter(self, *args: Any, **kwargs: Any) -> None:
        self._drop_reporter = (args, kwargs)
        if self._real is not None:
            self._real.set_drop_reporter(*args, **kwargs)

    # -- reads: empty until then -------------------------------------------------------------------------

    @property
    def write_error(self) -> SpoolError | None:
        return self._error if self._real is None else self._real.write_error

    @property
    def disk_full(self) -> bool:
        return True if self._real is None else self._real.disk_full

    def peek(self, n: int, *, after_id: int = 0) -> list[Any]:
        return [] if self._real is None else self._real.peek(n, after_id=after_id)

    def entries(self, entry_ids: Any) -> list[Any]:
        return [] if self._real is None else self._real.entries(entry_ids)

    def ack(self, entry_id: int) -> bool:
        return False if self._real is None else self._real.ack(entry_id)

    def ack_many(self, entry_ids: Any) -> int:
        return 0 if self._real is None else self._real.ack_many(entry_ids)

    def backlog(self) -> int:
        return 0 if self._real is None else self._real.backlog()

    def backlog_bytes(self) -> int:
        return 0 if self._real is None else self._real.backlog_bytes()

    def last_seq(self, *args: Any, **kwargs: Any) -> int:
        return 0 if self._real is None else self._real.last_seq(*args, **kwargs)

    def dropped_total(self) -> int:
        return 0 if self._real is None else self._real.dropped_total()

    def pending_drops(self) -> Any:
        return None if self._real is None else self._real.pending_drops()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._real is not None:
                self._real.close()
