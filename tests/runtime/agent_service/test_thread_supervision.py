"""Agent threads that die of an unexpected exception are restarted with backoff and reported (health,
a thread_restarted event, a problem in the next telemetry window), with a real bundle and service."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import RESTART_INITIAL_S, AgentService
from edgekit_runtime.schemas import validate_message


@pytest.fixture
def service(request: pytest.FixtureRequest, agent_config: Callable[..., Path], signed_bundle: Callable[..., Path],
            tmp_path: Path) -> Iterator[AgentService]:  # fmt: skip
    interval_s = getattr(request, "param", 60)
    path = agent_config(telemetry={"interval_s": interval_s, "spool": {"path": str(tmp_path / "spool.db")}})
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(path)]) == 0
    agent = AgentService(load_config(path)).start()
    yield agent
    agent.stop()


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("service", [0.1], indirect=True)
def test_a_crashing_telemetry_thread_is_restarted_with_backoff_and_reported(service: AgentService) -> None:
    real_read = service.state_reader.read
    calls: list[float] = []

    def flaky_read() -> Any:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise RuntimeError(f"sensor driver bug {len(calls)}")
        return real_read()

    service.state_reader.read = flaky_read  # type: ignore[method-assign]
    wait_until(lambda: len(calls) >= 5, "the telemetry thread to run again after two crashes")
    # The second restart waited about twice as long as the first (exponential backoff, 20 % jitter).
    assert calls[1] - calls[0] >= RESTART_INITIAL_S * 0.8 and calls[2] - calls[1] >= 2 * RESTART_INITIAL_S * 0.8
    record = service.health()["threads"]["edgekit-telemetry"]
    assert record == {"state": "running", "restarts": 2, "last_error": "RuntimeError: sensor driver bug 2"}
    events = [e for e in service.recent_events if e["kind"] == "thread_restarted"]
    assert [e["details"]["restarts"] for e in events] == [1, 2] and all(e["level"] == "error" for e in events)
    assert "agent thread edgekit-telemetry crashed (RuntimeError: sensor driver bug 1)" in events[0]["message"]
    for event in events:
        validate_message(event, "event.v1")
    # Serving was never affected, and the windows still close.
    assert service.server.infer({"image": np.zeros((1, 1, 8, 8), np.float32)}).outputs["logits"].shape == (1, 10)


def test_a_crash_is_a_problem_in_the_next_window_and_the_command_thread_comes_back(service: AgentService) -> None:
    real_dispatch = service.dispatch_command
    seen: list[str] = []

    def dispatch_once_broken(command: Any) -> None:
        seen.append(command["id"])
        if len(seen) == 1:
            raise KeyError("handler bug")
        real_dispatch(command)

    service.dispatch_command = dispatch_once_broken  # type: ignore[method-assign]
    service.handle_command({"id": "c1", "command": "ping"})
    wait_until(lambda: service.health()["threads"]["edgekit-commands"]["restarts"] == 1, "the command thread's restart")
    service.handle_command({"id": "c2", "command": "ping"})
    wait_until(lambda: any(e["kind"] == "pong" and e["command_id"] == "c2" for e in service.recent_events), "a pong for c2")
    assert service.health()["threads"]["edgekit-commands"]["state"] == "running"
    window = service.build_telemetry_window()
    problems = [p for p in window["errors"] if p["code"] == "agent.thread_restarted"]
    assert problems and "agent thread edgekit-commands crashed (KeyError: 'handler bug')" in problems[0]["message"]


def test_threads_stop_with_the_agent(agent_config: Callable[..., Path], signed_bundle: Callable[..., Path]) -> None:
    path = agent_config()
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(path)]) == 0
    agent = AgentService(load_config(path)).start()
    agent.stop()
    assert {record["state"] for record in agent.health()["threads"].values()} <= {"stopped", "finished"}
