"""A deploy that meets a full disk (a real, small tmpfs under ``bundles.dir``) is a failed ``deploy_result``
that says so and how many bytes it needed, over the real Mosquitto; the agent keeps serving the old bundle, no
partial file is left, and the same deploy succeeds once there is room."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent.small_fs import mounted_tmpfs
from tests.runtime.agent_service.bundles import pack_tar
from tests.runtime.agent_service.test_agent_service_mqtt import Listener, broker_up

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")

X = np.zeros((1, 1, 8, 8), np.float32)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "fs", size_kib=4096) as mount_point:
        yield mount_point


def leave_free(directory: Path, free_bytes: int) -> Path:
    """A filler file that leaves about ``free_bytes`` free on ``directory``'s file system."""
    filler = directory / "filler"
    with filler.open("wb") as out:
        out.write(b"\0" * (shutil.disk_usage(directory).free - free_bytes))
    return filler


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return found


def deploy(service: AgentService, listener: Listener, url: str, sha256: str) -> dict[str, Any]:
    command_id = uuid.uuid4().hex
    service.dispatch_command({"id": command_id, "command": "deploy",
                              "args": {"bundle_id": "big", "url": url, "sha256": sha256}})  # fmt: skip
    result = listener.next("events", lambda m: m["kind"] == "deploy_result" and m.get("command_id") == command_id, 30)
    validate_message(result, "event.v1")
    return result


def test_a_deploy_that_meets_a_full_disk_fails_cleanly_and_the_old_bundle_serves_on(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], small_fs: Path, tmp_path: Path,
    fleet_keys: tuple[Path, Path],
) -> None:  # fmt: skip
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    config_path = agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        bundles={"dir": str(small_fs / "bundles"), "public_key": str(fleet_keys[1]), "allowed_sources": [str(tmp_path / "src")]},
        telemetry={"interval_s": 0.5, "spool": {"path": str(tmp_path / "spool.db")}},
    )  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config_path)]) == 0
    big = signed_bundle("tiny-big", golden_batch_sizes=(128,) * 19)  # about 0.6 MB of golden data
    tar = pack_tar(big, tmp_path / "src" / "tiny-big.tar")
    tar_sha256 = hashlib.sha256(tar.read_bytes()).hexdigest()
    tar_bytes = tar.stat().st_size
    files_bytes = sum(p.stat().st_size for p in big.rglob("*") if p.is_file())
    assert 500_000 < tar_bytes < 1_000_000
    listener = Listener(fleet, device)
    service = AgentService(load_config(config_path)).start()
    try:
        versions_before = sorted(os.listdir(service.store.versions_dir))

        def assert_untouched(result: dict[str, Any], free_before: int) -> None:
            assert result["level"] == "error" and result["details"]["outcome"] == "failed", result
            assert result["details"]["step"] == "download"
            assert "the partial files were removed" in result["message"]
            assert "free space on the file system of bundles.dir" in result["details"]["error"]
            assert service.deployer.served is not None and service.deployer.served.bundle_id.startswith("tiny-a-")
            assert service.server.infer({"image": X}).outputs["logits"].shape == (1, 10)
            assert os.listdir(service.store.staging_dir) == []  # no partial tar or files
            assert sorted(os.listdir(service.store.versions_dir)) == versions_before
            assert shutil.disk_usage(small_fs).free >= free_before  # every byte the deploy wrote is given back
            assert not any(e["kind"] == "error" for e in service.recent_events), "a crash, not a deploy_result"

        # 1. No room for the tar itself: the copy fails part-way with ENOSPC.
        filler = leave_free(small_fs, 200_000)
        free_before = shutil.disk_usage(small_fs).free
        result = deploy(service, listener, tar.as_uri(), tar_sha256)
        assert result["message"].startswith(f"deploy of {tar.as_uri()} failed at download: no space left on the device: "
                                            f"copying the bundle tar needs {tar_bytes:,} bytes under {service.store.staging_dir}, ")
        assert f"{free_before:,} bytes are free there" in result["message"]
        assert_untouched(result, free_before)

        # 2. Room for the tar, not for its files beside it: refused before a file is unpacked.
        filler.unlink()
        filler = leave_free(small_fs, tar_bytes + 300_000)
        free_before = shutil.disk_usage(small_fs).free
        result = deploy(service, listener, tar.as_uri(), tar_sha256)
        assert (f"unpacking the bundle beside its {tar_bytes:,}-byte tar needs " in result["message"]
                and "bytes under " in result["message"])  # fmt: skip
        needed = int(result["message"].split(" needs ")[1].split(" bytes")[0].replace(",", ""))
        assert files_bytes - 4096 <= needed <= files_bytes  # the files the manifest lists
        assert_untouched(result, free_before)

        # 2b. Room for the files' bytes but not for the blocks they take: the disk fills while unpacking.
        filler.unlink()
        filler = leave_free(small_fs, tar_bytes + needed + 8192)
        free_before = shutil.disk_usage(small_fs).free
        result = deploy(service, listener, tar.as_uri(), tar_sha256)
        assert f"unpacking the bundle beside its {tar_bytes:,}-byte tar needs {needed:,} bytes under " in result["message"]
        assert "not a complete, readable tar" not in result["message"]
        free_reported = int(result["message"].split(f"under {service.store.staging_dir}, ")[1].split(" bytes are free")[0].replace(",", ""))
        assert free_reported > needed  # more than the bytes: the write failed (not the check before it), then was undone
        assert_untouched(result, free_before)

        # 3. A bundle directory that does not fit.
        filler.unlink()
        filler = leave_free(small_fs, 200_000)
        free_before = shutil.disk_usage(small_fs).free
        manifest_sha256 = hashlib.sha256((big / "manifest.json").read_bytes()).hexdigest()
        result = deploy(service, listener, big.as_uri(), manifest_sha256)
        assert f"copying the bundle directory needs {files_bytes:,} bytes" in result["message"]
        assert_untouched(result, free_before)

        # Telemetry went on meanwhile, and the same deploy succeeds once there is room.
        listener.next("telemetry")
        filler.unlink()
        result = deploy(service, listener, tar.as_uri(), tar_sha256)
        assert result["details"]["outcome"] == "succeeded", result
        assert service.deployer.served is not None and service.deployer.served.bundle_id == "big"
        assert service.server.infer({"image": X}).outputs["logits"].shape == (1, 10)
    finally:
        service.stop()
        listener.close()


