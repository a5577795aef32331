"""Issue 18 on the device: deploy sources, anti-rollback, served-signature changes and the health watch."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.config import BundlesConfig, HealthConfig, load_config
from edgekit_runtime.agent.errors import AgentConfigError, DeployError
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore
from edgekit_runtime.errors import InputSignatureError
from tests.runtime.agent_service.bundles import make_bundle, pack_tar

ONE = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)


class Device:
    def __init__(self, root: Path, public_key: Path, *, sources: tuple[str, ...] = (), window_s: float = 0.0,
                 max_error_rate: float = 0.1) -> None:  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.bundles = BundlesConfig(dir=root, public_key=public_key, max_download_bytes=20_000_000, allowed_sources=sources)
        self.server = InferenceServer()
        self.store = BundleStore(root)
        self.deployer = Deployer(self.store, self.bundles, HealthConfig(window_s=window_s, max_error_rate=max_error_rate, min_requests=1),
                                 self.server, self.events.append)  # fmt: skip
        self.deployer.start()

    def deploy(self, url: str | Path, **args: Any) -> str:
        text = str(url)
        path = None if text.startswith("http") else Path(text.removeprefix("file://"))
        if "sha256" not in args and path is not None and path.exists():
            target = path / "manifest.json" if path.is_dir() else path
            args["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        request = DeployRequest.from_args({"url": str(url), "sha256": args.pop("sha256", "0" * 64), **args}, command_id="c")
        return self.deployer.deploy(request)

    def result(self) -> dict[str, Any]:
        return [e for e in self.events if e["kind"] in ("deploy_result", "rollback_result")][-1]

    def steps(self) -> list[str]:
        return [e["details"].get("step") for e in self.events if e["kind"] == "deploy_progress"]


@pytest.fixture
def make_device(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def make(*, sources: tuple[str, ...] = (), **options: Any) -> Device:
        device = Device(tmp_path / "device", fleet_keys[1], sources=(str(tmp_path / "src"), *sources), **options)
        made.append(device)
        return device

    yield make
    for device in made:
        device.server.close()


@pytest.fixture
def bundle(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Callable[..., Path]:
    """``bundle(name, version, where=..., **make_bundle_options)`` -> a signed bundle directory."""
    counter = iter(range(1000))

    def make(name: str = "tiny-a", version: int | None = None, *, where: Path | None = None, **options: Any) -> Path:
        root = make_bundle((where or tmp_path / "src") / f"{name}-{next(counter)}", name=name, bundle_version=version, **options)
        sign_bundle(root, fleet_keys[0])
        return root

    return make


# -- deploy sources -------------------------------------------------------------------------------------


def test_bundles_in_the_inbox_deploy_by_default(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device()
    inbox = device.bundles.inbox_dir
    inbox.mkdir(parents=True)
    tar = pack_tar(bundle("tiny-a", where=inbox), inbox / "tiny-a.tar")
    assert device.deploy(tar) == "succeeded" and device.deployer.served.name == "tiny-a"
    assert device.deploy(tar.as_uri()) == "succeeded"


def test_a_refused_file_url_reveals_nothing(make_device: Callable[..., Device], tmp_path: Path) -> None:
    device = make_device()
    secret = tmp_path / "secret.txt"
    secret.write_text("the device's private data", encoding="utf-8")
    messages = []
    for url in (secret.as_uri(), (tmp_path / "missing.txt").as_uri(), str(secret), str(tmp_path / "missing.txt"),
                f"{device.bundles.inbox_dir}/../../secret.txt", f"file://{device.bundles.inbox_dir}/%2e%2e/%2e%2e/secret.txt"):  # fmt: skip
        assert device.deploy(url, sha256="0" * 64) == "failed"
        result = device.result()
        assert result["details"]["step"] == "download" and device.steps()[-1] == "started"  # never "downloaded"
        messages.append(result["message"].replace(url, "URL"))
        assert "sha256" not in json.dumps(result) or "0" * 64 not in result["message"]
    assert len(set(messages)) == 1, messages  # the same text whether the file exists or not
    assert "deploy source refused: 'URL' is not under the agent's inbox" in messages[0]
    assert "nothing was read or fetched" in messages[0] and secret.read_text(encoding="utf-8").startswith("the device")


def test_a_link_in_the_inbox_cannot_lead_out_of_it(make_device: Callable[..., Device], bundle: Callable[..., Path], tmp_path: Path) -> None:
    device = make_device()
    device.bundles.inbox_dir.mkdir(parents=True)
    outside = pack_tar(bundle("tiny-a"), tmp_path / "outside.tar")
    link = device.bundles.inbox_dir / "looks-inside.tar"
    link.symlink_to(outside)
    assert device.deploy(link) == "failed"
    assert "deploy source refused" in device.result()["message"] and device.deployer.served is None


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append(self.path)
        if self.path.startswith("/fleet-a/redirect"):
            self.send_response(302)
            self.send_header("Location", "/internal/admin.tar")
            self.end_headers()
            return
        super().do_GET()


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, list[str], Path]]:
    root = tmp_path / "www"
    (root / "fleet-a").mkdir(parents=True)
    (root / "internal").mkdir()
    requests: list[str] = []
    handler = functools.partial(type("Handler", (_CountingHandler,), {"requests": requests}), directory=str(root))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests, root
        httpd.shutdown()


def test_http_sources_are_held_to_the_allowed_prefixes(
    make_device: Callable[..., Device], bundle: Callable[..., Path], web: tuple[str, list[str], Path]
) -> None:
    base, requests, root = web
    tar = pack_tar(bundle("tiny-h"), root / "fleet-a" / "tiny-h.tar")
    shutil.copy(tar, root / "internal" / "admin.tar")
    sha256 = hashlib.sha256(tar.read_bytes()).hexdigest()
    device = make_device(sources=(f"{base}/fleet-a/",))
    port = base.rsplit(":", 1)[1]
    for url in (f"{base}/internal/admin.tar", f"{base}/fleet-a-evil/tiny-h.tar", f"{base}/fleet-a/../internal/admin.tar",
                f"{base}/fleet-a/%2e%2e/internal/admin.tar", f"http://localhost:{port}/fleet-a/tiny-h.tar",
                f"http://127.0.0.1:{port}@169.254.169.254/fleet-a/tiny-h.tar", f"https://127.0.0.1:{port}/fleet-a/tiny-h.tar"):  # fmt: skip
        assert device.deploy(url, sha256=sha256) == "failed", url
        assert "deploy source refused" in device.result()["message"], url
    assert requests == []  # nothing was fetched for any refused URL
    assert device.deploy(f"{base}/fleet-a/redirect.tar", sha256=sha256) == "failed"
    assert f"deploy source refused: '{base}/internal/admin.tar'" in device.result()["message"]
    assert requests == ["/fleet-a/redirect.tar"]  # the redirect's target was never requested
    assert device.deploy(f"{base}/fleet-a/tiny-h.tar", sha256=sha256) == "succeeded"
    assert device.deployer.served.name == "tiny-h"


def test_allowed_sources_in_the_agent_config(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    config = load_config(agent_config(bundles={"dir": str(tmp_path / "b"), "allow_unsigned": True,
                                               "allowed_sources": ["https://bundles.example.com/fleet-a", "/mnt/usb"]}))  # fmt: skip
    assert config.bundles.allowed_sources == ("https://bundles.example.com/fleet-a", "/mnt/usb")
    assert config.bundles.inbox_dir == tmp_path / "b" / "inbox" and config.bundles.max_download_bytes == 1024**3
    for entry, fragment in [
        ("ftp://host/x", "unsupported scheme 'ftp'"),
        ("relative/dir", "must be an absolute directory path"),
        ("https://user:pw@host/", "needs a host name and no user:password@ part"),
        ("https://host/a/../b", "without '..', query or fragment"),
    ]:
        path = agent_config(bundles={"dir": str(tmp_path / "b"), "allow_unsigned": True, "allowed_sources": [entry]})
        with pytest.raises(AgentConfigError) as caught:
            load_config(path)
        # FILE:LINE:COLUMN of the entry, as every agent config error names it
        assert re.match(rf"{re.escape(str(path))}:\d+:\d+: bundles\.allowed_sources\[0\]: ", caught.value.message), caught.value.message
        assert fragment in caught.value.message


# -- anti-rollback ---------------------------------------------------------------------------------------


def test_an_older_bundle_is_refused_unless_the_deploy_allows_it(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device()
    assert device.deploy(bundle("tiny-a", 1_700_000_002_000)) == "succeeded"
    newer = device.store.current
    old = pack_tar(bundle("tiny-a", 1_700_000_001_000), device.store.root.parent / "src" / "old.tar")
    assert device.deploy(old) == "failed"
    result = device.result()
    assert result["details"]["step"] == "version"
    assert ("bundle 'tiny-a' is version 1700000001000 (2023-11-14T22:13:21+00:00), older than version 1700000002000 "
            "(2023-11-14T22:13:22+00:00) this device already accepted; refusing a downgrade") in result["message"]  # fmt: skip
    assert "allow_downgrade: true" in result["details"]["error"]
    assert device.store.current == newer and list(device.store.staging_dir.iterdir()) == []  # nothing unpacked, nothing kept
    assert device.deploy(old, allow_downgrade=True) == "succeeded" and device.deployer.served.name == "tiny-a"
    assert device.deployer.ledger.highest() == 1_700_000_002_000  # the highest stays
    # issue 28: versions are per model slot, so an older bundle under another name is a downgrade too
    assert device.deploy(bundle("tiny-b", 5)) == "failed" and "(bundle 'tiny-a', this device's model slot)" in device.result()["message"]


def test_rollback_stays_allowed_and_the_ledger_survives_a_restart(
    make_device: Callable[..., Device], bundle: Callable[..., Path]
) -> None:
    device = make_device()
    v1, v2 = bundle("tiny-a", 1000), bundle("tiny-a", 2000)
    assert device.deploy(v1) == "succeeded" and device.deploy(v2) == "succeeded"
    assert device.deployer.rollback(command_id="r") is True and device.result()["details"]["outcome"] == "succeeded"
    assert json.loads(device.store.current.joinpath("manifest.json").read_text())["bundle_version"] == 1000
    device.server.close()
    restarted = make_device()
    assert restarted.deployer.served is not None and restarted.deployer.ledger.highest() == 2000
    assert restarted.deploy(bundle("tiny-a", 1500)) == "failed" and restarted.result()["details"]["step"] == "version"


def test_a_failed_watch_does_not_raise_the_version(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device(window_s=0.5, max_error_rate=0.2)
    assert device.deploy(bundle("tiny-a", 1000)) == "succeeded"
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                device.server.infer({"image": ONE})
            except Exception:  # noqa: BLE001 - the unhealthy model fails these on purpose
                pass
            time.sleep(0.01)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        assert device.deploy(bundle("tiny-a", 3000, model="even_batches")) == "rolled_back"
    finally:
        stop.set()
        thread.join()
    assert device.deployer.ledger.highest() == 1000
    assert device.deploy(bundle("tiny-a", 2000)) == "succeeded"


def test_versions_of_bundles_without_bundle_version_and_a_broken_ledger(
    make_device: Callable[..., Device], bundle: Callable[..., Path]
) -> None:
    device = make_device()
    assert device.deploy(bundle("tiny-a")) == "succeeded"  # no bundle_version: its created time, 2025-01-01
    assert device.deployer.ledger.highest() == 1_735_689_600_000
    assert device.deploy(bundle("tiny-a", 1_700_000_000_000)) == "failed" and "refusing a downgrade" in device.result()["message"]
    device.deployer.ledger.path.write_text("{not json", encoding="utf-8")
    assert device.deploy(bundle("tiny-a", 1_800_000_000_000)) == "failed"
    assert f"the anti-rollback ledger '{device.deployer.ledger.path}' cannot be read: not valid JSON" in device.result()["message"]


def test_a_device_upgraded_to_the_ledger_records_what_it_serves(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device()
    assert device.deploy(bundle("tiny-a", 4000)) == "succeeded"
    device.deployer.ledger.path.unlink()  # an agent from before the ledger
    device.server.close()
    restarted = make_device()
    assert restarted.deployer.ledger.highest() == 4000
    assert restarted.deploy(bundle("tiny-a", 3000)) == "failed"


# -- the served signature and the health watch ------------------------------------------------------------


def test_a_changed_signature_is_refused_unless_allowed(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device()
    assert device.deploy(bundle("tiny-a")) == "succeeded"
    flat = bundle("tiny-flat", model="flat_input")
    assert device.deploy(flat) == "failed"
    result = device.result()
    assert result["details"]["step"] == "io_signature"
    assert "changes the served inputs/outputs (input 'image' float32[batch, 1, 8, 8] -> float32[batch, 64])" in result["message"]
    assert "allow_signature_change: true" in result["details"]["error"] and device.deployer.served.name == "tiny-a"
    assert device.deploy(flat, allow_signature_change=True) == "succeeded" and device.deployer.served.name == "tiny-flat"


def _watch_with_traffic(device: Device, deploy: Callable[[], str], feeds: dict[str, np.ndarray]) -> tuple[str, int]:
    stop, rejected = threading.Event(), [0]

    def traffic() -> None:
        while not stop.is_set():
            try:
                device.server.infer(feeds)
            except InputSignatureError:
                rejected[0] += 1
            time.sleep(0.005)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        return deploy(), rejected[0]
    finally:
        stop.set()
        thread.join()


def test_requests_rejected_by_a_changed_signature_fail_the_watch(make_device: Callable[..., Device], bundle: Callable[..., Path]) -> None:
    device = make_device(window_s=0.6, max_error_rate=0.2)
    assert device.deploy(bundle("tiny-a")) == "succeeded"
    flat = bundle("tiny-flat", model="flat_input")
    outcome, rejected = _watch_with_traffic(device, lambda: device.deploy(flat, allow_signature_change=True), {"image": ONE})
    assert outcome == "rolled_back" and rejected > 0  # the clients still send [1, 1, 8, 8]
    health = device.result()["details"]["health"]
    assert health["rejected"] > 0 and health["rejected_count_as_errors"] is True and health["error_rate"] > 0.2
    assert "rejected for not fitting its changed inputs" in device.result()["message"]
    assert device.deployer.served.name == "tiny-a"


def test_rejected_requests_do_not_fail_a_watch_when_the_signature_is_unchanged(
    make_device: Callable[..., Device], bundle: Callable[..., Path]
) -> None:
    device = make_device(window_s=0.4, max_error_rate=0.2)
    assert device.deploy(bundle("tiny-a")) == "succeeded"
    wrong = {"image": np.zeros((1, 3, 8, 8), dtype=np.float32)}  # a client's own mistake, before and after
    outcome, rejected = _watch_with_traffic(device, lambda: device.deploy(bundle("tiny-b")), wrong)
    assert outcome == "succeeded" and rejected > 0
    health = device.result()["details"]
    assert device.deployer.served.name == "tiny-b" and health["outcome"] == "succeeded"


@pytest.mark.parametrize("flag", ["allow_downgrade", "allow_signature_change"])
def test_deploy_flags_must_be_booleans(flag: str) -> None:
    with pytest.raises(DeployError, match=f"deploy: args.{flag} must be true or false, got 'yes'"):
        DeployRequest.from_args({"url": "/x", "sha256": "a" * 64, flag: "yes"})
    assert getattr(DeployRequest.from_args({"url": "/x", "sha256": "a" * 64, flag: True}), flag) is True


def test_the_schema_accepts_the_deploy_flags() -> None:
    from edgekit_runtime.schemas import validate_message

    validate_message({"schema": "edgekit.command/1", "id": "c1", "command": "deploy",
                      "args": {"bundle_id": "b", "url": "https://x/b.tar", "sha256": "a" * 64,
                               "allow_downgrade": True, "allow_signature_change": False}}, "command.v1")  # fmt: skip


def test_inbox_listing_does_not_change_with_a_refusal(make_device: Callable[..., Device], tmp_path: Path) -> None:
    device = make_device()
    before = sorted(os.listdir(tmp_path))
    assert device.deploy("file:///etc/shadow", sha256="0" * 64) == "failed"
    assert sorted(os.listdir(tmp_path)) == before


def test_the_issue_scenario_over_the_local_api(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], tmp_path: Path
) -> None:
    """Clients of the old model keep calling the HTTP API (HTTP 400 after the switch); the watch rolls back."""
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.client import AgentClient
    from edgekit_runtime.agent.service import AgentService

    path = agent_config(health={"window_s": 1.0, "max_error_rate": 0.2, "min_requests": 5})
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(path)]) == 0
    service = AgentService(load_config(path)).start()
    client = AgentClient(service.api_address)
    stop, answered, rejected = threading.Event(), [0], [0]

    def old_clients() -> None:
        while not stop.is_set():
            try:
                client.infer({"image": ONE})
                answered[0] += 1
            except InputSignatureError:
                rejected[0] += 1
            time.sleep(0.005)

    flat = signed_bundle("tiny-flat", model="flat_input")
    thread = threading.Thread(target=old_clients)
    thread.start()
    try:
        time.sleep(0.2)
        service.dispatch_command({"id": "d1", "command": "deploy", "args": {
            "url": str(flat), "sha256": hashlib.sha256((flat / "manifest.json").read_bytes()).hexdigest(), "allow_signature_change": True}})  # fmt: skip
        deadline = time.monotonic() + 30
        while not [e for e in service.recent_events if e["kind"] == "deploy_result"] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
        result = [e for e in service.recent_events if e["kind"] == "deploy_result"]
        service.stop()
    assert result and result[-1]["details"]["outcome"] == "rolled_back", result
    assert rejected[0] > 0 and answered[0] > 0  # HTTP 400 while tiny-flat served, answers before and after
    assert result[-1]["details"]["health"]["rejected"] > 0 and service.server.model_name == "tiny-a"


def test_a_forged_or_bombed_tar_is_refused_before_its_files_are_written(
    make_device: Callable[..., Device], bundle: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]
) -> None:
    import io
    import tarfile

    device = make_device()
    forged = bundle("tiny-a")
    (forged / "payload.bin").write_bytes(b"\x00" * 1000)  # unlisted: extracting would be refused for that ...
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["name"] = "tiny-forged"  # ... but the manifest no longer matches its signature, which is checked first
    (forged / "manifest.json").write_text(json.dumps(manifest))
    assert device.deploy(pack_tar(forged, tmp_path / "src" / "forged.tar")) == "failed"
    assert device.result()["details"]["step"] == "signature" and "does not match manifest.json" in device.result()["message"]
    assert "payload.bin" not in device.result()["message"]

    bomb = tmp_path / "src" / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz", compresslevel=1) as tar:
        data = (bundle("tiny-b") / "manifest.json").read_bytes()
        for name, payload in (("bundle/manifest.json", data), ("bundle/zeros.bin", bytes(8 << 20))):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    assert device.deploy(bomb) == "failed"
    assert "compression ratio" in device.result()["message"] and "at member 'bundle/zeros.bin'" in device.result()["message"]
    assert list(device.store.staging_dir.iterdir()) == [] and device.deployer.served is None
