"""Removing delivered messages from a spool whose file system is full (or nearly): a few at a time.

One large delete on a file system full to the last byte never fits in the WAL: every page it rewrites goes there
first. The spool keeps a small delete reserve (``spool_space.SpoolSpace.delete_reserve``) that only this releases;
with it gone, a delete of a few messages fits, and each commit hands its freed pages back to the file system and
truncates the WAL, so it frees room for the next. The spool calls :func:`settle_in_small_steps` under its lock,
for acks that could not be removed at once (``Spool._deferred_acks``) and for every ack while it is short of
headroom.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from edgekit_runtime.agent import spool_space

logger = logging.getLogger(__name__)

#: Acks removed per statement in one commit, and per commit on a full file system.
ACK_CHUNK = 500
SMALL_ACK_CHUNK = 16


def settle_in_small_steps(spool: Any) -> int:
    """Remove ``spool``'s deferred acks a few at a time; stops at a delete that still fails (the rest stay deferred).
    Returns how many messages went."""
    removed = 0
    ids = sorted(spool._deferred_acks)
    for start in range(0, len(ids), SMALL_ACK_CHUNK):
        chunk = ids[start : start + SMALL_ACK_CHUNK]
        count = _delete_making_room(spool, chunk)
        if count is None:
            break
        removed += count
        spool._deferred_acks.difference_update(chunk)
        spool_space.checkpoint_truncate(spool._db)
    spool._reload_sizes()
    if removed:
        spool._space.delete_reserve.ensure()  # back as soon as there is room: the next full disk needs it
        logger.info("spool %s: removed %d delivered message(s) in small steps on a full file system", spool.path, removed)
    return removed


def _delete_making_room(spool: Any, chunk: list[int]) -> int | None:
    """Delete ``chunk``; on a full disk truncate the WAL (a failed transaction leaves its frames there) and try
    again, then release the delete reserve and try once more. None when it still fails."""

    def truncate() -> bool:
        spool_space.checkpoint_truncate(spool._db)
        return True

    def release() -> bool:
        return spool._space.delete_reserve.release() > 0 and truncate()

    for make_room in (lambda: True, truncate, release):
        if not make_room():
            continue
        try:
            return _delete_and_hand_back(spool._db, chunk)
        except sqlite3.DatabaseError as exc:
            if not spool_space.is_disk_full(exc):
                return None
    return None


def settle_deferred(spool: Any) -> None:
    """Inside a write transaction of ``spool``: remove the messages acknowledged while the disk was full."""
    ids = sorted(spool._deferred_acks)
    for start in range(0, len(ids), ACK_CHUNK):
        chunk = ids[start : start + ACK_CHUNK]
        spool._db.execute(f"DELETE FROM messages WHERE id IN ({','.join('?' * len(chunk))})", chunk)
    spool._reload_sizes()


def _delete_and_hand_back(db: sqlite3.Connection, ids: list[int]) -> int:
    db.execute("BEGIN IMMEDIATE")
    try:
        count = db.execute(f"DELETE FROM messages WHERE id IN ({','.join('?' * len(ids))})", ids).rowcount
        spool_space.hand_back_free_pages(db)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return int(count)


__all__ = ["ACK_CHUNK", "SMALL_ACK_CHUNK", "settle_deferred", "settle_in_small_steps"]
