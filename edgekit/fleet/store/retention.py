"""Retention of raw windows and rollups, shared by the SQL stores (a mixin of :class:`SqlFleetStore`).

Raw windows older than the raw retention are rolled up into per-device buckets a batch at a time (a short
transaction each, oldest first; those from a device clock set ahead go by the time they were received), the
rolled-up seqs are remembered so redeliveries stay deduplicated, and, with a rollup retention, old rollups and
fleet 1-minute buckets are forgotten (PostgreSQL drops daily partitions).
The aggregates every fleet-wide read uses are written at ingest and do not move.
"""

from __future__ import annotations

import abc
import datetime as dt
from typing import Any, NamedTuple, Sequence

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store import buckets, queries
from edgekit.fleet.store.base import TelemetryWindow

#: Per-device rollup tables, which rollup retention empties of old buckets.
ROLLUP_TABLES = ("telemetry_rollups", "telemetry_model_rollups")
#: Raw windows rolled up per retention transaction (SQLite: 1.1-1.2 s each with 10,000 devices x 24 h on a quiet 2-core host).
RETENTION_BATCH_ROWS = 20_000
#: How long a gap between a device's rolled-up seqs stays open for a late window (see :func:`merge_rolled_seqs`).
DEFAULT_GAPS_OPEN_FOR = dt.timedelta(days=7)
#: Minutes per rollup bucket unless retention is told otherwise.
DEFAULT_ROLLUP_MINUTES = 5
#: How far past now a window may end before it is taken for one from a device clock set ahead, which retention rolls
#: up by the time it was received instead (it would never end before the cutoff).
FUTURE_SLACK = dt.timedelta(days=1)


class SeqRun(NamedTuple):
    """Consecutive seqs of one device that a retention run rolled up (``window_end_max`` as the store keeps times)."""

    fleet: str
    device: str
    seq_first: int
    seq_last: int
    window_end_max: Any
    windows: int


class RolledSeqs(NamedTuple):
    """A row of ``telemetry_rolled_seqs``: seqs ``seq_first``..``seq_last`` of a device are counted in rollups.
    Times are as the store keeps them (comparable with each other)."""

    seq_first: int
    seq_last: int
    window_end_max: Any
    rolled_at: Any


def merge_rolled_seqs(runs: Sequence[RolledSeqs], gaps_closed_before: Any) -> list[RolledSeqs]:
    """One device's runs, merged where they touch or overlap, and across a gap whose lower run last grew before
    ``gaps_closed_before``: a window that late (QoS 1 redelivery and spool replay come sooner) is taken for a
    redelivery, which keeps a device's rows few. Ordered by seq."""
    merged: list[RolledSeqs] = []
    for run in sorted(runs):
        if merged:
            last = merged[-1]
            if run.seq_first <= last.seq_last + 1 or last.rolled_at < gaps_closed_before:
                merged[-1] = RolledSeqs(last.seq_first, max(last.seq_last, run.seq_last),
                                        max(last.window_end_max, run.window_end_max), max(last.rolled_at, run.rolled_at))  # fmt: skip
                continue
        merged.append(run)
    return merged


