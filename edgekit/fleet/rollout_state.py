"""The record of each rollout (state, waves, per-device outcomes with the devices' reasons, health gates,
timings), kept in the fleet store's database: table ``edgekit_rollouts`` (store migration 4), read and written
through :meth:`FleetStore.save_rollout <edgekit.fleet.store.base.FleetStore.save_rollout>` and
:meth:`FleetStore.rollouts <edgekit.fleet.store.base.FleetStore.rollouts>`.

:func:`open_rollout_log` takes the fleet store's URL (``sqlite:///fleet.db`` or ``postgresql://...``);
``edgekit fleet deploy`` writes the records, ``edgekit fleet report`` and the dashboard read them.
"""

from __future__ import annotations

import abc
import copy
import datetime as dt
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store.base import FleetStore
from edgekit.fleet.store_patience import patiently

logger = logging.getLogger(__name__)

#: States a rollout passes through; the last four are final. ``canary`` and ``widening`` appear only in
#: records written before waves (a canary then everyone), which still load.
ROLLOUT_STATES = ("deploying", "watching", "rolling_back", "completed", "completed_with_failures", "rolled_back",
                  "stopped", "canary", "widening")  # fmt: skip
FINAL_STATES = ("completed", "completed_with_failures", "rolled_back", "stopped")
#: Device outcomes that leave it on the bundle deployed: it switched, or it served that bundle already (a deploy of the
#: bundle a device serves is answered "already the current bundle", issue 32 item 5)
KEPT_OUTCOMES = ("succeeded", "already_current")
#: RolloutPolicy's defaults, which a record saved without them in its options was run with.
DEFAULT_DEPLOY_TIMEOUT_S = 180.0
DEFAULT_PROGRESS_S = 5.0


