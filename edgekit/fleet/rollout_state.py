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

#: States a rollout passes through; the last four are final. ``canary`` and ``widening`` appear only in
#: records written before waves (a canary then everyone), which still load.
ROLLOUT_STATES = ("deploying", "watching", "rolling_back", "completed", "completed_with_failures", "rolled_back",
                  "stopped", "canary", "widening")  # fmt: skip
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


def _time(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as stored. ``outcomes`` maps device -> its last outcome (``pending``, ``deploying``,
    ``succeeded``, ``failed``, ``rejected``, ``rolled_back``, ``timeout``, ``rollback_failed``,
    ``skipped_offline``); ``canary`` is the first wave.

    ``waves``: one dict per wave, in order: ``index`` (1-based), ``spec`` (as given, ``"10%"``),
    ``devices``, ``state`` (``pending``, ``deploying``, ``watching``, ``passed``, ``failed``,
    ``not_started``), ``started_at`` / ``finished_at`` (ISO), ``seconds``, ``health`` (the gate's
    figures) and ``reason`` (why its gate failed). ``device_results``: device -> ``wave``, ``outcome``,
    ``reason`` (the device's own message from its ``deploy_result`` event), ``step`` (the check that
    failed), ``hint`` (what to do), ``command_id``, ``sent_at``, ``answered_at``, ``seconds``.
    ``forced``: device -> why its target did not match the bundle's (deployed with ``--force``).
    """

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
    target: str | None = None
    waves: tuple[dict[str, Any], ...] = ()
    device_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    forced: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    finished_at: dt.datetime | None = None

    def with_state(self, state: str, **changes: Any) -> RolloutRecord:
        now = dt.datetime.now(dt.timezone.utc)
        if state in FINAL_STATES and "finished_at" not in changes:
            changes["finished_at"] = now
        return replace(self, state=state, updated_at=now, **changes)

    def failed_devices(self) -> dict[str, dict[str, Any]]:
        """device -> its result, for every device that was sent the bundle and did not keep it."""
        return {d: {"outcome": o, **self.device_results.get(d, {})} for d, o in sorted(self.outcomes.items())
                if o not in ("succeeded", "pending", "skipped_offline", "deploying")}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["canary"], data["devices"], data["waves"] = list(self.canary), list(self.devices), list(data["waves"])
        data["started_at"], data["updated_at"] = self.started_at.isoformat(), self.updated_at.isoformat()
        data["finished_at"] = _time(self.finished_at)
        data["seconds"] = round(((self.finished_at or self.updated_at) - self.started_at).total_seconds(), 3)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutRecord:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["canary"], values["devices"] = tuple(values["canary"]), tuple(values["devices"])
        values["waves"] = tuple(values.get("waves") or ())
        values["started_at"] = dt.datetime.fromisoformat(values["started_at"])
        values["updated_at"] = dt.datetime.fromisoformat(values["updated_at"])
        if values.get("finished_at"):
            values["finished_at"] = dt.datetime.fromisoformat(values["finished_at"])
        return cls(**values)


class RolloutLog(abc.ABC):
    """Where rollout records live."""

    @abc.abstractmethod
    def save(self, record: RolloutRecord) -> None:
        """Insert or replace the record with this ``rollout_id``."""

    @abc.abstractmethod
    def recent(self, limit: int = 20, fleet: str | None = None, *, bundle_id: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[RolloutRecord]:  # fmt: skip
        """The newest rollouts first; ``bundle_id``, ``since`` and ``until`` (on ``started_at``) narrow them."""

    @staticmethod
    def _filters(fleet: str | None, bundle_id: str | None, since: dt.datetime | None, until: dt.datetime | None,
                 placeholder: str, time_in: Any) -> tuple[str, tuple[Any, ...]]:  # fmt: skip
        clauses, params = [], []
        for clause, value in (("fleet = ", fleet), ("bundle_id = ", bundle_id), ("started_at >= ", since), ("started_at < ", until)):
            if value is not None:
                clauses.append(clause + placeholder)
                params.append(time_in(value) if isinstance(value, dt.datetime) else value)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)

    def get(self, rollout_id: str) -> RolloutRecord | None:
        return next((r for r in self.recent(limit=100_000) if r.rollout_id == rollout_id), None)

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

    def recent(self, limit: int = 20, fleet: str | None = None, *, bundle_id: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[RolloutRecord]:  # fmt: skip
        where, params = self._filters(fleet, bundle_id, since, until, "?", lambda t: t.timestamp())
        with self._lock:
            rows = self._db.execute(f"SELECT record FROM edgekit_rollouts{where} ORDER BY started_at DESC LIMIT ?",
                                    params + (limit,)).fetchall()  # fmt: skip
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

    def recent(self, limit: int = 20, fleet: str | None = None, *, bundle_id: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[RolloutRecord]:  # fmt: skip
        where, params = self._filters(fleet, bundle_id, since, until, "%s", lambda t: t)
        with self._lock:
            rows = self._db.execute(f"SELECT record FROM edgekit_rollouts{where} ORDER BY started_at DESC LIMIT %s",
                                    params + (limit,)).fetchall()  # fmt: skip
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
