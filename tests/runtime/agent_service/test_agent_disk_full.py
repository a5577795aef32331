"""The whole agent with its spool and bundles on a real small file system (tmpfs) and the real Mosquitto:
the disk fills, the agent reports it and keeps serving; space is freed, and telemetry resumes with every
window it produced meanwhile, numbered without gaps or duplicates."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent.small_fs import fill, mounted_tmpfs
from tests.runtime.agent_service.bundles import pack_tar
from tests.runtime.agent_service.test_agent_service_mqtt import Listener, broker_up

TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"  # utc_timestamp()

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "fs", size_kib=2048) as mount_point:
        yield mount_point


@pytest.fixture
def listener(ids: tuple[str, str]) -> Iterator[Listener]:
    listener = Listener(*ids)
    yield listener
    listener.close()


@pytest.fixture
def ids() -> tuple[str, str]:
    import uuid

    return f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_agent(agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], small_fs: Path,
                fleet: str, device: str, public_key: Path, **spool: object) -> AgentService:  # fmt: skip
    config_path = agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        bundles={"dir": str(small_fs / "bundles"), "public_key": str(public_key)},
        telemetry={"interval_s": 0.3, "spool": {"path": str(small_fs / "spool" / "spool.db"), **spool}},
    )  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config_path)]) == 0
    return AgentService(load_config(config_path)).start()


def test_disk_full_is_reported_served_through_and_recovered_without_gaps(
    ids: tuple[str, str], listener: Listener, agent_config: Callable[..., Path], signed_bundle: Callable[..., Path],
    small_fs: Path, tmp_path: Path, fleet_keys: tuple[Path, Path],
) -> None:  # fmt: skip
    fleet, device = ids
    service = start_agent(agent_config, signed_bundle, small_fs, fleet, device, fleet_keys[1])
    client = AgentClient(service.api_address)
    x = np.zeros((1, 1, 8, 8), np.float32)
    try:
        first = listener.next("telemetry")
        filler = fill(small_fs)
        wait_until(lambda: service.health()["spool"]["state"] == "disk_full", "the agent to report disk_full")

        # Serving goes on, and health says what is wrong (still 200: the model is served).
        assert client.infer({"image": x})["logits"].shape == (1, 10)
        health = client.health()
        assert health["status"] == "ok" and health["spool"]["state"] == "disk_full"
        assert [p["code"] for p in health["problems"]] == ["spool.disk_full"]
        assert "the file system is full" in health["problems"][0]["message"]
        # A deploy now fails (no room for the bundle); its failure event waits in memory with the windows.
        tar = pack_tar(signed_bundle("tiny-b"), tmp_path / "tiny-b.tar")
        # (Given to the service directly: over MQTT the link itself refuses commands it cannot record on disk.)
        deploy_id = "deploy-while-full"
        service.dispatch_command({"id": deploy_id, "command": "deploy", "args": {
            "bundle_id": "b-2", "url": tar.as_uri(), "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()}})  # fmt: skip
        # The deployer reports a failed deploy as deploy_result, or (an OSError it does not map) the
        # service reports the crash of the deploy thread as an error event; either must reach the broker.
        def deploy_failure(m: dict) -> bool:
            return (m["kind"] == "deploy_result" and m.get("command_id") == deploy_id) or (
                m["kind"] == "error" and "edgekit-deploy" in m["message"])

        wait_until(lambda: any(deploy_failure(e) for e in service.recent_events), "the deploy to end", 30)
        # A command over MQTT is answered by the link itself (a pong, or command_rejected when the link
        # cannot record the command on the full disk): that answer waits in memory too.
        ping_id = listener.command("ping")
        wait_until(lambda: any(e.get("command_id") == ping_id for e in service.recent_events), "an answer to the ping")
        wait_until(lambda: service.health()["spool"]["in_memory"] >= 7, "windows to wait in memory")
        assert service.health()["spool"]["in_memory_dropped"] == 0

        filler.unlink()
        wait_until(lambda: service.health()["spool"]["state"] == "ok" and service.health()["spool"]["in_memory"] == 0,
                   "the agent to write its spool again")  # fmt: skip
        assert service.health()["problems"] == []
        result = listener.next("events", deploy_failure)
        assert result["level"] == "error", result
        answer = listener.next("events", lambda m: m.get("command_id") == ping_id)
        assert answer["kind"] in {"pong", "command_rejected"}, answer
        seqs = [first["seq"]]
        full_windows = []
        while True:  # every window up to one built after recovery, in order
            message = listener.next("telemetry", timeout_s=10)
            validate_message(message, "telemetry.v1")
            seqs.append(message["seq"])
            if any(e["code"] == "spool.disk_full" for e in message["errors"]):
                full_windows.append(message)
            elif full_windows:
                break
        assert seqs == list(range(first["seq"], first["seq"] + len(seqs))), seqs  # no gap, no duplicate
        assert len(full_windows) >= 3
        assert all(m["spool"]["dropped"] == 0 for m in full_windows)
    finally:
        service.stop()


def test_past_the_memory_bound_the_oldest_messages_are_dropped_and_counted(
    ids: tuple[str, str], listener: Listener, agent_config: Callable[..., Path], signed_bundle: Callable[..., Path],
    small_fs: Path, fleet_keys: tuple[Path, Path],
) -> None:  # fmt: skip
    fleet, device = ids
    service = start_agent(agent_config, signed_bundle, small_fs, fleet, device, fleet_keys[1], overflow_messages=3)
    try:
        first = listener.next("telemetry")
        filler = fill(small_fs)
        wait_until(lambda: service.health()["spool"]["in_memory_dropped"] >= 2, "windows to be dropped from memory")
        spool = service.health()["spool"]
        assert spool["state"] == "disk_full" and spool["in_memory"] == 3 and spool["in_memory_max"] == 3
        filler.unlink()
        wait_until(lambda: service.health()["spool"]["in_memory"] == 0, "the agent to write its spool again")
        dropped = service.health()["spool"]["in_memory_dropped"]
        # Windows dropped from memory take their numbers once the spool is written again (a gap the collector
        # sees) and are reported in a telemetry_dropped event (issue 28 item 10).
        report = listener.next("events", lambda m: m["kind"] == "telemetry_dropped", timeout_s=30)  # 15 s was missed once at load 16
        validate_message(report, "event.v1")
        details = report["details"]
        missing = {seq for a, b in details["seq_ranges"] for seq in range(a, b + 1)}
        assert "in_memory" in details["reasons"] and len(missing) == details["windows"] >= 2
        # which period was lost: the dropped windows' window.start (before: the string "None")
        assert re.fullmatch(TIMESTAMP, details["first_window_start"]) and re.fullmatch(TIMESTAMP, details["last_window_start"])
        assert first["window"]["start"] < details["first_window_start"] <= details["last_window_start"]
        assert service._spool.dropped_total() >= dropped >= 2
        seqs = [first["seq"]]
        while seqs[-1] <= max(missing):
            seqs.append(listener.next("telemetry")["seq"])
        assert sorted(seqs + sorted(missing)) == list(range(first["seq"], seqs[-1] + 1))  # stored or reported
    finally:
        service.stop()
