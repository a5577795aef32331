"""Replay protection for fleet commands: a bounded window of what the agent has seen, kept on disk.

A command is carried out only when

* its ``issued_at`` lies within ``window_s`` before now and at most ``max_clock_skew_s`` after now
  (a command without ``issued_at`` is refused unless ``require_issued_at`` is off; then its id is
  remembered for ``window_s`` from its arrival, and a replay after that would run again), and
* its ``id`` was not seen inside the window, in this run or an earlier one, and
* its ``issued_at`` is later than :attr:`ReplayWindow.floor`: when more than ``max_entries`` records
  would be kept, the oldest are forgotten and the floor rises to the newest ``issued_at`` forgotten,
  so a flood of commands shortens the window instead of opening it.

The record is SQLite (WAL, ``synchronous=FULL``) next to the spool, so it survives a restart and a
power cut. Besides ids it keeps digests of payloads the agent answered (``remember_payload``), so a
*retained* command, which the broker hands over on every connect, is recognised and not answered
again, even when it was too malformed to have an id.

On a full disk the record still takes new commands: its WAL is kept small (the spool's limits), and a
write that fails for want of space releases the disk reserve the spool keeps beside it
(:class:`~edgekit_runtime.agent.disk_reserve.DiskReserve`) and is tried once more.

Ids are recorded before the command runs: a command is carried out at most once; one lost to a crash
in between is re-sent by the host with a fresh id.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from edgekit_runtime.agent.disk_reserve import DiskReserve
from edgekit_runtime.agent.spool_space import is_disk_full as _is_disk_full
from edgekit_runtime.agent.topics import TelemetryError

logger = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 24 * 3600.0
DEFAULT_MAX_CLOCK_SKEW_S = 300.0
DEFAULT_MAX_ENTRIES = 10_000
_ID_PREFIX = "id:"
_PAYLOAD_PREFIX = "payload:"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, issued_at REAL, seen_at REAL NOT NULL,"
    " expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS seen_expiry ON seen (expires_at)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value REAL NOT NULL)",
)


class ReplayError(TelemetryError):
    """The replay record cannot be opened or written, or its policy is invalid."""


@dataclass(frozen=True)
class ReplayPolicy:
    """How old and how far ahead a command's ``issued_at`` may be, and how many records are kept."""

    window_s: float = DEFAULT_WINDOW_S
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    require_issued_at: bool = True
    max_entries: int = DEFAULT_MAX_ENTRIES

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not self.max_clock_skew_s >= 0:
            raise ReplayError(f"replay window_s must be > 0 and max_clock_skew_s >= 0, got {self.window_s!r} and "
                              f"{self.max_clock_skew_s!r}", hint="e.g. window_s=86400, max_clock_skew_s=300")  # fmt: skip
        if isinstance(self.max_entries, bool) or not isinstance(self.max_entries, int) or self.max_entries < 1:
            raise ReplayError(f"replay max_entries must be an int >= 1, got {self.max_entries!r}", hint="e.g. 10000")


@dataclass(frozen=True)
class Refusal:
    """Why a command is not carried out: ``reason`` is ``replayed``, ``expired``, ``future`` or
    ``missing_issued_at``; ``message`` says what and how to fix it."""

    reason: str
    message: str


_FRACTION = re.compile(r"\.([0-9]{1,6})(?=[+-]|$)")


