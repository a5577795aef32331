"""The local API's serving thread is supervised like the agent's other threads: when it dies the crash is
reported (health ``threads``, a ``thread_restarted`` event over the real Mosquitto, a problem in the next
telemetry window) and the API serves again on the same address; and a command handler that fails with an
unexpected (non-edgekit) exception is answered with ``command_failed``, the agent going on."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent import service as service_module
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent_service.test_agent_service_mqtt import Listener, broker_up

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")

X = np.zeros((1, 1, 8, 8), np.float32)


@pytest.fixture
def agent(agent_config: Callable[..., Path], signed_bundle: Callable[..., Path],
          tmp_path: Path) -> Iterator[tuple[AgentService, Listener]]:  # fmt: skip
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    path = agent_config(fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
                        telemetry={"interval_s": 0.5, "spool": {"path": str(tmp_path / "spool.db")}})  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(path)]) == 0
    listener = Listener(fleet, device)
    service = AgentService(load_config(path)).start()
    # The agent subscribes to its commands before it publishes its online status: wait for that, so that a
    # command published by a test is not sent before the subscription (under load it was, and got lost).
    listener.next("status", lambda m: m["state"] == "online")
    yield service, listener
    service.stop()
    listener.close()


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the serving thread's death
def test_a_dead_api_thread_is_reported_and_the_api_serves_again_on_the_same_address(
    agent: tuple[AgentService, Listener],
) -> None:  # fmt: skip
    service, listener = agent
    address = service.api_address
    assert AgentClient(address).infer({"image": X})["logits"].shape == (1, 10)
    assert service.health()["threads"]["edgekit-api"] == {"state": "running", "restarts": 0, "last_error": None}

    # A bug in the serving loop (here: the connection check raises) ends AgentApi's serve_forever thread.
    def broken_check(request: Any, client_address: Any) -> bool:
        raise RuntimeError("connection bookkeeping bug")

    service.api._httpd.verify_request = broken_check  # type: ignore[union-attr]
    with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5) as probe:
        probe.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        wait_until(lambda: service.health()["threads"]["edgekit-api"]["restarts"] == 1, "the API crash to be recorded")
    record = service.health()["threads"]["edgekit-api"]
    assert record["last_error"] == (f"AgentApiError: the local API on {address} stopped serving: its thread ended "
                                    "(its traceback is on the agent's stderr)")  # fmt: skip
    event = listener.next("events", lambda m: m["kind"] == "thread_restarted")
    validate_message(event, "event.v1")
    assert event["details"]["thread"] == "edgekit-api" and event["details"]["restarts"] == 1
    assert event["message"].startswith(f"agent thread edgekit-api crashed (AgentApiError: the local API on {address} stopped serving")

    # After the backoff the API listens again, on the address clients know, and serves.
    wait_until(lambda: service.health()["threads"]["edgekit-api"]["state"] == "running", "the API restart")
    assert service.api_address == address
    client = AgentClient(address)
    wait_until(lambda: _answers(client), "the API to answer again")
    assert client.infer({"image": X})["logits"].shape == (1, 10)
    assert client.health()["threads"]["edgekit-api"]["restarts"] == 1
    window = listener.next("telemetry", lambda m: any(p["code"] == "agent.thread_restarted" for p in m["errors"]))
    assert any("edgekit-api" in p["message"] for p in window["errors"])


def _answers(client: AgentClient) -> bool:
    try:
        return client.health()["status"] == "ok"
    except Exception:
        return False


def test_an_unexpected_exception_in_a_command_handler_answers_command_failed(
    agent: tuple[AgentService, Listener], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    service, listener = agent
    calls: list[str | None] = []
    real_set_interval = service_module.COMMAND_HANDLERS["set_interval"]

    def set_interval_with_a_bug(agent_service: AgentService, args: dict[str, Any], command_id: str | None) -> None:
        calls.append(command_id)
        if len(calls) == 1:
            {}["interval"]  # a KeyError, not an EdgekitError: a bug in a handler
        real_set_interval(agent_service, args, command_id)

    # (ping is answered by the MQTT link itself; set_interval goes through dispatch_command.)
    monkeypatch.setitem(service_module.COMMAND_HANDLERS, "set_interval", set_interval_with_a_bug)
    first = listener.command("set_interval", {"interval_s": 2})
    failed = listener.next("events", lambda m: m.get("command_id") == first)
    validate_message(failed, "event.v1")
    assert failed["kind"] == "command_failed" and failed["level"] == "error"
    assert failed["message"] == "command 'set_interval' failed: KeyError: 'interval'"
    assert failed["details"] == {"command": "set_interval"}
    # The command thread was not restarted (the failure was answered, not raised), and the next command runs.
    second = listener.command("set_interval", {"interval_s": 2})
    changed = listener.next("events", lambda m: m.get("command_id") == second)
    assert changed["kind"] == "interval_changed" and changed["details"]["interval_s"] == 2.0
    assert service.health()["threads"]["edgekit-commands"]["restarts"] == 0
    assert AgentClient(service.api_address).infer({"image": X})["logits"].shape == (1, 10)
