"""Downgrade protection per model slot, and ``allow_downgrade`` only in signed commands (issue 28, item 6).

Real pieces: signed bundles run by ONNX Runtime, the agent's bundle stores and ledgers on disk, a whole
:class:`AgentService` answering deploy commands over a private Mosquitto.
"""

from __future__ import annotations

import hashlib
import json
import queue
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.bundle.signing import generate_keypair, sign_bundle
from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit_runtime.agent.config import BundlesConfig, HealthConfig, load_config
from edgekit_runtime.agent.deploy_checks import LEDGER_NAME
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.agent.store import BundleStore
from tests.runtime.agent.mosquitto import MosquittoBroker
from tests.runtime.agent_service.bundles import make_bundle

FLEET, DEVICE = "lab", "dev-1"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "keys" / "fleet.key.pem", tmp_path / "keys" / "fleet.pub.pem"
    private.parent.mkdir()
    generate_keypair(private, public)
    return private, public


@pytest.fixture
def bundle(tmp_path: Path, keys: tuple[Path, Path]) -> Callable[[str, int], Path]:
    counter = iter(range(1000))

    def make(name: str, version: int) -> Path:
        root = make_bundle(tmp_path / "src" / f"{name}-{next(counter)}", name=name, bundle_version=version)
        sign_bundle(root, keys[0])
        return root

    return make


def _deploy(deployer: Deployer, path: Path, **args: Any) -> str:
    sha256 = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
    return deployer.deploy(DeployRequest.from_args({"url": str(path), "sha256": sha256, **args}, command_id="c"))


def test_the_ledger_is_per_model_slot_not_per_bundle_name(tmp_path: Path, keys: tuple[Path, Path],
                                                          bundle: Callable[[str, int], Path]) -> None:  # fmt: skip
    events: list[dict[str, Any]] = []
    servers = []

    def slot(name: str) -> Deployer:
        servers.append(InferenceServer())
        bundles = BundlesConfig(dir=tmp_path / "models" / name, public_key=keys[1], allowed_sources=(str(tmp_path / "src"),))
        deployer = Deployer(BundleStore(bundles.dir), bundles, HealthConfig(window_s=0), servers[-1], events.append, model=name)
        deployer.start()
        return deployer

    try:
        detector, keywords = slot("detector"), slot("keywords")
        assert _deploy(detector, bundle("tiny-a", 2000)) == "succeeded"
        # an older bundle under another name is still older in this slot
        assert _deploy(detector, bundle("tiny-b", 1000)) == "failed"
        result = events[-1]
        assert result["kind"] == "deploy_result" and result["details"]["step"] == "version"
        assert "bundle 'tiny-b' is version 1000" in result["message"] and "older than version 2000" in result["message"]
        assert "(bundle 'tiny-a', model slot 'detector')" in result["message"]
        assert detector.served is not None and detector.served.name == "tiny-a"
        # another slot keeps its own ledger
        assert _deploy(keywords, bundle("tiny-b", 1000)) == "succeeded" and keywords.ledger.highest() == 1000
        assert detector.ledger.highest() == 2000
        # a ledger written per bundle name (before this change) still bounds the whole slot
        legacy = tmp_path / "models" / "keywords" / LEDGER_NAME
        legacy.write_text(json.dumps({"models": {"tiny-x": {"bundle_version": 5000, "manifest_sha256": "0" * 64}}}))
        assert _deploy(keywords, bundle("tiny-c", 4000)) == "failed" and "(bundle 'tiny-x', model slot 'keywords')" in events[-1]["message"]
        assert _deploy(keywords, bundle("tiny-c", 6000)) == "succeeded" and keywords.ledger.highest() == 6000
        assert json.loads(legacy.read_text())["slot"]["bundle"] == "tiny-c"
    finally:
        for server in servers:
            server.close()