def parse_issued_at(text: str) -> float:
    """Seconds since the epoch of a ``command.v1`` ``issued_at`` (``2026-01-02T03:04:05.123Z``)."""
    # Python 3.10's fromisoformat takes a fraction of exactly 3 or 6 digits; the schema allows 1 to 6.
    normalised = _FRACTION.sub(lambda match: "." + match.group(1).ljust(6, "0"), text.replace("Z", "+00:00"), count=1)
    try:
        parsed = datetime.fromisoformat(normalised)
    except ValueError as err:
        raise ReplayError(f"issued_at {text[:40]!r} is not a UTC time", hint="use e.g. 2026-01-02T03:04:05Z") from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReplayWindow:
    """The persisted record of command ids and answered payloads; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], policy: ReplayPolicy | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.path = Path(path)
        self.policy = policy or ReplayPolicy()
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            try:
                self._configure()
            except sqlite3.Error as err:  # a full disk at start (a leftover WAL, no room for its index)
                if not _is_disk_full(err) or not self._release_reserve():
                    raise
                self._configure()
        except (OSError, sqlite3.Error) as err:
            raise ReplayError(f"cannot open the command replay record {self.path}: {err}",
                              hint="point commands.replay_path at a writable file (default: next to the spool)") from err  # fmt: skip

    # -- checks ---------------------------------------------------------------------------------

    @property
    def floor(self) -> float:
        """Commands issued at or before this time (epoch seconds) are refused: their records were evicted."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = 'floor'").fetchone()
        return float(row[0]) if row else float("-inf")

    def admit(self, command_id: str, issued_at: str | None, *, payload_digest: str | None = None) -> Refusal | None:
        """Check a command and, when it may run, record its id, and its payload's digest when given, in one
        commit before this returns. Returns ``None`` to run it, or the :class:`Refusal`."""
        now = self._clock()
        policy = self.policy
        if issued_at is None:
            if policy.require_issued_at:
                return Refusal("missing_issued_at", "command has no issued_at, which this agent requires to refuse "
                               "replays; send issued_at (UTC, e.g. 2026-01-02T03:04:05Z) or set "
                               "commands.require_issued_at: false")  # fmt: skip
            issued = None
        else:
            issued = parse_issued_at(issued_at)
            if issued < now - policy.window_s:
                return Refusal("expired", f"command issued at {issued_at} is older than the replay window of "
                               f"{policy.window_s:g} s (device time {_utc(now)}); send a new command, or check the "
                               "device clock (NTP)")  # fmt: skip
            if issued > now + policy.max_clock_skew_s:
                return Refusal("future", f"command issued at {issued_at} is more than {policy.max_clock_skew_s:g} s "
                               f"ahead of the device clock ({_utc(now)}); check the clocks of host and device (NTP)")  # fmt: skip
        with self._lock:
            row = self._db.execute("SELECT seen_at FROM seen WHERE key = ? AND expires_at >= ?",
                                   (_ID_PREFIX + command_id, now)).fetchone()  # fmt: skip
            if row is not None:
                return Refusal("replayed", f"command id {command_id[:64]!r} was already received at {_utc(row[0])}; "
                               "it is not run twice (a replay or a redelivery): send a new command with a fresh id")  # fmt: skip
            floor = self._floor_locked()
            if issued is not None and issued <= floor:
                return Refusal("expired", f"command issued at {issued_at} is not after {_utc(floor)}, the oldest time "
                               f"this agent still remembers (over {policy.max_entries} commands arrived inside the "
                               "window); send a new command")  # fmt: skip
            expires = (issued if issued is not None else now) + policy.window_s
            records = [(_ID_PREFIX + command_id, issued, expires)]
            if payload_digest is not None:
                records.append((_PAYLOAD_PREFIX + payload_digest, None, now + policy.window_s))
            self._insert_locked(records, now)
        return None

    def remember_payload(self, digest: str) -> None:
        """Record that the payload with this sha256 was answered (for :meth:`payload_seen`)."""
        now = self._clock()
        with self._lock:
            self._insert_locked([(_PAYLOAD_PREFIX + digest, None, now + self.policy.window_s)], now)

    def payload_seen(self, digest: str) -> bool:
        """Whether a payload with this sha256 was answered inside the window."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM seen WHERE key = ? AND expires_at >= ?",
                                   (_PAYLOAD_PREFIX + digest, self._clock())).fetchone()  # fmt: skip
        return row is not None

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM seen").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReplayWindow:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- storage --------------------------------------------------------------------------------

    def _configure(self) -> None:
        from edgekit_runtime.agent.spool_space import JOURNAL_SIZE_LIMIT_BYTES, WAL_AUTOCHECKPOINT_PAGES

        if str(self.path) == ":memory:":
            for statement in _SCHEMA:
                self._db.execute(statement)
            return
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        self._db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
        self._db.execute("PRAGMA secure_delete=FAST")  # pruning must not write every freed page (see spool_space)
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # a WAL left by a crash

    def _release_reserve(self) -> bool:
        """The disk is full: free the spool's reserve beside this record (True when there was one)."""
        if str(self.path) == ":memory:" or not DiskReserve.beside(self.path).release():
            return False
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            pass  # the retry says whether there is room now
        return True

    def _floor_locked(self) -> float:
        row = self._db.execute("SELECT value FROM meta WHERE name = 'floor'").fetchone()
        return float(row[0]) if row else float("-inf")

    def _insert_locked(self, records: list[tuple[str, float | None, float]], now: float) -> None:
        """Store ``(key, issued_at, expires_at)`` records in one commit, pruning and evicting as needed; on a
        full disk release the reserve and try once more."""
        try:
            self._try_insert_locked(records, now)
        except ReplayError as err:
            if not isinstance(err.__cause__, sqlite3.Error) or not _is_disk_full(err.__cause__):
                raise
            if not self._release_reserve():
                raise
            self._try_insert_locked(records, now)

    def _try_insert_locked(self, records: list[tuple[str, float | None, float]], now: float) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM seen WHERE expires_at < ?", (now,))
            self._db.executemany("INSERT OR REPLACE INTO seen (key, issued_at, seen_at, expires_at) VALUES (?, ?, ?, ?)",
                                 [(key, issued, now, expires) for key, issued, expires in records])  # fmt: skip
            excess = int(self._db.execute("SELECT COUNT(*) FROM seen").fetchone()[0]) - self.policy.max_entries
            if excess > 0:
                self._evict_locked(excess)
            self._db.execute("COMMIT")
        except sqlite3.Error as err:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise ReplayError(f"cannot write the command replay record {self.path}: {err}",
                              hint="check free space and permissions of the agent's state directory") from err  # fmt: skip

    def _evict_locked(self, count: int) -> None:
        # Payload records (answered or refused payloads) go first: a flood of refused junk must not push out the ids
        # of admitted commands, or a captured signed command without issued_at would run again.
        oldest = self._db.execute("SELECT key, issued_at, expires_at FROM seen ORDER BY substr(key, 1, 3) = ?, expires_at "
                                  "LIMIT ?", (_ID_PREFIX, count)).fetchall()  # fmt: skip
        # An evicted id can no longer be recognised: refuse everything issued up to it from now on.
        raised = max((issued for key, issued, _ in oldest if key.startswith(_ID_PREFIX) and issued is not None),
                     default=None)  # fmt: skip
        if raised is not None and raised > self._floor_locked():
            self._db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('floor', ?)", (raised,))
            logger.warning("command replay record full (%d entries): commands issued up to %s are now refused",
                           self.policy.max_entries, _utc(raised))  # fmt: skip
        self._db.executemany("DELETE FROM seen WHERE key = ?", [(key,) for key, _, _ in oldest])
