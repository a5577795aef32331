"""Device status writes of the SQL stores (a mixin of :class:`~edgekit.fleet.store.sql.SqlFleetStore`).

A status is applied when it is at least as new as the stored one (by ``updated_at``: the collector's clock when it
heard the status, or for a retained one when the device said it), so a lagging collector never undoes a newer
status. A stored time later than the writing collector's clock (by more than :data:`CLOCK_SLACK`) was written by a
clock that has since been set back (or by one running ahead): it is not trusted, and any status replaces it.
Otherwise every status after such a jump, a device's last will included, would be dropped until the real time
passed the wrong one. The device identity a status carries follows the same rule. How many statuses were applied
is returned, so the collector counts the rest.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from edgekit.fleet.store import queries
from edgekit.fleet.store.base import DeviceStatus

#: How far a stored status time may be ahead of the writer's clock and still be trusted (clocks kept by NTP agree far
#: closer; a collector's clock set back by less than this drops statuses for at most this long).
CLOCK_SLACK = dt.timedelta(seconds=5)


class StatusWritesMixin:
    """:meth:`upsert_status` and :meth:`upsert_statuses` (the store supplies transactions and dialect hooks)."""

    _transaction: Any
    _sql: Any
    time_in: Any
    json_in: Any
    _set_target: Any

    def upsert_status(self, status: DeviceStatus) -> bool:
        with self._transaction(f"storing the status of {status.fleet}/{status.device}") as cursor:
            return self._upsert_status(cursor, status, self._distrusted_after())

    def upsert_statuses(self, statuses: Sequence[DeviceStatus]) -> int:
        if not statuses:
            return 0
        distrusted_after = self._distrusted_after()
        with self._transaction(f"storing {len(statuses)} device statuses") as cursor:
            # in order: a device's later status wins
            return sum(self._upsert_status(cursor, status, distrusted_after) for status in statuses)

    def _distrusted_after(self) -> Any:
        """Stored times later than this came from a clock set back since (as the store keeps times)."""
        return self.time_in(dt.datetime.now(dt.timezone.utc) + CLOCK_SLACK)

    def _upsert_status(self, cursor: Any, status: DeviceStatus, distrusted_after: Any) -> bool:
        sql = queries.upsert_retained_status_sql(self) if status.retained else queries.UPSERT_STATUS  # type: ignore[arg-type]
        cursor.execute(self._sql(sql),
                       (status.fleet, status.device, status.state, status.bundle_id, status.agent_version,
                        self.time_in(status.updated_at), self.json_in(status.payload), distrusted_after))  # fmt: skip
        applied = bool(cursor.rowcount)  # 0: the stored status was newer (the upsert's WHERE)
        if status.target is not None:
            self._set_target(cursor, status.fleet, status.device, status.target)
        if status.identity is not None:
            i = status.identity
            cursor.execute(self._sql(queries.UPSERT_IDENTITY),
                           (i.fleet, i.device, i.board, i.soc, i.os, i.l4t, i.jetpack, i.cuda, i.tensorrt, i.onnxruntime,
                            i.power_mode, i.clocks_locked, self.json_in(i.payload), self.time_in(i.updated_at),
                            distrusted_after))  # fmt: skip
        return applied


__all__ = ["CLOCK_SLACK", "StatusWritesMixin"]