def test_a_download_that_meets_a_full_disk_says_what_the_server_declared(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], small_fs: Path, tmp_path: Path,
    fleet_keys: tuple[Path, Path],
) -> None:  # fmt: skip
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    big = signed_bundle("tiny-big", golden_batch_sizes=(128,) * 19)
    tar = pack_tar(big, served / "tiny-big.tar")
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    config_path = agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        bundles={"dir": str(small_fs / "bundles"), "public_key": str(fleet_keys[1]), "allowed_sources": [base]},
    )  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config_path)]) == 0
    listener = Listener(fleet, device)
    service = AgentService(load_config(config_path)).start()
    try:
        filler = leave_free(small_fs, 200_000)
        free_before = shutil.disk_usage(small_fs).free
        result = deploy(service, listener, base + "tiny-big.tar", hashlib.sha256(tar.read_bytes()).hexdigest())
        assert result["details"]["outcome"] == "failed" and result["details"]["step"] == "download"
        assert (f"no space left on the device: downloading the bundle tar needs {tar.stat().st_size:,} bytes under "
                f"{service.store.staging_dir}, {free_before:,} bytes are free there") in result["message"]  # fmt: skip
        assert "check the network" not in result["details"]["error"]  # not reported as a network failure
        assert os.listdir(service.store.staging_dir) == [] and shutil.disk_usage(small_fs).free >= free_before
        assert service.server.infer({"image": X}).outputs["logits"].shape == (1, 10)
        filler.unlink()
    finally:
        service.stop()
        listener.close()
        httpd.shutdown()