def _time(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as stored. ``outcomes`` maps device -> its last outcome (``pending``, ``deploying``,
    ``succeeded``, ``failed``, ``rejected``, ``rolled_back``, ``timeout``, ``rollback_failed``,
    ``skipped_offline``, ``not_started``: in a wave the rollout stopped before); ``canary`` is the first wave.

    ``waves``: one dict per wave, in order: ``index`` (1-based), ``spec`` (as given, ``"10%"``),
    ``devices``, ``state`` (``pending``, ``deploying``, ``watching``, ``passed``, ``failed``,
    ``not_started``), ``started_at`` / ``finished_at`` (ISO), ``seconds``, ``health`` (the gate's
    figures) and ``reason`` (why its gate failed). ``device_results``: device -> ``wave``, ``outcome``,
    ``reason`` (the device's own message from its ``deploy_result`` event), ``step`` (the check that
    failed), ``hint`` (what to do), ``command_id``, ``sent_at``, ``answered_at`` (the device's clock), ``seconds`` (None when the device's clock
    put its answer before the command was sent).
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

    def untouched_not_started(self) -> RolloutRecord:
        """This record with its pending waves, and their pending devices, marked ``not_started``: the rollout
        stopped before it reached them (docs/fleet.md), so they were never sent anything."""
        waves = tuple({**wave, "state": "not_started"} if wave["state"] == "pending" else wave for wave in self.waves)
        outcomes = {d: "not_started" if o == "pending" else o for d, o in self.outcomes.items()}
        return replace(self, waves=waves, outcomes=outcomes)

    def failed_devices(self) -> dict[str, dict[str, Any]]:
        """device -> its result, for every device that was sent the bundle and did not keep it."""
        return {d: {"outcome": o, **self.device_results.get(d, {})} for d, o in sorted(self.outcomes.items())
                if o not in (*KEPT_OUTCOMES, "pending", "not_started", "skipped_offline", "deploying")}  # fmt: skip

    def silent_s(self, now: dt.datetime | None = None) -> float | None:
        """Seconds since a rollout still in progress was last saved, when that is longer than a running deploy ever
        goes without saving (its deploy timeout or gate progress interval, plus a minute): the ``fleet deploy`` that
        ran it has most likely ended without a word (``kill -9``, a lost host). None otherwise."""
        if self.state in FINAL_STATES:
            return None
        quiet = (now or dt.datetime.now(dt.timezone.utc)) - self.updated_at
        longest = max(float(self.options.get("deploy_timeout_s", DEFAULT_DEPLOY_TIMEOUT_S)),
                      float(self.options.get("progress_s", DEFAULT_PROGRESS_S))) + 60.0
        return quiet.total_seconds() if quiet.total_seconds() > longest else None

    def to_json(self) -> dict[str, Any]:
        # copied by hand, not with dataclasses.asdict: its deep copy took about a second a save for 10,000 devices,
        # and a rollout saves every few seconds (device results hold only plain values: one copy of each dict)
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["previous_bundles"], data["outcomes"], data["forced"] = dict(self.previous_bundles), dict(self.outcomes), dict(self.forced)
        data["device_results"] = {device: dict(result) for device, result in self.device_results.items()}
        data["health"], data["options"] = copy.deepcopy(self.health), copy.deepcopy(self.options)
        data["waves"] = [{k: list(v) if k == "devices" else copy.deepcopy(v) for k, v in wave.items()} for wave in self.waves]
        data["canary"], data["devices"] = list(self.canary), list(self.devices)
        data["started_at"], data["updated_at"] = self.started_at.isoformat(), self.updated_at.isoformat()
        data["finished_at"] = _time(self.finished_at)
        data["seconds"] = round(((self.finished_at or self.updated_at) - self.started_at).total_seconds(), 3)
        data["silent_s"] = self.silent_s()  # not null: no update for that long, its deploy has likely ended
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


class DeployTerminated(BaseException):
    """The process running a deploy got SIGTERM (``edgekit fleet deploy`` turns the signal into this exception, so
    the rollout records ``stopped`` as on Ctrl-C). A ``BaseException``, like ``KeyboardInterrupt``: no
    ``except Exception`` on the way swallows it."""


def interrupted(record: RolloutRecord, exc: BaseException | None, *, what: str | None = None) -> RolloutRecord:
    """``record`` stopped because the deploy ended before it did (Ctrl-C, SIGTERM, an error on the way, ``what``
    when given): the wave in progress failed, later waves and their devices ``not_started``, and the reason says that
    no rollback was sent, and how many devices were sent the bundle without answering yet (they may still take it).
    The devices' stored answers are read into ``record`` before (``Rollout.run``)."""
    waves = [dict(wave) for wave in record.waves]
    active = next((i for i, wave in enumerate(waves) if wave["state"] in ("deploying", "watching")), None)
    if what is None:
        what = ("interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "ended by SIGTERM"
                if isinstance(exc, DeployTerminated) else f"ended by {type(exc).__name__}: {exc}")  # fmt: skip
    where = f" during wave {active + 1} ({waves[active]['spec']}, {waves[active]['state']})" if active is not None else ""
    if active is not None:
        waves[active].update(state="failed", reason=what, finished_at=dt.datetime.now(dt.timezone.utc).isoformat())
    kept = [d for d, o in record.outcomes.items() if o in KEPT_OUTCOMES]
    unanswered = [d for d, o in record.outcomes.items() if o == "deploying"]
    reason = (f"the deploy was {what}{where}; no rollback was sent: {len(kept)} device(s) that took the bundle keep it"
              + (" (roll them back by deploying the previous bundle)" if kept else "")
              + (f"; {len(unanswered)} device(s) were sent the bundle and had not answered: they may still take it "
                 "(`edgekit fleet status` shows the bundle each runs)" if unanswered else ""))  # fmt: skip
    return replace(record, waves=tuple(waves)).untouched_not_started().with_state("stopped", reason=reason)


class RolloutLog(abc.ABC):
    """Where rollout records live."""

    @abc.abstractmethod
    def save(self, record: RolloutRecord) -> None:
        """Insert or replace the record with this ``rollout_id``."""

    @abc.abstractmethod
    def recent(self, limit: int = 20, fleet: str | None = None, *, bundle_id: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[RolloutRecord]:  # fmt: skip
        """The newest rollouts first; ``bundle_id``, ``since`` and ``until`` (on ``started_at``) narrow them."""

    def get(self, rollout_id: str) -> RolloutRecord | None:
        return next((r for r in self.recent(limit=100_000) if r.rollout_id == rollout_id), None)

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> RolloutLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreRolloutLog(RolloutLog):
    """Rollout records in a fleet store (the table migration 4 creates)."""

    def __init__(self, store: FleetStore) -> None:
        self.store = store

    def save(self, record: RolloutRecord) -> None:
        patiently(f"saving rollout {record.rollout_id}", self.store.save_rollout, record.to_json())

    def recent(self, limit: int = 20, fleet: str | None = None, *, bundle_id: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[RolloutRecord]:  # fmt: skip
        rows = self.store.rollouts(fleet, bundle_id=bundle_id, since=since, until=until, limit=limit)
        records = []
        for row in rows:  # a damaged record is left out of listings, said in the log: the others still show
            try:
                records.append(_record_from_row(row))
            except StoreError as exc:
                logger.warning("%s", exc.message)
        return records

    def get(self, rollout_id: str) -> RolloutRecord | None:
        rows = self.store.rollouts(rollout_id=rollout_id, limit=1)
        return _record_from_row(rows[0]) if rows else None

    def close(self) -> None:
        self.store.close()


def _record_from_row(row: dict[str, Any]) -> RolloutRecord:
    """A stored rollout record, or a :class:`StoreError` naming the rollout and what is wrong with its record."""
    from edgekit.fleet.store.base import DAMAGED_RECORD

    try:
        if DAMAGED_RECORD in row:
            raise ValueError(row[DAMAGED_RECORD])
        return RolloutRecord.from_json(row)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f"rollout record {str(row.get('rollout_id'))[:40]!r} is damaged: {type(exc).__name__}: {exc}",
                         hint="restore the fleet store from a backup, or delete that row of edgekit_rollouts") from None  # fmt: skip


def open_rollout_log(store_url: str) -> RolloutLog:
    """The rollout records in the fleet store at ``store_url`` (migrated to this edgekit's schema first)."""
    from edgekit.fleet.store import open_store

    return StoreRolloutLog(open_store(store_url))
