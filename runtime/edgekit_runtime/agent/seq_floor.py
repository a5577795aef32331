"""Telemetry sequence numbers that outlive the spool file.

The collector stores each window once by (fleet, device, seq). A spool replaced by a new one (damaged and moved away,
deleted by hand, a fresh data partition under the same config) started its numbers at 1 again, and the collector took
every new window for a redelivery of one it already had, acknowledged it and dropped it, until the numbers passed the
old ones: weeks of windows lost without a word. So the spool keeps, in ``<spool>.seq`` beside it, a number at least
as high as any it has handed out (written :data:`RESERVE` ahead: one small write every that many windows), and a new
spool starts after it. The collector then sees a gap of at most :data:`RESERVE` numbers where the old spool ended.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

logger = logging.getLogger(__name__)

#: How far ahead of the last number handed out the kept number is written.
RESERVE = 64


class SeqFloor:
    """The highest telemetry number a spool may have handed out, kept in ``<spool path>.seq``."""

    def __init__(self, spool_path: Path) -> None:
        self.path = spool_path.with_name(spool_path.name + ".seq")
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        self.reserved = int(text) if text.isdigit() else 0

    def start(self, db: sqlite3.Connection, counter: str) -> None:
        """A spool that has handed out no number of ``counter`` yet goes on after the kept one."""
        if self.reserved and db.execute("SELECT 1 FROM counters WHERE name = ?", (counter,)).fetchone() is None:
            db.execute("INSERT INTO counters (name, value) VALUES (?, ?)", (counter, self.reserved))
            logger.warning("spool %s is new, and %s says numbers up to %d were handed out before: telemetry goes on "
                           "from %d, so the collector does not take new windows for old ones", self.path.with_suffix(""),
                           self.path.name, self.reserved, self.reserved + 1)  # fmt: skip

    def cover(self, number: int) -> None:
        """Keep a number at least ``number`` (written ahead, atomically); a failed write is logged, never raised."""
        if number <= self.reserved:
            return
        reserved = number + RESERVE - 1
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, f"{reserved}\n".encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, self.path)
        except OSError as exc:
            logger.warning("cannot keep the telemetry numbers in %s (%s); a new spool would start them at 1 again",
                           self.path, exc)  # fmt: skip
            return
        self.reserved = reserved
