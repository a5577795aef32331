"""How the collector's writer stores a batch's records of one kind (a mixin of :class:`~edgekit.fleet.collector.Collector`).

A store that is unavailable (PostgreSQL restarting, SQLite busy past its timeout) is waited for, with a doubling
delay; a batch the store refuses is written one record at a time, and a record refused on its own is counted and
recorded as ``store_refused``. Records neither stored nor refused for good (the store still unavailable while the
collector stops) are returned, and the collector does not acknowledge them: the broker sends them again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any

from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.metrics import IngestMetrics
from edgekit.fleet.store.base import FleetStore, RejectedMessage

logger = logging.getLogger("edgekit.fleet.collector")  # the collector's log, where operators look for it


class StoreWrites:
    """The writer thread's store writes; the collector supplies the attributes below."""

    store: FleetStore
    metrics: IngestMetrics
    alerts: Any
    client_id: str
    _stopping: threading.Event

    def _write_step(self, kind: str, records: list[Any]) -> tuple[bool, list[Any]]:
        """Store ``records``: whether they were stored as a whole (then the agents are told, acks.py), and those
        neither stored nor refused for good (the store unavailable while stopping), which are not acknowledged."""
        try:
            if self._write_while_unavailable(kind, records):
                return True, []
            return False, records
        except Exception as exc:  # noqa: BLE001 - a StoreError, or a failure nothing foresaw: the writer goes on
            self.metrics.count_store_error()
            if not isinstance(exc, StoreError):
                logger.exception("collector %s: storing %d %s records failed", self.client_id, len(records), kind)
            logger.error("collector %s: the store refused %d %s records (%s); writing them one by one",
                         self.client_id, len(records), kind, why(exc))  # fmt: skip
            return False, self._write_one_by_one(kind, records)  # not acknowledged to the agents (acks.py)

    def _write_while_unavailable(self, kind: str, records: list[Any]) -> bool:
        """Store ``records``, retrying while the store is unavailable; False when given up on while stopping.
        Other failures are raised."""
        delay_s = 0.2
        while True:
            try:
                self._write_records(kind, records)
                return True
            except StoreUnavailableError as exc:
                self.metrics.count_store_error()
                if self._stopping.is_set() and delay_s > 2:
                    logger.error("collector %s: giving up on %d %s records while stopping: %s", self.client_id,
                                 len(records), kind, exc.message)  # fmt: skip
                    return False
                logger.warning("collector %s: store unavailable (%s); retrying in %.1f s", self.client_id, exc.message,
                               delay_s)  # fmt: skip
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 10.0)

    def _write_records(self, kind: str, records: list[Any]) -> None:
        if kind == "telemetry":
            self.metrics.count_written(kind, len(records), self.store.add_windows(records))
            self.metrics.observe_windows(records)
            if self.alerts is not None:
                self.alerts.observe_windows(records)
        elif kind == "events":
            self.metrics.count_written(kind, len(records), self.store.add_events(records))
        elif kind == "status":
            applied = self.store.upsert_statuses(records)  # the rest were older than the stored ones (duplicates{status})
            self.metrics.count_written(kind, len(records), len(records) if applied is None else applied)
        else:
            self.store.add_rejected(records)

    def _write_one_by_one(self, kind: str, records: list[Any]) -> list[Any]:
        """Store ``records`` one at a time, a record the store refuses as ``store_refused``; a store that is only
        unavailable (a restart, SQLite busy) is waited for as for a batch. Returns the records left unwritten
        (given up on while stopping)."""
        refused: list[RejectedMessage] = []
        left: list[Any] = []
        for index, record in enumerate(records):
            try:
                if not self._write_while_unavailable(kind, [record]):
                    left = records[index:]
                    break
            except Exception as exc:  # noqa: BLE001 - one record's failure, whatever it is, loses only that record
                if kind == "rejected":
                    logger.error("collector %s: cannot record a rejected message on %r (%s): %s", self.client_id,
                                 record.topic[:200], record.reason, why(exc))  # fmt: skip
                    continue
                topic = f"edgekit/v1/{record.fleet}/{record.device}/{kind}"
                logger.error("collector %s: the store refused a message on %s: %s", self.client_id, topic, why(exc))
                self.metrics.count_rejected("store_refused")
                refused.append(RejectedMessage(topic=topic, reason="store_refused", size_bytes=0,
                                               at=dt.datetime.now(dt.timezone.utc), detail=why(exc)[:512]))  # fmt: skip
        if refused:
            try:
                self.store.add_rejected(refused)
            except Exception as exc:  # noqa: BLE001 - said in the log; the writer goes on
                logger.error("collector %s: cannot record %d refused messages: %s", self.client_id, len(refused), why(exc))
        return left


def why(exc: BaseException) -> str:
    """What went wrong, for the log and a store_refused row: a StoreError's message, else its type and text."""
    return exc.message if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"


__all__ = ["StoreWrites", "why"]
