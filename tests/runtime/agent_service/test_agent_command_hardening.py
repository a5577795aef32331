"""The whole agent against a private Mosquitto (issue 18): a deploy that fails with a huge message still
reaches the collector, /v1/health follows the broker, replays are refused after an agent restart, and
the ``commands`` section of the configuration."""

from __future__ import annotations

import hashlib
import http.client
import json
import queue
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.fleet.ingest import DeviceEvent, parse_message
from edgekit_runtime.agent.bounded import MAX_EVENT_BYTES
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.signing import encode_signature, load_private_key
from tests.runtime.agent.mosquitto import MosquittoBroker, mosquitto_factory  # noqa: F401 (fixture)
from tests.runtime.agent_service.bundles import pack_tar

FLEET, DEVICE = "lab", "dev-1"
PREFIX = f"edgekit/v1/{FLEET}/{DEVICE}"


class Fleet:
    """The host side: sends commands, keeps the raw event payloads (as the collector receives them)."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self.events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-{uuid.uuid4().hex[:8]}")
        self.client.on_message = lambda client, userdata, message: self.events.put((message.topic, bytes(message.payload)))
        self.client.connect(broker.host, broker.port)
        self.client.subscribe(f"{PREFIX}/events", qos=1)
        self.client.loop_start()

    def send(self, payload: bytes) -> None:
        self.client.publish(f"{PREFIX}/cmd", payload, qos=1).wait_for_publish(5)

    def next_event(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0) -> tuple[str, bytes]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                topic, payload = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no matching event within {timeout_s} s") from None
            if predicate(json.loads(payload)):
                return topic, payload

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _command(command_id: str, command: str, args: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"schema": "edgekit.command/1", "id": command_id, "command": command, "issued_at": utc_timestamp(),
                       **({"args": args} if args is not None else {})}).encode()  # fmt: skip


def _config(agent_config: Callable[..., Path], tmp_path: Path, broker: MosquittoBroker, **overrides: Any) -> Any:
    return load_config(agent_config(
        broker={"url": broker.url, "keepalive_s": 5},
        telemetry={"interval_s": 60, "spool": {"path": str(tmp_path / "state" / "spool.db")}}, **overrides,
    ))  # fmt: skip


def _health(service: AgentService) -> dict[str, Any]:
    host, port = service.api_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/v1/health")
        return dict(json.loads(connection.getresponse().read()))
    finally:
        connection.close()


def test_a_failed_deploy_with_a_huge_error_still_reaches_the_collector(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], fleet_keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    broker = mosquitto_factory()
    bundle = signed_bundle("tiny-a", sign=False)
    manifest_path = bundle / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for index in range(3000):  # listed and signed, but missing: verification names every one of them
        manifest["files"][f"{'n' * 200}-{index:04d}.npz"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    signature = load_private_key(fleet_keys[0]).sign(manifest_path.read_bytes())
    (bundle / "manifest.sig").write_text(encode_signature(signature) + "\n")
    inbox = tmp_path / "bundles" / "inbox"
    inbox.mkdir(parents=True)
    tar = pack_tar(bundle, inbox / "tiny-a.tar")
    fleet = Fleet(broker)
    service = AgentService(_config(agent_config, tmp_path, broker)).start()
    try:
        service.link.wait_connected(10)
        fleet.send(_command("deploy-1", "deploy", {"bundle_id": "tiny-a", "url": tar.as_uri(),
                                                  "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()}))  # fmt: skip
        topic, payload = fleet.next_event(lambda e: e["kind"] == "deploy_result", timeout_s=60)
    finally:
        service.stop()
        fleet.close()
    assert len(payload) <= MAX_EVENT_BYTES
    record = parse_message(topic, payload)  # the collector's own parser and limits
    assert isinstance(record, DeviceEvent), record
    event = json.loads(payload)
    assert event["command_id"] == "deploy-1" and event["level"] == "error"
    assert event["details"]["outcome"] == "failed"
    assert event["details"]["truncated_from_bytes"] > 256 * 1024  # what the collector used to refuse as oversized
    assert f"missing: {'n' * 200}-0000.npz" in event["details"]["error"]
    assert event["details"]["error"].endswith(" characters]") and "...[truncated: " in event["details"]["error"]
    assert service.recent_events[-1]["details"]["truncated_from_bytes"] == event["details"]["truncated_from_bytes"]


def test_health_reports_the_real_broker_link(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], tmp_path: Path,
) -> None:  # fmt: skip
    broker = mosquitto_factory()
    service = AgentService(_config(agent_config, tmp_path, broker)).start()
    try:
        service.link.wait_connected(10)
        up = _health(service)
        assert up["broker_connected"] is True
        assert up["broker"]["connected"] is True and up["broker"]["last_error"] is None
        broker.stop()
        deadline = time.monotonic() + 15
        down = _health(service)
        while down["broker"]["connected"] and time.monotonic() < deadline:
            time.sleep(0.1)
            down = _health(service)
        assert down["broker_connected"] is False and down["broker"]["connected"] is False
        assert down["broker"]["since"] > up["broker"]["since"]
        assert f"127.0.0.1:{broker.port}" in down["broker"]["last_error"]
        broker.start()
        service.link.wait_connected(15)
        again = _health(service)
        assert again["broker"]["connected"] is True and again["broker"]["since"] > down["broker"]["since"]
    finally:
        service.stop()


def test_a_replayed_command_is_refused_after_an_agent_restart(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], tmp_path: Path,
) -> None:  # fmt: skip
    broker = mosquitto_factory()
    config = _config(agent_config, tmp_path, broker)
    fleet = Fleet(broker)
    captured = _command("interval-1", "set_interval", {"interval_s": 5})
    try:
        service = AgentService(config).start()
        try:
            service.link.wait_connected(10)
            fleet.send(captured)
            fleet.next_event(lambda e: e["kind"] == "interval_changed" and e["command_id"] == "interval-1")
            assert service.telemetry_interval_s == 5
        finally:
            service.stop()
        assert (tmp_path / "state" / "commands.db").is_file()  # the default: beside the spool
        restarted = AgentService(config).start()
        try:
            restarted.link.wait_connected(10)
            fleet.send(captured)  # the same bytes again, as an attacker who recorded them would
            _, payload = fleet.next_event(lambda e: e["command_id"] == "interval-1")
            assert restarted.telemetry_interval_s == 60
        finally:
            restarted.stop()
    finally:
        fleet.close()
    event = json.loads(payload)
    assert event["kind"] == "command_rejected" and event["details"]["reason"] == "replayed"
    assert "command id 'interval-1' was already received at " in event["message"]


def test_the_commands_section(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    defaults = load_config(agent_config())
    assert defaults.commands.replay_window_s == 86400 and defaults.commands.max_clock_skew_s == 300
    assert defaults.commands.require_issued_at is True and defaults.commands.max_remembered == 10_000
    assert defaults.replay_path == tmp_path / "commands.db"
    custom = load_config(agent_config(commands={"replay_window_h": 2, "max_clock_skew_s": 30, "require_issued_at": False,
                                                "replay_path": "state/replay.db"}))  # fmt: skip
    assert custom.commands.replay_window_s == 7200 and custom.commands.max_clock_skew_s == 30
    assert custom.commands.require_issued_at is False and custom.replay_path == tmp_path / "state" / "replay.db"
    with pytest.raises(AgentConfigError) as info:
        load_config(agent_config(commands={"replay_window": 2}))
    assert "commands.replay_window: is not a known key" in str(info.value)
    assert "did you mean 'commands.replay_window_h'?" in str(info.value)
    with pytest.raises(AgentConfigError, match=r"commands\.replay_window_h: expected a number > 0 and <= 720, got 0"):
        load_config(agent_config(commands={"replay_window_h": 0}))
    with pytest.raises(AgentConfigError, match=r"commands\.require_issued_at: expected true or false, got 'no'"):
        load_config(agent_config(commands={"require_issued_at": "no"}))


def test_require_signed_needs_the_fleet_public_key(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    assert load_config(agent_config(commands={"require_signed": True})).commands.require_signed is True
    with pytest.raises(AgentConfigError) as info:
        load_config(agent_config(bundles={"dir": str(tmp_path / "bundles"), "allow_unsigned": True},
                                 commands={"require_signed": True}))  # fmt: skip
    assert ("commands.require_signed: is true but bundles.public_key is not set: signatures are checked against the "
            "fleet's public key") in str(info.value)  # fmt: skip


def test_a_service_that_requires_signed_commands_refuses_unsigned_ones(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], fleet_keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    from edgekit.fleet.commands import CommandPublisher, build_command

    broker = mosquitto_factory()
    fleet = Fleet(broker)
    service = AgentService(_config(agent_config, tmp_path, broker, commands={"require_signed": True})).start()
    try:
        service.link.wait_connected(10)
        fleet.send(_command("unsigned-1", "set_interval", {"interval_s": 5}))
        _, unsigned = fleet.next_event(lambda e: e["command_id"] == "unsigned-1")
        with CommandPublisher(broker.url, signing_key=fleet_keys[0]) as publisher:
            publisher.send(FLEET, DEVICE, build_command("set_interval", {"interval_s": 7}, command_id="signed-1"))
        _, signed = fleet.next_event(lambda e: e["command_id"] == "signed-1")
        assert service.telemetry_interval_s == 7
    finally:
        service.stop()
        fleet.close()
    assert json.loads(unsigned)["details"]["reason"] == "unsigned"
    assert json.loads(signed)["kind"] == "interval_changed"


def test_hostile_commands_are_each_answered_and_the_agent_goes_on(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], tmp_path: Path,
) -> None:  # fmt: skip
    """Found by a review: these raised past the command checks, so the fleet got no answer (at most one generic
    error event per kind of error), and a retained copy was processed again at every reconnect."""
    broker = mosquitto_factory()
    fleet = Fleet(broker)
    hostile = {
        "surrogate": b'{"schema": "edgekit.command/1", "id": "\\ud800", "command": "ping", "issued_at": "%s"}',
        "digits": b'{"schema": "edgekit.command/1", "id": "d-1", "command": "ping", "issued_at": "%s", "args": {"n": ' + b"9" * 5000 + b"}}",
        "nan": b'{"schema": "edgekit.command/1", "id": "n-1", "command": "ping", "issued_at": "%s", "args": {"x": NaN}}',
        "duplicate key": b'{"schema": "edgekit.command/1", "id": "k-1", "id": "k-2", "command": "ping", "issued_at": "%s"}',
    }
    messages = {"surrogate": "unpaired UTF-16 surrogate", "digits": "Exceeds the limit (4300",
                "nan": "NaN is not a JSON number", "duplicate key": "key 'id' appears twice in one object"}  # fmt: skip
    try:
        service = AgentService(_config(agent_config, tmp_path, broker)).start()
        try:
            service.link.wait_connected(10)
            for name, payload in hostile.items():
                fleet.send(payload.replace(b"%s", utc_timestamp().encode()))
                _, event = fleet.next_event(lambda e: e["kind"] == "command_rejected" and e["details"].get("reason") == "unparsable")
                assert messages[name] in json.loads(event)["message"], name
            fleet.send(_command("after", "ping"))
            fleet.next_event(lambda e: e["kind"] == "pong" and e["command_id"] == "after")
            assert service.link.counters.callback_errors == 0
        finally:
            service.stop()
    finally:
        fleet.close()


def test_a_flood_of_refused_commands_cannot_push_out_an_admitted_id(tmp_path: Path) -> None:
    from edgekit_runtime.agent.replay import ReplayPolicy, ReplayWindow

    with ReplayWindow(tmp_path / "commands.db", ReplayPolicy(require_issued_at=False, max_entries=100)) as replay:
        assert replay.admit("signed-1", None) is None
        for index in range(150):  # refused junk, remembered by payload so it is answered once
            replay.remember_payload(f"{index:064x}")
        refusal = replay.admit("signed-1", None)  # the captured command, sent again
    assert refusal is not None and refusal.reason == "replayed"  # before: evicted, and run a second time


def test_config_numbers_must_be_finite_and_paths_hold_no_nul(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    cases = [({"telemetry": {"interval_s": float("nan"), "spool": {"path": "s.db"}}}, "telemetry.interval_s: expected a number > 0 and <= 86400, got nan"),
             ({"telemetry": {"interval_s": 1e300, "spool": {"path": "s.db"}}}, "telemetry.interval_s: expected a number > 0 and <= 86400"),
             ({"bundles": {"max_download_mb": float("inf"), "allow_unsigned": True}}, "bundles.max_download_mb: expected a number >= 0.001, got inf"),
             ({"api": {"max_request_mb": 1e15}}, "api.max_request_mb: expected a number >= 0.001 and <= 1e+12, got 1000000000000000.0"),
             ({"telemetry": {"spool": {"path": "a\x00b.db"}}}, "telemetry.spool.path: the path contains a NUL character"),
             ({"api": {"address": "unix:/run/a\x00.sock"}}, "contains a NUL character")]  # fmt: skip
    for overrides, message in cases:
        with pytest.raises(AgentConfigError, match=re.escape(message)):
            load_config(agent_config(**overrides))


def test_broker_settings_that_cannot_be_read_are_errors_not_tracebacks(tmp_path: Path) -> None:
    from edgekit_runtime.agent.broker import parse_broker_url, read_password_file
    from edgekit_runtime.agent.topics import TelemetryError

    with pytest.raises(TelemetryError, match=r"broker URL 'mqtt://\[::1' cannot be read"):  # was a ValueError traceback
        parse_broker_url("mqtt://[::1")
    password = tmp_path / "password"
    password.write_bytes(b"\xff\xfe secret")
    with pytest.raises(TelemetryError, match="is not UTF-8 text"):  # was a UnicodeDecodeError traceback
        read_password_file(password)
    with pytest.raises(TelemetryError, match="is a folder, not a file"):
        read_password_file(tmp_path)


def test_finished_deploy_threads_do_not_pile_up(
    mosquitto_factory: Callable[..., MosquittoBroker],  # noqa: F811
    agent_config: Callable[..., Path], tmp_path: Path,
) -> None:  # fmt: skip
    broker = mosquitto_factory()
    fleet = Fleet(broker)
    try:
        service = AgentService(_config(agent_config, tmp_path, broker)).start()
        try:
            service.link.wait_connected(10)
            before = len(service._threads)
            for index in range(60):
                fleet.send(_command(f"rb-{index}", "rollback"))
                fleet.next_event(lambda e, i=index: e["kind"] == "rollback_result" and e["command_id"] == f"rb-{i}")
            assert len(service._threads) <= before + 2  # before: one more finished thread kept per command (+60)
        finally:
            service.stop()
    finally:
        fleet.close()
