"""Versioned schema migrations shipped with edgekit: ``migrations/<dialect>/NNNN_<name>.sql``.

A store applies, in order and each in its own transaction, the files newer than the highest version
in its ``schema_version`` table, and records each one there. A database migrated by a newer edgekit
(a version this one does not ship) is refused rather than used half-understood.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store import queries
from edgekit.fleet.store.urls import redact

#: The schema version that added the aggregates kept at ingest (edgekit/fleet/store/buckets.py).
AGGREGATES_VERSION = 7
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
DIALECTS = ("sqlite", "postgres")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@lru_cache(maxsize=None)
def migrations(dialect: str) -> tuple[Migration, ...]:
    """The migrations shipped for ``dialect``, oldest first."""
    if dialect not in DIALECTS:
        raise StoreError(f"no migrations for database dialect {dialect!r}", hint=f"use one of {', '.join(DIALECTS)}")
    folder = resources.files("edgekit.fleet.store").joinpath("migrations", dialect)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_RE.match(entry.name)
        if match is not None:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StoreError(f"the {dialect} migrations shipped with edgekit are numbered {versions}, not 1..{len(found)}",
                         hint="reinstall edgekit; the package's migrations folder is incomplete")  # fmt: skip
    return tuple(found)


def latest_version(dialect: str) -> int:
    return len(migrations(dialect))


def pending(dialect: str, current: int, url: str) -> tuple[Migration, ...]:
    """The migrations to apply to a database at ``current``; refuse a database newer than this edgekit."""
    newest = latest_version(dialect)
    if current > newest:
        raise StoreError(f"fleet store {redact(url)} has schema version {current}, newer than the {newest} this edgekit knows",
                         hint="upgrade edgekit on this machine, or point --store at another database")  # fmt: skip
    return migrations(dialect)[current:]


def split_statements(script: str) -> list[str]:
    """The statements of a migration file (split on ';' at line ends; comments dropped)."""
    lines = [line.split("--", 1)[0].rstrip() for line in script.splitlines()]
    statements, current = [], []
    for line in lines:
        if not line.strip():
            continue
        current.append(line)
        if line.endswith(";"):
            statements.append("\n".join(current)[:-1])
            current = []
    if current:
        statements.append("\n".join(current))
    return statements


class SchemaMigrations:
    """Bringing a :class:`~edgekit.fleet.store.sql.SqlFleetStore`'s schema up to date when it opens (a mixin: the store
    supplies transactions, queries and dialect hooks, and ``_sum_in_history`` for the aggregates' migration)."""

    _transaction: Any
    _query: Any
    _sql: Any
    _sum_in_history: Any
    dialect: str
    url: str

    def _migrate(self) -> None:
        if self._schema_is_current():
            return
        with self._transaction("reading the schema version") as cursor:
            self._lock_for_migration(cursor)
            cursor.execute(self._sql(queries.CREATE_SCHEMA_VERSION))
            cursor.execute(self._sql("SELECT MAX(version) FROM schema_version"))
            current = int(cursor.fetchone()[0] or 0)
            for migration in pending(self.dialect, current, self.url):
                self._run_script(cursor, migration.sql)
                cursor.execute(self._sql("INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)"),
                               (migration.version, migration.name, dt.datetime.now(dt.timezone.utc).isoformat()))  # fmt: skip
                if migration.version == AGGREGATES_VERSION:
                    self._organise_rollups(cursor)
                    if current > 0:
                        self._sum_in_history(cursor)

    def _schema_is_current(self) -> bool:
        """Whether the store needs no migration, read without the write lock: opening a store to read it (``fleet
        status``, the dashboard) must not wait for a writer (a retention pass holds SQLite's write lock for seconds
        at a time; waiting past the busy timeout failed the open). Anything unclear (no schema table yet, an error)
        is left to the write transaction, which reads the version again under the lock."""
        try:
            rows = self._query("reading the schema version", "SELECT MAX(version) FROM schema_version")
        except StoreError:  # a new store (no table), or unreadable: the locked path decides and reports
            return False
        return not pending(self.dialect, int(rows[0][0] or 0), self.url)

    def _organise_rollups(self, cursor: Any) -> None:
        """Lay out the rollup tables for retention by time (PostgreSQL: daily partitions), when migrating."""

    def _lock_for_migration(self, cursor: Any) -> None:
        """Keep two processes opening the same new database from migrating it at once."""

    def _run_script(self, cursor: Any, script: str) -> None:
        for statement in split_statements(script):
            cursor.execute(statement)


__all__ = ["AGGREGATES_VERSION", "DIALECTS", "Migration", "SchemaMigrations", "latest_version", "migrations", "pending",
           "split_statements"]
