"""The whole agent with its spool (and command replay record) alone on a real 2 MiB tmpfs and the real
Mosquitto (issue 28 item 1): before, SQLite's WAL filled the disk after ~118 windows and the agent stayed
``disk_full`` for good, refusing every command. Now windows keep flowing, the WAL stays bounded, and a
command sent with the disk filled to the last byte by another file is still answered."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.agent.spool_space import JOURNAL_SIZE_LIMIT_BYTES
from tests.runtime.agent.small_fs import fill, mounted_tmpfs
from tests.runtime.agent_service.test_agent_service_mqtt import Listener, broker_up

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "fs", size_kib=2048) as mount_point:
        yield mount_point


def test_windows_keep_flowing_on_a_2mib_spool_disk_and_commands_are_answered_when_it_is_full(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], small_fs: Path, tmp_path: Path,
    fleet_keys: tuple[Path, Path],
) -> None:  # fmt: skip
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    listener = Listener(fleet, device)
    config_path = agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        bundles={"dir": str(tmp_path / "bundles"), "public_key": str(fleet_keys[1])},
        # broker_ack: the broker's PUBACK stands in for a collector that keeps up
        telemetry={"interval_s": 0.01, "delivery": "broker_ack", "spool": {"path": str(small_fs / "spool.db")}},
    )  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config_path)]) == 0
    service = AgentService(load_config(config_path)).start()
    wal = small_fs / "spool.db-wal"
    try:
        seqs, largest_wal, states = [], 0, set()
        while len(seqs) < 400:  # before: the spool was full for good after ~118 windows
            try:
                seqs.append(listener.next("telemetry", timeout_s=10)["seq"])
            except AssertionError as err:
                raise AssertionError(f"after {len(seqs)} windows: {err}; spool {service.health()['spool']}") from None
            largest_wal = max(largest_wal, wal.stat().st_size if wal.exists() else 0)
            states.add(service.health()["spool"]["state"])
        assert states == {"ok"} and seqs == list(range(seqs[0], seqs[0] + 400))
        assert largest_wal <= JOURNAL_SIZE_LIMIT_BYTES + 64 * 1024, largest_wal

        filler = fill(small_fs)  # another file takes the last byte
        ping_id = listener.command("ping")  # its replay record and its answer need the spool's reserve
        answer = listener.next("events", lambda m: m.get("command_id") == ping_id, timeout_s=15)
        assert answer["kind"] == "pong", answer
        filler.unlink()
        deadline = time.monotonic() + 15
        while service.health()["spool"]["state"] != "ok" or service.health()["spool"]["in_memory"]:
            assert time.monotonic() < deadline, service.health()["spool"]
            time.sleep(0.1)
    finally:
        service.stop()
        listener.close()
