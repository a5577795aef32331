"""What SQL text builders need of a store: its dialect hooks, as a protocol.

:mod:`edgekit.fleet.store.queries`, :mod:`~edgekit.fleet.store.buckets` and :mod:`~edgekit.fleet.store.fleet_reads`
write SQL that serves SQLite and PostgreSQL alike; the few expressions that differ come from the store they are
given. They name that store by this protocol, not by :class:`edgekit.fleet.store.sql.SqlFleetStore` (which imports
them), so the store's modules import one way only (issue 33).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol, Sequence


class SqlDialect(Protocol):
    """The hooks of :class:`edgekit.fleet.store.sql.SqlFleetStore` that shared SQL text and row helpers use."""

    #: How to write "insert unless the key exists": (statement start, statement end).
    insert_ignore: tuple[str, str]
    #: What ends a SELECT that locks its rows for the transaction ("" where the transaction already excludes writers).
    lock_rows_sql: str

    def _sql(self, text: str) -> str:
        """Rewrite ``?`` and ``:name`` placeholders into the driver's style."""

    def time_in(self, moment: dt.datetime) -> Any: ...

    def time_out(self, value: Any) -> dt.datetime: ...

    def list_in(self, values: Sequence[str]) -> Any: ...

    def in_list_sql(self, expression: str, name: str) -> str:
        """SQL testing ``expression`` against the list parameter ``name``."""

    def seconds_sql(self, start: str, end: str) -> str:
        """SQL for the seconds from time expression ``start`` to ``end``, as a float."""

    def bucket_sql(self, moment: str, seconds_param: str) -> str:
        """SQL for the start of the ``:seconds_param``-second bucket ``moment`` falls in (a time value)."""

    def json_text_sql(self, column: str, key: str) -> str:
        """SQL for the text of top-level ``key`` in the JSON ``column`` (NULL when absent or null)."""

    def greatest_sql(self, a: str, b: str) -> str: ...

    def least_sql(self, a: str, b: str) -> str: ...

    def execute_rows(self, cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str = "", *,
                     returning: bool = False) -> list[tuple[Any, ...]]:  # fmt: skip
        """``head (?, ...), (?, ...) tail`` over ``rows`` in multi-row statements (with ``returning``, the rows the
        statements returned)."""


__all__ = ["SqlDialect"]
