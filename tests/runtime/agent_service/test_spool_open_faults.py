"""The agent starts whatever state its telemetry spool file is in (review finding): on a full disk it runs with
its in-memory outbox and opens the spool once there is room; a damaged spool file is moved aside with a warning
event and a new spool is made. The real AgentService, Spool and MQTT link (its broker address has nothing
listening, so nothing is sent); the full disk is an ENOSPC where SQLite writes the new spool."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit_runtime.agent import spool_opening
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.agent.spool import Spool, SpoolFullError

NO_BROKER = {"url": "mqtt://127.0.0.1:9", "keepalive_s": 10}  # the discard port: connection refused, retried


def _service(agent_config: Callable[..., Path], spool: Path) -> AgentService:
    config = agent_config(broker=NO_BROKER, telemetry={"interval_s": 60, "spool": {"path": str(spool)}})
    return AgentService(load_config(config))


def _events(service: AgentService, kind: str) -> list[dict[str, Any]]:
    return [event for event in service.recent_events if event["kind"] == kind]


def test_a_full_disk_at_the_first_start_runs_from_memory_then_opens_the_spool(
    agent_config: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool" / "spool.db"
    real_open = Spool._open_database
    full = {"now": True}

    def open_database(self: Spool, synchronous: str) -> sqlite3.Connection:
        if full["now"]:  # what _open_database raises when SQLite meets ENOSPC making the file
            raise SpoolFullError(f"cannot open the spool database {self.path}: the file system is full "
                                 "(database or disk is full)") from sqlite3.OperationalError("database or disk is full")  # fmt: skip
        return real_open(self, synchronous)

    monkeypatch.setattr(Spool, "_open_database", open_database)
    monkeypatch.setattr(spool_opening, "REOPEN_EVERY_S", 0.0)
    service = _service(agent_config, spool)
    service.start()  # before: SpoolFullError, the agent did not start
    try:
        assert service.health()["spool"]["state"] == "disk_full"
        (unavailable,) = _events(service, "spool_unavailable")
        assert "wait in memory" in unavailable["message"] and unavailable["level"] == "warning"
        service.publish_telemetry()
        assert service.health()["spool"]["in_memory"] >= 2  # the start's events and the window, in memory
        full["now"] = False  # room again: the next write opens the spool and the outbox drains into it
        deadline = time.monotonic() + 10
        while service.health()["spool"]["in_memory"] and time.monotonic() < deadline:
            service.retry_outbox()
            time.sleep(0.05)
        health = service.health()["spool"]
        assert health["state"] == "ok" and health["in_memory"] == 0 and health["backlog"] >= 2
        assert spool.is_file()
    finally:
        service.stop()


def test_a_damaged_spool_file_is_moved_aside_and_replaced(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    spool = tmp_path / "spool.db"
    damage = os.urandom(8192)
    spool.write_bytes(damage)
    service = _service(agent_config, spool)
    service.start()  # before: SpoolError 'file is not a database', the agent did not start
    try:
        (moved,) = sorted(tmp_path.glob("spool.db.corrupt-*"))
        assert moved.read_bytes() == damage
        (replaced,) = _events(service, "spool_replaced")
        assert replaced["level"] == "warning" and str(moved) in replaced["message"]
        assert replaced["details"]["moved_to"] == str(moved)
        service.publish_telemetry()
        health = service.health()["spool"]
        assert health["state"] == "ok" and health["backlog"] >= 2  # the warning and the window, in the new spool
    finally:
        service.stop()
    with Spool(spool) as reopened:  # a real spool now
        assert reopened.backlog() >= 2


def test_a_spool_in_use_elsewhere_still_stops_the_start(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    spool = tmp_path / "spool.db"
    with Spool(spool):
        service = _service(agent_config, spool)
        with pytest.raises(Exception, match="already open in another agent process"):
            service.start()
        service.stop()
    assert not list(tmp_path.glob("spool.db.corrupt-*"))