class RetentionMixin(abc.ABC):
    """Retention for :class:`~edgekit.fleet.store.sql.SqlFleetStore` (which supplies transactions and dialect hooks)."""

    _transaction: Any
    _query: Any
    _sql: Any
    time_in: Any
    #: The running retention pass's ``now`` (None outside one): "today" to stores that place rollups by day.
    _retention_now: dt.datetime | None = None

    def _retain(self, cursor: Any, cutoff: Any, bucket_s: int) -> list[SeqRun]:
        """Roll windows ending before ``cutoff`` into rollups and delete them, in the open transaction; return
        the runs of consecutive seqs rolled up."""
        return self._roll_up(cursor, "window_end < :cutoff", {"cutoff": cutoff}, bucket_s,
                             self._old_windows("telemetry_windows"))  # fmt: skip

    @abc.abstractmethod
    def _roll_up(self, cursor: Any, where: str, params: dict[str, Any], bucket_s: int, source: str) -> list[SeqRun]:
        """Roll the raw windows matching ``where`` (unqualified columns; ``source`` is the table aliased ``w``)
        into rollups and delete them, in the open transaction; return the runs of consecutive seqs rolled up
        (:data:`ISLANDS_SQL` over the windows moved)."""

    def _old_windows(self, table: str) -> str:
        """``table`` aliased ``w``, as the statements that pick a batch's windows by ``window_end`` read it."""
        return f"{table} w"

    def _retain_models(self, cursor: Any, cutoff: Any, bucket_s: int) -> None:
        """Sum the model windows ending before ``cutoff`` into model rollups and delete them."""
        self._roll_up_models(cursor, "window_end < :cutoff", {"cutoff": cutoff}, bucket_s,
                             self._old_windows("telemetry_model_windows"))  # fmt: skip

    def _roll_up_models(self, cursor: Any, where: str, params: dict[str, Any], bucket_s: int, source: str) -> None:
        """Sum the model windows matching ``where`` (as :meth:`_roll_up`) into model rollups and delete them."""
        params = {**params, "bucket_s": bucket_s}
        cursor.execute(self._sql(queries.model_rollup_insert_sql(self, source, where)), params)
        cursor.execute(self._sql(f"DELETE FROM telemetry_model_windows WHERE {where}"), params)

    def _lock_rolled_seqs(self, cursor: Any, exclusive: bool) -> None:
        """Keep retention (``exclusive``) from moving windows while another process checks a batch against the
        rolled seqs and inserts it (SQLite's BEGIN IMMEDIATE already serialises every write)."""

    def _lock_device_seqs(self, cursor: Any, fleet: str, device: str) -> None:
        """Keep other processes from rolling up or recording this device's seqs until the commit (SQLite's
        BEGIN IMMEDIATE already serialises every write)."""

    def _make_room_for_a_new_spool(self, cursor: Any, windows: Sequence[TelemetryWindow]) -> bool:
        """A device whose seqs start again (a damaged spool moved away, a reflashed device) while windows with
        those seqs are still raw: an arriving window whose start or end differs from the held window with its seq is
        a new one, not a redelivery (a spool resends a window as it was), also when the device's clock is behind the
        held one's. The held windows it replaces, and the device's raw windows from its seq on that ended by the time
        it started, are rolled up now, as retention would later (counted once, their seqs remembered), so the new
        windows are stored instead of being taken for redeliveries and acknowledged unstored. ``windows``: those
        whose keys the store held; returns whether any such device was found."""
        params: dict[str, Any] = {"seq_low": min(w.seq for w in windows), "seq_high": max(w.seq for w in windows)}
        where = queries.device_filter(self, "w", params, sorted({(w.fleet, w.device) for w in windows}))
        cursor.execute(self._sql(f"SELECT w.fleet, w.device, w.seq, w.window_start, w.window_end FROM telemetry_windows w "
                                 f"WHERE {where} AND w.seq BETWEEN :seq_low AND :seq_high"), params)  # fmt: skip
        held = {(fleet, device, int(seq)): (start, end) for fleet, device, seq, start, end in cursor.fetchall()}
        first_new: dict[tuple[str, str], tuple[int, Any]] = {}
        replaced: dict[tuple[str, str], list[int]] = {}
        for w in windows:
            times = held.get((w.fleet, w.device, w.seq))
            if times is None or times == (self.time_in(w.window_start), self.time_in(w.window_end)):
                continue  # not held, or the held window itself (a redelivery: a spool resends a window as it was)
            replaced.setdefault((w.fleet, w.device), []).append(w.seq)  # also when its clock is behind the held one's
            earliest = first_new.get((w.fleet, w.device))
            if earliest is None or w.seq < earliest[0]:
                first_new[(w.fleet, w.device)] = (w.seq, self.time_in(w.window_start))
        now = _now()
        for (fleet, device), (seq, start) in sorted(first_new.items()):
            self._lock_device_seqs(cursor, fleet, device)
            cursor.execute(self._sql("SELECT MAX(bucket_s) FROM telemetry_rollups WHERE fleet = :fleet AND device = :device"),
                           {"fleet": fleet, "device": device})  # fmt: skip
            bucket_s = int(cursor.fetchone()[0] or DEFAULT_ROLLUP_MINUTES * 60)  # the buckets retention makes
            found: dict[str, Any] = {"fleet": fleet, "device": device, "seq_from": seq, "ended_by": start}
            found.update({f"replaced_{index}": held_seq for index, held_seq in enumerate(sorted(set(replaced[(fleet, device)])))})
            seqs = ", ".join(f":{name}" for name in found if name.startswith("replaced_"))
            # its windows that ended by then, and those the arriving ones replace (all of them: a clock behind)
            older = f"fleet = :fleet AND device = :device AND seq >= :seq_from AND (window_end <= :ended_by OR seq IN ({seqs}))"
            runs = self._roll_up(cursor, older, found, bucket_s, "telemetry_windows w")
            self._roll_up_models(cursor, older, found, bucket_s, "telemetry_model_windows w")
            if runs:
                self._record_rolled_seqs(cursor, runs, self.time_in(now), self.time_in(now - DEFAULT_GAPS_OPEN_FOR))
        return bool(first_new)

    # -- maintenance --------------------------------------------------------------------------
    def apply_retention(self, raw_for: dt.timedelta, rollup_minutes: int = DEFAULT_ROLLUP_MINUTES,
                        now: dt.datetime | None = None, *,
                        gaps_open_for: dt.timedelta = DEFAULT_GAPS_OPEN_FOR,
                        rollups_for: dt.timedelta | None = None) -> int:  # fmt: skip
        for label, value in (("retention time", raw_for), ("gaps_open_for", gaps_open_for),
                             ("rollup retention time", rollups_for if rollups_for is not None else dt.timedelta(0))):
            if not isinstance(value, dt.timedelta) or value.total_seconds() < 0:
                raise StoreError(f"{label} must be a non-negative timedelta, got {value!r}",
                                 hint="for example datetime.timedelta(hours=48)")  # fmt: skip
        if isinstance(rollup_minutes, bool) or not isinstance(rollup_minutes, int) or rollup_minutes < 1:
            raise StoreError(f"rollup_minutes must be a whole number >= 1, got {rollup_minutes!r}")
        now = now if now is not None else _now()
        self._retention_now = now
        try:
            return self._apply_retention(now, raw_for, rollup_minutes, gaps_open_for, rollups_for)
        finally:
            self._retention_now = None

    def _apply_retention(self, now: dt.datetime, raw_for: dt.timedelta, rollup_minutes: int,
                         gaps_open_for: dt.timedelta, rollups_for: dt.timedelta | None) -> int:  # fmt: skip
        cutoff = self.time_in(now - raw_for)
        rolled = 0
        while True:  # oldest first, a short transaction per batch: readers and writers wait at most one batch
            batch_cutoff = self._retention_batch_end(cutoff)
            if batch_cutoff is None:
                break
            with self._transaction("rolling up old telemetry windows") as cursor:
                self._lock_rolled_seqs(cursor, exclusive=True)
                runs = self._retain(cursor, batch_cutoff, rollup_minutes * 60)
                self._retain_models(cursor, batch_cutoff, rollup_minutes * 60)
                if runs:
                    self._record_rolled_seqs(cursor, runs, self.time_in(now), self.time_in(now - gaps_open_for))
                rolled += sum(run.windows for run in runs)
        rolled += self._roll_up_clocks_ahead(now, cutoff, rollup_minutes * 60, gaps_open_for)
        with self._transaction("deleting old rejected messages") as cursor:
            self._retain_models(cursor, cutoff, rollup_minutes * 60)  # any whose window was not in a batch
            cursor.execute(self._sql("DELETE FROM rejected_messages WHERE at < ?"), (cutoff,))
        if rollups_for is not None:
            self._drop_rollups_before(now - rollups_for)
        self._return_free_space()
        return rolled

    def _roll_up_clocks_ahead(self, now: dt.datetime, cutoff: Any, bucket_s: int, gaps_open_for: dt.timedelta) -> int:
        """Roll up the raw windows that end more than :data:`FUTURE_SLACK` after ``now`` (a device clock set ahead)
        and were received (the collector's clock) before ``cutoff``, with their model windows, their seqs remembered
        as any rolled up; return how many. Found through the window_end index: such windows are few."""
        where = "window_end > :future AND received_at < :cutoff"
        params = {"future": self.time_in(now + FUTURE_SLACK), "cutoff": cutoff}
        with self._transaction("rolling up telemetry windows from device clocks set ahead") as cursor:
            self._lock_rolled_seqs(cursor, exclusive=True)
            runs = self._roll_up(cursor, where, params, bucket_s, self._old_windows("telemetry_windows"))
            for run in runs:  # the model windows of exactly the windows rolled up (consecutive seqs of a device)
                found = {"fleet": run.fleet, "device": run.device, "seq_first": run.seq_first, "seq_last": run.seq_last,
                         "future": params["future"]}  # fmt: skip
                self._roll_up_models(cursor, "fleet = :fleet AND device = :device AND seq BETWEEN :seq_first AND :seq_last "
                                     "AND window_end > :future", found, bucket_s, "telemetry_model_windows w")  # fmt: skip
            if runs:
                self._record_rolled_seqs(cursor, runs, self.time_in(now), self.time_in(now - gaps_open_for))
        return sum(run.windows for run in runs)

    def _drop_rollups_before(self, before: dt.datetime) -> None:
        """Forget per-device rollups and fleet minute buckets older than ``before`` (fleet hour buckets stay)."""
        for table in ROLLUP_TABLES:
            self._forget_rollups(table, before)
        with self._transaction("deleting old fleet minute buckets") as cursor:
            for table in ("fleet_buckets", "fleet_model_buckets"):
                cursor.execute(self._sql(f"DELETE FROM {table} WHERE bucket_s = {buckets.TIERS[0]} AND bucket_start < :before"),
                               {"before": self.time_in(before)})  # fmt: skip

    @abc.abstractmethod
    def _forget_rollups(self, table: str, before: dt.datetime) -> None:
        """Delete ``table``'s rollups of buckets before ``before`` without one long transaction."""

    def _retention_batch_end(self, cutoff: Any) -> Any:
        """Where the next retention batch ends (exclusive): after about :data:`RETENTION_BATCH_ROWS` of the oldest
        windows ending before ``cutoff``, at least past the oldest window end; None when none is left."""
        rows = self._query("finding old telemetry windows", "SELECT MIN(window_end) FROM telemetry_windows WHERE window_end < ?",
                           (cutoff,))  # fmt: skip
        oldest = rows[0][0]
        if oldest is None:
            return None
        rows = self._query("finding old telemetry windows",
                           f"SELECT window_end FROM telemetry_windows WHERE window_end < ? ORDER BY window_end "
                           f"LIMIT 1 OFFSET {RETENTION_BATCH_ROWS}", (cutoff,))  # fmt: skip
        if not rows:
            return cutoff
        if rows[0][0] > oldest:
            return rows[0][0]
        rows = self._query("finding old telemetry windows", "SELECT MIN(window_end) FROM telemetry_windows WHERE window_end > ?",
                           (oldest,))  # fmt: skip
        return cutoff if rows[0][0] is None else min(rows[0][0], cutoff)

    def _return_free_space(self) -> None:
        """Give the pages retention freed back to the file system, where the database does not by itself."""

    def _record_rolled_seqs(self, cursor: Any, runs: Sequence[SeqRun], now: Any, gaps_closed_before: Any) -> None:
        """Merge ``runs`` into the devices' rolled seq runs, closing gaps older than ``gaps_closed_before`` (times
        as the store keeps them)."""
        by_device: dict[tuple[str, str], list[RolledSeqs]] = {}
        for run in runs:
            by_device.setdefault((run.fleet, run.device), []).append(
                RolledSeqs(int(run.seq_first), int(run.seq_last), run.window_end_max, now))
        params: dict[str, Any] = {}
        where = queries.device_filter(self, "r", params, sorted(by_device))
        cursor.execute(self._sql(f"{queries.SELECT_ROLLED_SEQS} WHERE {where}"), params)
        for fleet, device, first, last, window_end_max, rolled_at in cursor.fetchall():
            by_device[(fleet, device)].append(RolledSeqs(int(first), int(last), window_end_max, rolled_at))
        cursor.execute(self._sql(f"DELETE FROM telemetry_rolled_seqs AS r WHERE {where}"), params)
        rows = [(fleet, device, merged.seq_first, merged.seq_last, merged.window_end_max, merged.rolled_at)
                for (fleet, device), found in sorted(by_device.items())
                for merged in merge_rolled_seqs(found, gaps_closed_before)]  # fmt: skip
        cursor.executemany(self._sql(queries.INSERT_ROLLED_SEQS), rows)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


__all__ = ["DEFAULT_GAPS_OPEN_FOR", "DEFAULT_ROLLUP_MINUTES", "FUTURE_SLACK", "RETENTION_BATCH_ROWS", "ROLLUP_TABLES", "RetentionMixin", "RolledSeqs", "SeqRun",
           "merge_rolled_seqs"]
