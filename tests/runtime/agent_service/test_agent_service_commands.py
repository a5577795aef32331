"""The service's command table and telemetry windows without a broker (the MQTT test covers the wire)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import COMMAND_HANDLERS, AgentService
from edgekit_runtime.schemas import validate_message


@pytest.fixture
def service(agent_config: Callable[..., Path], signed_bundle: Callable[..., Path]) -> Iterator[AgentService]:
    path = agent_config()
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(path)]) == 0
    agent = AgentService(load_config(path)).start()
    yield agent
    agent.stop()


def wait_for(service: AgentService, kind: str, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in reversed(service.recent_events):
            if event["kind"] == kind:
                return event
        time.sleep(0.02)
    raise AssertionError(f"no {kind} event; saw {[e['kind'] for e in service.recent_events]}")


def test_every_command_in_the_table_is_handled(service: AgentService, signed_bundle: Callable[..., Path]) -> None:
    # deploy_pipeline is exercised in test_model_repository.py
    assert set(COMMAND_HANDLERS) == {"deploy", "rollback", "set_interval", "ping", "deploy_pipeline"}
    service.dispatch_command({"id": "c1", "command": "ping"})
    pong = wait_for(service, "pong")
    ref = pong["details"]["bundle"]  # installed without an id: the content id, as `edgekit pack` prints it
    assert pong["command_id"] == "c1" and ref["id"] == f"tiny-a-{ref['sha256'][:12]}"
    service.dispatch_command({"id": "c2", "command": "set_interval", "args": {"interval_s": 5}})
    assert wait_for(service, "interval_changed")["details"] == {"interval_s": 5.0, "previous_interval_s": 60.0}
    assert service.telemetry_interval_s == 5.0
    source = signed_bundle("tiny-b")
    service.dispatch_command({"id": "c3", "command": "deploy", "args": {"url": str(source), "sha256": hashlib.sha256((source / "manifest.json").read_bytes()).hexdigest()}})
    assert wait_for(service, "deploy_result")["details"]["outcome"] == "succeeded"
    assert service.health()["model"] == "tiny-b"
    service.dispatch_command({"id": "c4", "command": "rollback"})
    assert wait_for(service, "rollback_result")["details"]["outcome"] == "succeeded"
    assert service.server.model_name == "tiny-a"
    for event in service.recent_events:
        validate_message(event, "event.v1")


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        ({"id": "x1", "command": "reboot"}, "unknown command 'reboot'; known commands: deploy, rollback, set_interval, ping"),
        ({"id": "x2", "command": "set_interval", "args": {"interval_s": 0}}, "interval_s must be a number in 1..86400, got 0"),
        ({"id": "x3", "command": "deploy", "args": {"url": "/x"}}, "deploy: args.sha256 is missing"),
        ({"id": "x4", "command": "ping", "args": ["no"]}, "args must be an object"),
    ],
)
def test_bad_commands_are_rejected_with_the_reason(service: AgentService, command: dict, fragment: str) -> None:
    service.dispatch_command(command)
    rejected = wait_for(service, "command_rejected")
    assert rejected["command_id"] == command["id"] and fragment in rejected["message"] and rejected["level"] == "error"


def test_telemetry_window_without_a_broker(service: AgentService) -> None:
    service.build_telemetry_window()  # start a fresh window
    x = np.zeros((2, 1, 8, 8), np.float32)
    for _ in range(3):
        service.server.infer({"image": x})
    message = service.build_telemetry_window()
    validate_message(message, "telemetry.v1")
    assert message["latency"]["count"] == 3 and message["latency"]["errors"] == 0
    assert message["bundle"]["id"] == f"tiny-a-{message['bundle']['sha256'][:12]}" and message["power"]["reason"]
    assert message["energy_per_inference_mj"] is None  # no sensor, no energy: never estimated
    assert service.health()["status"] == "ok" and service.health()["broker_connected"] is None