class Fleet:
    """The host side of a device: its events as they arrive, and commands (signed with ``signing_key``)."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self.broker = broker
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-{uuid.uuid4().hex[:8]}")
        self.client.on_message = lambda client, userdata, message: self.events.put(json.loads(message.payload))
        self.client.connect(broker.host, broker.port)
        self.client.subscribe(f"edgekit/v1/{FLEET}/{DEVICE}/events", qos=1)
        self.client.loop_start()

    def deploy(self, path: Path, signing_key: Path | None = None, **args: Any) -> str:
        sha256 = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
        command = build_command("deploy", {"bundle_id": path.name, "url": path.as_uri(), "sha256": sha256, **args})
        with CommandPublisher(self.broker.url, signing_key=signing_key) as publisher:
            publisher.send(FLEET, DEVICE, command)
        return str(command["id"])

    def answer(self, command_id: str, kinds: tuple[str, ...], timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every event of ``command_id`` up to and including the first of ``kinds``."""
        seen, deadline = [], time.monotonic() + timeout_s
        while True:
            try:
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {kinds} for {command_id} within {timeout_s} s; saw {seen}") from None
            if event.get("command_id") == command_id:
                seen.append(event)
                if event["kind"] in kinds:
                    return seen

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _agent(tmp_path: Path, keys: tuple[Path, Path], broker: MosquittoBroker, *, require_signed: bool) -> AgentService:
    data = {
        "device_id": DEVICE, "fleet": FLEET, "broker": {"url": broker.url, "keepalive_s": 5},
        "bundles": {"dir": str(tmp_path / "bundles"), "public_key": str(keys[1]), "allowed_sources": [str(tmp_path / "src")]},
        "api": {"address": "127.0.0.1:0"}, "power": {"sensor": "none"}, "health": {"window_s": 0},
        "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "state" / "spool.db")}},
        "commands": {"require_signed": require_signed},
    }  # fmt: skip
    path = tmp_path / f"agent-{'signed' if require_signed else 'open'}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    service = AgentService(load_config(path)).start()
    service.link.wait_connected(10)
    return service


def test_allow_downgrade_is_honoured_only_in_signed_commands_and_always_reported(
    tmp_path: Path, keys: tuple[Path, Path], bundle: Callable[[str, int], Path], mosquitto_factory: Any,
) -> None:  # fmt: skip
    broker = mosquitto_factory()
    fleet = Fleet(broker)
    newer, older = bundle("tiny-a", 2000), bundle("tiny-a", 1000)
    try:
        service = _agent(tmp_path, keys, broker, require_signed=False)
        try:
            first = fleet.deploy(newer)
            assert fleet.answer(first, ("deploy_result",))[-1]["details"]["outcome"] == "succeeded"
            # unsigned (and even signed) commands on an agent that does not require signatures: refused, said why
            for signing_key in (None, keys[0]):
                refused = fleet.answer(fleet.deploy(older, signing_key, allow_downgrade=True), ("command_rejected", "deploy_result"))
                assert [event["kind"] for event in refused] == ["command_rejected"]
                message = refused[-1]["message"]
                assert "allow_downgrade is honoured only in commands signed by the fleet key" in message
                assert f"{tmp_path / 'agent-open.yaml'}: commands.require_signed is false" in message
                assert "--sign-commands" in refused[-1]["details"]["hint"]
            assert service.deployer.served is not None and service.deployer.ledger.highest() == 2000
            assert json.loads(service.deployer.served.path.joinpath("manifest.json").read_text())["bundle_version"] == 2000
        finally:
            service.stop()
        service = _agent(tmp_path, keys, broker, require_signed=True)
        try:
            allowed = fleet.answer(fleet.deploy(older, keys[0], allow_downgrade=True), ("deploy_result", "command_rejected"))
            kinds = [event["kind"] for event in allowed]
            assert kinds[-1] == "deploy_result" and allowed[-1]["details"]["outcome"] == "succeeded", allowed
            (notice,) = [event for event in allowed if event["kind"] == "downgrade_allowed"]
            assert notice["level"] == "warning" and notice["details"]["highest_accepted"] == 2000
            assert notice["details"]["bundle_version"] == 1000
            assert json.loads(service.deployer.served.path.joinpath("manifest.json").read_text())["bundle_version"] == 1000
            assert service.deployer.ledger.highest() == 2000  # the ledger keeps the highest
        finally:
            service.stop()
    finally:
        fleet.close()


def test_a_ledger_write_on_a_full_disk_keeps_the_old_ledger_and_the_rename_is_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from edgekit_runtime.agent import deploy_checks
    from edgekit_runtime.agent.deploy_checks import VersionLedger

    ledger = VersionLedger(tmp_path / LEDGER_NAME)
    synced: list[Path] = []
    monkeypatch.setattr(deploy_checks, "fsync_dir", synced.append)
    ledger.record("tiny", 1000, manifest_sha256="a" * 64)
    assert synced == [tmp_path] and ledger.highest() == 1000  # the folder is synced after the rename

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(deploy_checks.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        ledger.record("tiny", 2000, manifest_sha256="b" * 64)
    assert ledger.highest() == 1000 and sorted(p.name for p in tmp_path.iterdir()) == [LEDGER_NAME]  # no partial left
