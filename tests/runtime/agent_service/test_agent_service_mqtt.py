"""The whole agent against the real Mosquitto on 127.0.0.1:1883: telemetry arrives, commands are answered,
a deploy over MQTT switches the served model, SIGTERM-style stop publishes offline."""

from __future__ import annotations

import hashlib
import json
import queue
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService, synthetic_feeds
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.agent.topics import TOPIC_KINDS
from edgekit_runtime.bundle import open_bundle
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent_service.bundles import pack_tar
from tests.runtime.tiny_bundle import reference_logits

BROKER = ("127.0.0.1", 1883)


def broker_up() -> bool:
    try:
        with socket.create_connection(BROKER, timeout=1):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")


class Listener:
    """Subscribes to one device's topics and queues what arrives, by topic kind."""

    def __init__(self, fleet: str, device: str) -> None:
        self.prefix = f"edgekit/v1/{fleet}/{device}"
        # every topic kind, "ack" included: a collector on the shared broker acks any device's windows, and a message of
        # a kind not listed here raised in paho's thread and ended the listener
        self.messages: dict[str, queue.Queue[dict[str, Any]]] = {k: queue.Queue() for k in TOPIC_KINDS}
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{uuid.uuid4().hex[:8]}")
        self.client.on_message = lambda client, userdata, message: self.messages.setdefault(
            message.topic.rsplit("/", 1)[1], queue.Queue()).put(json.loads(message.payload))
        self.client.connect(*BROKER)
        self.client.subscribe(f"{self.prefix}/#", qos=1)
        self.client.loop_start()

    def next(self, kind: str, predicate: Callable[[dict[str, Any]], bool] = lambda m: True, timeout_s: float = 10.0) -> dict[str, Any]:
        seen = []
        while True:
            try:
                message = self.messages[kind].get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no matching {kind} message within {timeout_s} s; saw {seen}") from None
            if predicate(message):
                return message
            seen.append(message.get("kind") or message.get("seq") or message.get("state"))

    def command(self, command: str, args: dict[str, Any] | None = None) -> str:
        command_id = uuid.uuid4().hex
        payload = {"schema": "edgekit.command/1", "id": command_id, "command": command, "issued_at": utc_timestamp(),
                   **({"args": args} if args is not None else {})}
        self.client.publish(f"{self.prefix}/cmd", json.dumps(payload), qos=1).wait_for_publish(5)
        return command_id

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def ids() -> tuple[str, str]:
    return f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def listener(ids: tuple[str, str]) -> Iterator[Listener]:
    listener = Listener(*ids)
    yield listener
    listener.close()


def test_agent_end_to_end_over_mqtt(
    ids: tuple[str, str], listener: Listener, agent_config: Callable[..., Path], signed_bundle: Callable[..., Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    fleet, device = ids
    config = load_config(agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        telemetry={"interval_s": 0.5, "spool": {"path": str(tmp_path / "spool" / "spool.db")}},
        health={"window_s": 0.2, "max_error_rate": 0.5}, probe={"interval_s": 0.2, "dims": {"batch": 2}},
    ))  # fmt: skip
    first = signed_bundle("tiny-a")
    from edgekit_runtime.agent.cli import main as agent_main

    assert agent_main(["install", str(first), "--config", str(config.source)]) == 0
    service = AgentService(config).start()
    try:
        online = listener.next("status", lambda m: m["state"] == "online")["bundle"]  # installed: its content id
        assert online["id"] == f"tiny-a-{online['sha256'][:12]}"
        serving = listener.next("events", lambda m: m["kind"] == "serving")
        assert serving["details"]["bundle"] == "tiny-a"
        client = AgentClient(service.api_address)
        x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
        for _ in range(4):
            np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)

        telemetry = listener.next("telemetry", lambda m: m["latency"]["count"] >= 4)
        validate_message(telemetry, "telemetry.v1")
        assert telemetry["device"] == device and telemetry["fleet"] == fleet
        assert telemetry["bundle"] == online
        assert telemetry["bundle"]["sha256"] == hashlib.sha256((first / "manifest.json").read_bytes()).hexdigest()
        assert telemetry["latency"]["p99_ms"] >= telemetry["latency"]["p50_ms"] > 0
        assert telemetry["power"]["source"].startswith("none") and telemetry["power"]["mean_mw"] is None
        assert telemetry["memory"]["rss_mb"] > 0
        probe_window = listener.next("telemetry", lambda m: m["seq"] > telemetry["seq"] and m["latency"]["count"] >= 1)
        assert probe_window["latency"]["errors"] == 0  # the probe keeps an idle device reporting latency

        ping_id = listener.command("ping")
        assert listener.next("events", lambda m: m["kind"] == "pong")["command_id"] == ping_id
        interval_id = listener.command("set_interval", {"interval_s": 1})
        changed = listener.next("events", lambda m: m["kind"] == "interval_changed")
        assert changed["command_id"] == interval_id and service.telemetry_interval_s == 1.0

        second = signed_bundle("tiny-b")
        tar = pack_tar(second, tmp_path / "tiny-b.tar")
        deploy_id = listener.command("deploy", {"bundle_id": "b-7", "url": tar.as_uri(), "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()})
        result = listener.next("events", lambda m: m["kind"] == "deploy_result", timeout_s=20)
        assert result["command_id"] == deploy_id and result["details"]["outcome"] == "succeeded", result
        assert client.health()["bundle_id"] == "b-7" and client.signature()["model"] == "tiny-b"
        assert listener.next("telemetry", lambda m: (m["bundle"] or {}).get("id") == "b-7")["schema"] == "edgekit.telemetry/1"

        rollback_id = listener.command("rollback")
        rolled = listener.next("events", lambda m: m["kind"] == "rollback_result", timeout_s=20)
        assert rolled["command_id"] == rollback_id and rolled["details"]["outcome"] == "succeeded"
        assert client.health()["model"] == "tiny-a"

        bad_id = listener.command("deploy", {"bundle_id": "x", "url": "file:///nonexistent.tar", "sha256": "0" * 64})
        failed = listener.next("events", lambda m: m["kind"] == "deploy_result" and m["command_id"] == bad_id, timeout_s=20)
        assert failed["level"] == "error" and "deploy source refused" in failed["message"]  # not in allowed_sources
    finally:
        service.stop()
    assert listener.next("status", lambda m: m["state"] == "offline")["reason"] == "agent stopped"


def test_synthetic_feeds_follow_the_signature(signed_bundle: Callable[..., Path]) -> None:
    signature = open_bundle(signed_bundle("tiny-p")).io
    assert synthetic_feeds(signature, {"batch": 3})["image"].shape == (3, 1, 8, 8)
    assert synthetic_feeds(signature, {})["image"].shape == (4, 1, 8, 8)  # the dim's opt
    assert synthetic_feeds(signature, {})["image"].dtype == np.float32
