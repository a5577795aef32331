"""The health watch survives the agent (issue 28, item 5): real ``edgekit-agent run`` processes, a private
Mosquitto, signed bundles run by ONNX Runtime, deploy commands over MQTT.

* SIGTERM during the watch: the deploy answers ``interrupted`` (never ``succeeded``); the next start
  watches the bundle again and only then answers ``succeeded``.
* ``kill -9`` during the watch, twice: no answer after the first (the process is gone), the watch starts
  again at the next start; after the second the agent rolls back before serving, and the
  ``deploy_result`` says the bundle crashed the agent twice within its watch.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.bundle.signing import generate_keypair, sign_bundle
from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.probation import PROBATION_NAME
from tests.runtime.agent.mosquitto import MosquittoBroker
from tests.runtime.agent_service.bundles import make_bundle

AGENT = Path(sys.executable).parent / "edgekit-agent"
FLEET, DEVICE = "lab", "dev-1"
PREFIX = f"edgekit/v1/{FLEET}/{DEVICE}"


class Fleet:
    """The host side: every event (once, by event_id) and status message, and deploy commands."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self.broker = broker
        self.messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-{uuid.uuid4().hex[:8]}")
        self.client.on_message = lambda c, u, m: self.messages.put((m.topic.rsplit("/", 1)[-1], json.loads(m.payload)))
        self.client.connect(broker.host, broker.port)
        self.client.subscribe([(f"{PREFIX}/events", 1), (f"{PREFIX}/status", 1)])
        self.client.loop_start()

    def wait(self, predicate: Callable[[str, dict[str, Any]], bool], what: str, timeout_s: float = 40.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                kind, message = self.messages.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {what} within {timeout_s} s; events so far: "
                                     f"{[(e['kind'], e['message']) for e in self.events]}") from None  # fmt: skip
            if kind == "events":
                if message["event_id"] in self._seen:
                    continue  # a redelivery after a restart
                self._seen.add(message["event_id"])
                self.events.append(message)
            if predicate(kind, message):
                return message

    def online(self) -> None:
        self.wait(lambda kind, m: kind == "status" and m["state"] == "online", "status online")

    def event(self, command_id: str, kind: str, what: str, **details: Any) -> dict[str, Any]:
        return self.wait(lambda k, m: k == "events" and m["command_id"] == command_id and m["kind"] == kind
                         and all(m["details"].get(key) == value for key, value in details.items()), what)  # fmt: skip

    def deploy(self, bundle: Path) -> str:
        sha256 = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
        command = build_command("deploy", {"bundle_id": bundle.name, "url": bundle.as_uri(), "sha256": sha256})
        with CommandPublisher(self.broker.url) as publisher:
            publisher.send(FLEET, DEVICE, command)
        return str(command["id"])

    def results(self, command_id: str) -> list[str]:
        return [e["details"]["outcome"] for e in self.events if e["command_id"] == command_id and e["kind"] == "deploy_result"]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Agent:
    """``edgekit-agent run`` as a child process, its log in a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, fleet: Fleet) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([str(AGENT), "run", "--config", str(self.config)], stdout=log, stderr=log)
        fleet.online()

    def stop(self, signum: int) -> int:
        assert self.process is not None
        os.kill(self.process.pid, signum)
        return self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def device(tmp_path: Path, mosquitto_factory: Callable[..., MosquittoBroker]) -> Iterator[Callable[..., tuple[Fleet, Agent, dict[str, Path]]]]:
    """``device(window_s, models=())``: a fleet listener, an agent (not started) serving tiny-a (in each of
    ``models``, a model repository, when given), and the bundles (tiny-a, tiny-b)."""
    made: list[tuple[Fleet, Agent]] = []

    def make(window_s: float, models: tuple[str, ...] = ()) -> tuple[Fleet, Agent, dict[str, Path]]:
        private, public = tmp_path / "fleet.key.pem", tmp_path / "fleet.pub.pem"
        generate_keypair(private, public)
        bundles = {}
        for name, version in (("tiny-a", 1000), ("tiny-b", 2000)):
            bundles[name] = make_bundle(tmp_path / "src" / name, name=name, bundle_version=version)
            sign_bundle(bundles[name], private)
        broker = mosquitto_factory()
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "device_id": DEVICE, "fleet": FLEET, "broker": {"url": broker.url, "keepalive_s": 5},
            "bundles": {"dir": str(tmp_path / "bundles"), "public_key": str(public), "allowed_sources": [str(tmp_path / "src")]},
            "api": {"address": "127.0.0.1:0"}, "power": {"sensor": "none"},
            "health": {"window_s": window_s, "max_error_rate": 0.5, "min_requests": 1},
            "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "state" / "spool.db")}},
            **({"models": {"names": list(models), "default": models[0]}} if models else {}),
        }), encoding="utf-8")  # fmt: skip
        for model in models or (None,):
            assert agent_main(["install", str(bundles["tiny-a"]), "--config", str(config),
                               *(["--model", model] if model else [])]) == 0  # fmt: skip
        fleet, agent = Fleet(broker), Agent(config, tmp_path / "agent.log")
        made.append((fleet, agent))
        return fleet, agent, bundles

    yield make
    for fleet, agent in made:
        agent.close()
        fleet.close()


def _current(tmp_path: Path) -> str:
    return json.loads((tmp_path / "bundles" / "current" / "manifest.json").read_text())["name"]


def test_sigterm_during_the_watch_answers_interrupted_and_the_next_start_watches_again(
    device: Callable[..., tuple[Fleet, Agent, dict[str, Path]]], tmp_path: Path
) -> None:
    fleet, agent, bundles = device(4.0)
    agent.start(fleet)
    command_id = fleet.deploy(bundles["tiny-b"])
    fleet.event(command_id, "deploy_progress", "the watch", step="watching")
    assert agent.stop(signal.SIGTERM) == 0
    interrupted = fleet.event(command_id, "deploy_result", "the interrupted deploy's answer")
    assert interrupted["details"]["outcome"] == "interrupted" and interrupted["level"] == "warning"
    assert "interrupted by shutdown" in interrupted["message"] and interrupted["details"]["watched_s"] < 4.0
    probation = json.loads((tmp_path / "bundles" / PROBATION_NAME).read_text())
    assert probation["state"] == "stopped" and probation["crashes"] == 0 and _current(tmp_path) == "tiny-b"

    agent.start(fleet)  # the watch starts again, a graceful stop is no crash
    resumed = fleet.event(command_id, "deploy_progress", "the resumed watch", step="watching", resumed=True)
    assert resumed["details"]["crashes"] == 0
    done = fleet.event(command_id, "deploy_result", "the resumed deploy's answer")
    assert done["details"]["outcome"] == "succeeded" and done["details"]["resumed"] is True
    assert fleet.results(command_id) == ["interrupted", "succeeded"]
    assert not (tmp_path / "bundles" / PROBATION_NAME).exists() and _current(tmp_path) == "tiny-b"
    assert agent.stop(signal.SIGTERM) == 0


def test_a_bundle_that_crashes_the_agent_twice_within_its_watch_is_rolled_back(
    device: Callable[..., tuple[Fleet, Agent, dict[str, Path]]], tmp_path: Path
) -> None:
    fleet, agent, bundles = device(60.0)
    agent.start(fleet)
    command_id = fleet.deploy(bundles["tiny-b"])
    fleet.event(command_id, "deploy_progress", "the watch", step="watching")
    assert agent.stop(signal.SIGKILL) == -signal.SIGKILL  # crash 1, during the watch
    assert json.loads((tmp_path / "bundles" / PROBATION_NAME).read_text())["state"] == "watching"

    agent.start(fleet)
    again = fleet.event(command_id, "deploy_progress", "the resumed watch", step="watching", resumed=True)
    assert again["details"]["crashes"] == 1 and _current(tmp_path) == "tiny-b"
    assert agent.stop(signal.SIGKILL) == -signal.SIGKILL  # crash 2, within the same watch
    assert fleet.results(command_id) == []  # a killed process answers nothing

    agent.start(fleet)  # rolled back before anything is loaded
    result = fleet.event(command_id, "deploy_result", "the rollback")
    assert result["details"]["outcome"] == "rolled_back" and result["details"]["crashes"] == 2
    assert result["details"]["failed_bundle"] == "tiny-b" and result["details"]["bundle"] == "tiny-a"
    assert "tiny-b crashed the agent 2 times within its 60 s health watch" in result["message"]
    assert _current(tmp_path) == "tiny-a" and not (tmp_path / "bundles" / PROBATION_NAME).exists()
    assert not any(e["kind"] == "deploy_progress" and e["details"].get("resumed") and e["details"].get("crashes") == 2
                   for e in fleet.events)  # fmt: skip
    assert agent.stop(signal.SIGTERM) == 0


def test_sigterm_during_a_pipeline_watch_answers_interrupted_and_each_model_is_watched_again(
    device: Callable[..., tuple[Fleet, Agent, dict[str, Path]]], tmp_path: Path
) -> None:
    fleet, agent, bundles = device(4.0, models=("detector", "keywords"))
    agent.start(fleet)
    sha256 = hashlib.sha256((bundles["tiny-b"] / "manifest.json").read_bytes()).hexdigest()
    deploys = [{"model": model, "bundle_id": "tiny-b", "url": bundles["tiny-b"].as_uri(), "sha256": sha256}
               for model in ("detector", "keywords")]  # fmt: skip
    command = build_command("deploy_pipeline", {"deploys": deploys})
    with CommandPublisher(fleet.broker.url) as publisher:
        publisher.send(FLEET, DEVICE, command)
    command_id = str(command["id"])
    fleet.event(command_id, "deploy_progress", "the pipeline's watch", step="watching", pipeline=True)
    assert agent.stop(signal.SIGTERM) == 0
    interrupted = fleet.event(command_id, "deploy_result", "the interrupted pipeline's answer")
    assert interrupted["details"]["outcome"] == "interrupted" and interrupted["details"]["pipeline"] is True
    for model in ("detector", "keywords"):
        probation = json.loads((tmp_path / "bundles" / "models" / model / PROBATION_NAME).read_text())
        assert probation["state"] == "stopped" and probation["bundle"] == "tiny-b"

    agent.start(fleet)  # each model's watch starts again and ends on its own, in either order
    fleet.event(command_id, "deploy_result", "the first resumed watch", resumed=True)
    if len(fleet.results(command_id)) < 3:
        fleet.event(command_id, "deploy_result", "the second resumed watch", resumed=True)
    done = {e["details"]["model"]: e for e in fleet.events if e["command_id"] == command_id and e["details"].get("resumed")
            and e["kind"] == "deploy_result"}  # fmt: skip
    assert set(done) == {"detector", "keywords"} and fleet.results(command_id) == ["interrupted", "succeeded", "succeeded"]
    for model in ("detector", "keywords"):
        assert not (tmp_path / "bundles" / "models" / model / PROBATION_NAME).exists()
    assert agent.stop(signal.SIGTERM) == 0
