"""The record of each rollout (state, canary, per-device outcomes, health figures), kept beside the
fleet store in the same database: one small table, ``edgekit_rollouts``, created on first use.

:func:`open_rollout_log` takes the fleet store's URL (``sqlite:///fleet.db`` or ``postgresql://...``);
the dashboard reads the table, ``edgekit fleet deploy`` writes it.
"""

from __future__ import annotations

import abc
import datetime as dt
import json
import sqlite3
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.fleet.errors import StoreError

#: States a rollout passes through; the last four are final.
ROLLOUT_STATES = ("canary", "watching", "widening", "rolling_back", "completed", "completed_with_failures",
                  "rolled_back", "stopped")  # fmt: skip
FINAL_STATES = ("completed", "completed_with_failures", "rolled_back", "stopped")

_SQLITE_TABLE = (
    "CREATE TABLE IF NOT EXISTS edgekit_rollouts (rollout_id TEXT PRIMARY KEY, fleet TEXT NOT NULL,"
    " bundle_id TEXT NOT NULL, state TEXT NOT NULL, started_at REAL NOT NULL, updated_at REAL NOT NULL, record TEXT NOT NULL)"
)
_POSTGRES_TABLE = (
    "CREATE TABLE IF NOT EXISTS edgekit_rollouts (rollout_id TEXT PRIMARY KEY, fleet TEXT NOT NULL,"
    " bundle_id TEXT NOT NULL, state TEXT NOT NULL, started_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL,"
    " record JSONB NOT NULL)"
)


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as stored. ``outcomes`` maps device -> its last outcome (``deploying``, ``succeeded``,
    ``failed``, ``rolled_back``, ``timeout``, ``skipped_offline``, ``pending``)."""

    rollout_id: str
    fleet: str
    bundle_id: str
    url: str
    sha256: str
    state: str
    canary: tuple[str, ...]
    devices: tuple[str, ...]
    started_at: dt.datetime
    updated_at: dt.datetime
    reason: str | None = None
    previous_bundles: dict[str, str | None] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)

    def with_state(self, state: str, **changes: Any) -> RolloutRecord:
        return replace(self, state=state, updated_at=dt.datetime.now(dt.timezone.utc), **changes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["canary"], data["devices"] = list(self.canary), list(self.devices)
        data["started_at"], data["updated_at"] = self.started_at.isoformat(), self.updated_at.isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutRecord:
        values = dict(data)
        values["canary"], values["devices"] = tuple(values["canary"]), tuple(values["devices"])
        values["started_at"] = dt.datetime.fromisoformat(values["started_at"])
        values["updated_at"] = dt.datetime.fromisoformat(values["updated_at"])
        return cls(**values)


class RolloutLog(abc.ABC):
    """Where rollout records live."""

    @abc.abstractmethod
    def save(self, record: RolloutRecord) -> None:
        """Insert or replace the record with this ``rollout_id``."""

    @abc.abstractmethod
    def recent(self, limit: int = 20, fleet: str | None = None) -> list[RolloutRecord]:
        """The newest rollouts first."""

    def get(self, rollout_id: str) -> RolloutRecord | None:
        return next((r for r in self.recent(limit=1000) if r.rollout_id == rollout_id), None)

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> RolloutLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SqliteRolloutLog(RolloutLog):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
            self._db.execute(_SQLITE_TABLE)
        except sqlite3.Error as err:
            raise StoreError(f"cannot open the rollout table in {path}: {err}", hint="check the path and its permissions") from err

    def save(self, record: RolloutRecord) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO edgekit_rollouts VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.rollout_id, record.fleet, record.bundle_id, record.state, record.started_at.timestamp(),
                 record.updated_at.timestamp(), json.dumps(record.to_json())),
            )  # fmt: skip

    def recent(self, limit: int = 20, fleet: str | None = None) -> list[RolloutRecord]:
        query = "SELECT record FROM edgekit_rollouts" + (" WHERE fleet = ?" if fleet else "") + " ORDER BY started_at DESC LIMIT ?"
        with self._lock:
            rows = self._db.execute(query, ((fleet,) if fleet else ()) + (limit,)).fetchall()
        return [RolloutRecord.from_json(json.loads(row[0])) for row in rows]

    def close(self) -> None:
        self._db.close()


class PostgresRolloutLog(RolloutLog):
    def __init__(self, url: str) -> None:
        import psycopg

        self._lock = threading.Lock()
        try:
            self._db = psycopg.connect(url, autocommit=True)
            self._db.execute(_POSTGRES_TABLE)
        except psycopg.Error as err:
            raise StoreError(f"cannot open the rollout table in PostgreSQL: {err}", hint="check the store URL and the server") from err

    def save(self, record: RolloutRecord) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO edgekit_rollouts VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (rollout_id) DO UPDATE SET"
                " state = EXCLUDED.state, updated_at = EXCLUDED.updated_at, record = EXCLUDED.record",
                (record.rollout_id, record.fleet, record.bundle_id, record.state, record.started_at, record.updated_at,
                 json.dumps(record.to_json())),
            )  # fmt: skip

    def recent(self, limit: int = 20, fleet: str | None = None) -> list[RolloutRecord]:
        query = "SELECT record FROM edgekit_rollouts" + (" WHERE fleet = %s" if fleet else "") + " ORDER BY started_at DESC LIMIT %s"
        with self._lock:
            rows = self._db.execute(query, ((fleet,) if fleet else ()) + (limit,)).fetchall()
        return [RolloutRecord.from_json(row[0] if isinstance(row[0], dict) else json.loads(row[0])) for row in rows]

    def close(self) -> None:
        self._db.close()


def sqlite_path(url: str) -> Path:
    """``sqlite:///fleet.db`` -> ``fleet.db``; ``sqlite:////abs/fleet.db`` -> ``/abs/fleet.db``."""
    return Path(url[len("sqlite:///"):])


def open_rollout_log(store_url: str) -> RolloutLog:
    """The rollout table in the database of the fleet store at ``store_url``."""
    if store_url.startswith("sqlite:///"):
        return SqliteRolloutLog(sqlite_path(store_url))
    if store_url.startswith(("postgresql://", "postgres://")):
        return PostgresRolloutLog(store_url)
    raise StoreError(f"unknown store URL {store_url!r}", hint="use sqlite:///fleet.db or postgresql://user@host/db")
