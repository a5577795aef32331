"""Fleet stores behind one interface (:class:`FleetStore`), opened from a URL with :func:`open_store`.

=================================  ==============================================================
URL                                store
=================================  ==============================================================
``sqlite:///fleet.db``             SQLite file ``fleet.db`` (relative path; ``sqlite:////abs/x.db``)
``sqlite:///:memory:``             SQLite in memory, gone on close (tests, demos)
``postgresql://user@host/db``      PostgreSQL or TimescaleDB (libpq URL; ``postgres://`` too)
=================================  ==============================================================
"""

from __future__ import annotations

from typing import Callable

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store.base import (
    AGGREGATE_KEYS,
    Aggregate,
    BundleSpan,
    DeviceEvent,
    DeviceStatus,
    DeviceSummary,
    FleetStore,
    RejectedMessage,
    TelemetryWindow,
)

ACCEPTED_FORMS = ("sqlite:///PATH.db", "sqlite:///:memory:", "postgresql://USER@HOST:PORT/DATABASE")


def _open_sqlite(url: str, rest: str, must_exist: bool) -> FleetStore:
    from pathlib import Path

    from edgekit.fleet.store.sqlite import SqliteStore

    if not rest.startswith("/") or rest == "/":
        raise _bad_url(url, "a SQLite URL has three slashes and a path after them")
    path = rest[1:]
    if must_exist and path != ":memory:" and not Path(path).expanduser().is_file():
        raise StoreError(f"fleet store {url} does not exist (no file {Path(path).expanduser().resolve()})",
                         hint="point --store at the database `edgekit fleet collect` writes to")  # fmt: skip
    return SqliteStore(path, url=url)


def _open_postgres(url: str, rest: str, must_exist: bool) -> FleetStore:
    from edgekit.fleet.store.postgres import PostgresStore

    return PostgresStore(url)


#: URL scheme -> opener(url, what follows "scheme://", must_exist).
STORE_SCHEMES: dict[str, Callable[[str, str, bool], FleetStore]] = {
    "sqlite": _open_sqlite,
    "postgresql": _open_postgres,
    "postgres": _open_postgres,
}


def _bad_url(url: object, problem: str) -> StoreError:
    return StoreError(f"fleet store URL {url!r} is not usable: {problem}",
                      hint=f"write it as one of: {', '.join(ACCEPTED_FORMS)}")  # fmt: skip


def open_store(url: str, *, must_exist: bool = False) -> FleetStore:
    """The store ``url`` names, with its schema migrated to this edgekit's version.

    ``must_exist``: refuse to create a new SQLite file (for commands that only read)."""
    if not isinstance(url, str) or "://" not in url:
        raise _bad_url(url, "it has no scheme:// part")
    scheme, rest = url.split("://", 1)
    opener = STORE_SCHEMES.get(scheme.lower())
    if opener is None:
        raise _bad_url(url, f"scheme '{scheme}' is not one of {', '.join(sorted(STORE_SCHEMES))}")
    return opener(url, rest, must_exist)


__all__ = [
    "ACCEPTED_FORMS", "AGGREGATE_KEYS", "Aggregate", "BundleSpan", "DeviceEvent", "DeviceStatus", "DeviceSummary",
    "FleetStore", "RejectedMessage", "STORE_SCHEMES", "TelemetryWindow", "open_store",
]  # fmt: skip
