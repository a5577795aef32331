"""Versioned schema migrations shipped with edgekit: ``migrations/<dialect>/NNNN_<name>.sql``.

A store applies, in order and each in its own transaction, the files newer than the highest version
in its ``schema_version`` table, and records each one there. A database migrated by a newer edgekit
(a version this one does not ship) is refused rather than used half-understood.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from edgekit.fleet.errors import StoreError

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
        raise StoreError(f"fleet store {url} has schema version {current}, newer than the {newest} this edgekit knows",
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


__all__ = ["DIALECTS", "Migration", "latest_version", "migrations", "pending", "split_statements"]
