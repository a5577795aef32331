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
    MODEL_AGGREGATE_KEYS,
    Aggregate,
    BundleSpan,
    DeviceEvent,
    DeviceStatus,
    DeviceSummary,
    FleetStore,
    ModelAggregate,
    ModelWindow,
    RejectedMessage,
    TelemetryWindow,
)

ACCEPTED_FORMS = ("sqlite:///PATH.db", "sqlite:///:memory:", "postgresql://USER@HOST:PORT/DATABASE")
#: What a read-only command's "does not exist" error suggests: the command that creates and fills a store.
CREATED_BY = "edgekit fleet collect --broker URL --store {url}"


def _open_sqlite(url: str, rest: str, must_exist: bool) -> FleetStore:
    from pathlib import Path

    from edgekit.fleet.store.sqlite import SqliteStore

    if not rest.startswith("/") or rest == "/":
        raise _bad_url(url, "a SQLite URL has three slashes and a path after them")
    path = rest[1:]
    if must_exist and path != ":memory:" and not Path(path).expanduser().is_file():
        raise StoreError(f"fleet store {url} does not exist (no file {Path(path).expanduser().resolve()}); this command "
                         "only reads a store and does not create one",
                         hint=f"point --store at the database `edgekit fleet collect` writes to, or create it: "
                              f"`{CREATED_BY.format(url=url)}`")  # fmt: skip
    return SqliteStore(path, url=url)


def _open_postgres(url: str, rest: str, must_exist: bool) -> FleetStore:
    from edgekit.fleet.store.postgres import PostgresStore

    if must_exist:
        _check_postgres_store_exists(url)
    return PostgresStore(url)


def _check_postgres_store_exists(url: str) -> None:
    """Refuse (for commands that only read) a PostgreSQL database that is missing or holds no fleet store yet,
    instead of creating the store's tables in it."""
    from edgekit.fleet.store.postgres import CONNECT_TIMEOUT_S, _import_psycopg, redact

    psycopg = _import_psycopg(url)
    shown = redact(url)
    try:
        connection = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        message = str(exc).strip()
        if "does not exist" in message and "database" in message:
            database = url.rsplit("/", 1)[-1].split("?", 1)[0]
            raise StoreError(f"fleet store {shown} does not exist: {message.splitlines()[-1].strip()}; this command only "
                             "reads a store and does not create one",
                             hint=f"create the database (`createdb {database}` on the server), then fill it with "
                                  f"`{CREATED_BY.format(url=shown)}`") from None  # fmt: skip
        return  # unreachable, refused, bad password: PostgresStore says so with its own hint
    with connection:
        (found,) = connection.execute("SELECT to_regclass('schema_version')").fetchone()
    if found is None:
        raise StoreError(f"fleet store {shown} does not exist: the database has no edgekit fleet tables; this command "
                         "only reads a store and does not create one",
                         hint=f"check the database name in --store, or fill it with `{CREATED_BY.format(url=shown)}`")  # fmt: skip


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
    "FleetStore", "MODEL_AGGREGATE_KEYS", "ModelAggregate", "ModelWindow", "RejectedMessage", "STORE_SCHEMES",
    "TelemetryWindow", "open_store",
]  # fmt: skip
