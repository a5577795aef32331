"""MqttLink against a real Mosquitto: delivery, status, commands, reconnect with backoff."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.broker import BrokerConnectionError
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.agent.topics import TelemetryError
from edgekit_runtime.schemas import SchemaValidationError, load_schema
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker, ReceivedMessage, free_port
from tests.runtime.agent.sample_messages import sample_telemetry

DEVICE, FLEET = "dev-1", "lab"
CMD_TOPIC = f"edgekit/v1/{FLEET}/{DEVICE}/cmd"


def _link(broker_url: str, spool: Spool, **kwargs: Any) -> MqttLink:
    kwargs.setdefault("backoff", Backoff(initial_s=0.1, max_s=0.5))
    return MqttLink(broker_url, DEVICE, FLEET, DEVICE, spool=spool, keepalive_s=5, **kwargs)


def _seqs(messages: list[ReceivedMessage]) -> list[int]:
    return [json.loads(m.payload)["seq"] for m in messages if m.topic.endswith("/telemetry")]


def _events(recorder: MessageRecorder) -> list[dict[str, Any]]:
    return [m.json() for m in recorder.on("/events")]  # type: ignore[misc]


def test_telemetry_arrives_in_order_and_validates(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    validator = jsonschema.Draft202012Validator(load_schema("telemetry.v1"))
    with MessageRecorder(mosquitto) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool) as link:
            link.wait_connected(10)
            for _ in range(5):
                link.publish_telemetry(sample_telemetry(spool.next_seq(), spool=spool))
            assert recorder.wait_for(lambda ms: len(_seqs(ms)) == 5)
            assert link.flush(5)
            counters = link.counters
        telemetry = recorder.on("/telemetry")
        assert _seqs(telemetry) == [1, 2, 3, 4, 5]
        for message in telemetry:
            validator.validate(message.json())
        assert counters.published == 5 and counters.acked == 5 and counters.backlog == 0
        assert counters.connects == 1 and counters.reconnects == 0 and counters.rejected == 0
        assert spool.backlog() == 0
        assert recorder.wait_for(lambda ms: len([m for m in ms if m.topic.endswith("/status")]) == 2)
        online, offline = (m.json() for m in recorder.on("/status"))
        assert online["state"] == "online" and online["reason"] is None  # type: ignore[index]
        assert offline["state"] == "offline" and offline["reason"] == "agent stopped"  # type: ignore[index]
    with MessageRecorder(mosquitto, [f"edgekit/v1/{FLEET}/{DEVICE}/status"]) as late:  # retained for newcomers
        assert late.wait_for(lambda ms: len(ms) == 1)
        assert late.messages[0].retain and late.messages[0].json()["state"] == "offline"  # type: ignore[index]


def test_messages_spooled_before_start_are_sent_on_connect(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with MessageRecorder(mosquitto) as recorder, Spool(tmp_path / "spool.db") as spool:
        link = _link(mosquitto.url, spool, max_inflight=2)
        for _ in range(20):
            link.publish_telemetry(sample_telemetry(spool.next_seq()))
        assert spool.backlog() == 20
        with link:
            assert recorder.wait_for(lambda ms: len(_seqs(ms)) == 20)
            assert link.flush(5)
        assert _seqs(recorder.messages) == list(range(1, 21))


def test_bad_messages_are_refused_before_the_spool(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        link = _link(mosquitto.url, spool)
        with pytest.raises(TelemetryError, match=r"message for 'lab'/'dev-2' given to the link of 'lab'/'dev-1'"):
            link.publish_telemetry(sample_telemetry(1, device="dev-2"))
        broken = sample_telemetry(2)
        del broken["power"]
        with pytest.raises(SchemaValidationError, match=r"required property 'power' is missing"):
            link.publish_telemetry(broken)
        with pytest.raises(SchemaValidationError, match=r"event 'x' does not match schema event\.v1"):
            link.publish_event({"kind": "x"})
        assert spool.backlog() == 0


def _command(**fields: Any) -> bytes:
    return json.dumps({"schema": "edgekit.command/1", "issued_at": utc_timestamp(), **fields}).encode()


def test_commands_malformed_ones_become_error_events(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    handled = threading.Event()

    def on_command(command: dict[str, Any]) -> None:
        if command["command"] == "rollback":
            raise RuntimeError("no previous bundle to roll back to")
        received.append(command)
        handled.set()

    with MessageRecorder(mosquitto) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool, on_command=on_command) as link:
            link.wait_connected(10)
            send = recorder.client.publish
            send(CMD_TOPIC, b"{not json", qos=1)
            send(CMD_TOPIC, b"\xff\xfe", qos=1)
            send(CMD_TOPIC, _command(id="c-1", command="set_interval", args={"interval_s": 0}), qos=1)
            send(CMD_TOPIC, _command(id="c-2", command="reboot"), qos=1)
            send(CMD_TOPIC, _command(id="c-3", command="ping"), qos=1)
            send(CMD_TOPIC, _command(id="c-4", command="set_interval", args={"interval_s": 30}), qos=1)
            send(CMD_TOPIC, _command(id="c-4", command="set_interval", args={"interval_s": 30}), qos=1)  # again
            send(CMD_TOPIC, _command(id="c-5", command="rollback"), qos=1)
            assert recorder.wait_for(lambda ms: len([m for m in ms if m.topic.endswith("/events")]) == 7)
            assert handled.wait(5)
            link.publish_telemetry(sample_telemetry(spool.next_seq()))  # still alive and publishing
            assert recorder.wait_for(lambda ms: _seqs(ms) == [1])
            counters = link.counters
        events = _events(recorder)
        validator = jsonschema.Draft202012Validator(load_schema("event.v1"))
        for event in events:
            validator.validate(event)
        by_kind = [(e["kind"], e["command_id"]) for e in events]
        assert by_kind == [("command_rejected", None), ("command_rejected", None), ("command_rejected", "c-1"),
                           ("command_rejected", "c-2"), ("pong", "c-3"), ("command_rejected", "c-4"),
                           ("command_failed", "c-5")]  # fmt: skip
        assert events[0]["message"].startswith("command payload is not valid JSON: Expecting property name")
        assert events[0]["details"]["payload_excerpt"] == "{not json"
        assert events[1]["message"] == "command payload is not UTF-8: byte 0 (invalid start byte)"
        assert events[2]["message"] == ("command does not match schema command.v1: "
                                        "args.interval_s: 0 is less than the minimum of 1")  # fmt: skip
        assert "command: 'reboot' is not one of ['deploy', 'rollback', 'set_interval', 'ping', 'deploy_pipeline']" in events[3]["message"]
        assert events[5]["message"].startswith("command 'set_interval' refused: command id 'c-4' was already received at ")
        assert events[5]["level"] == "warning" and events[5]["details"]["reason"] == "replayed"
        assert events[6]["message"] == "command 'rollback' failed: RuntimeError: no previous bundle to roll back to"
        assert all(e["level"] == "error" for e in events if e["kind"] != "pong" and e["command_id"] != "c-4")
        assert [c["id"] for c in received] == ["c-4"]  # the duplicate delivery was dropped
        assert received[0]["args"] == {"interval_s": 30}
        assert counters.commands_received == 8 and counters.commands_rejected == 5


def test_without_a_handler_commands_fail_with_an_event(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with MessageRecorder(mosquitto) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool) as link:
            link.wait_connected(10)
            recorder.client.publish(CMD_TOPIC, _command(id="d-1", command="deploy", args={
                "bundle_id": "b", "url": "https://fleet.example/b.tar", "sha256": "0" * 64}), qos=1)  # fmt: skip
            assert recorder.wait_for(lambda ms: any(m.topic.endswith("/events") for m in ms))
        (event,) = _events(recorder)
        assert event["kind"] == "command_failed" and event["command_id"] == "d-1"
        assert event["message"] == "this agent has no handler for command 'deploy'"


def test_no_broker_gives_a_clear_error_and_backs_off(tmp_path: Path) -> None:
    port = free_port()
    with Spool(tmp_path / "spool.db") as spool:
        with _link(f"mqtt://127.0.0.1:{port}", spool, backoff=Backoff(initial_s=0.05, max_s=0.2)) as link:
            with pytest.raises(BrokerConnectionError) as info:
                link.wait_connected(1.0)
            assert link.backoff.failures >= 3
            assert not link.connected
        text = str(info.value)
        assert f"not connected to mqtt://127.0.0.1:{port} after 1 s: broker 127.0.0.1:{port} refused the TCP" in text
        assert "check that the broker is running" in text


def test_backlog_drains_in_order_after_reconnect_and_backoff_resets(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory(persistence=True)
    recorder = MessageRecorder(broker, client_id="recorder", session_expiry_s=300)
    try:
        with Spool(tmp_path / "spool.db") as spool:
            with _link(broker.url, spool, max_inflight=4, backoff=Backoff(initial_s=0.1, max_s=0.3),
                       stable_after_s=0.5) as link:  # fmt: skip
                link.wait_connected(10)
                link.publish_telemetry(sample_telemetry(spool.next_seq()))
                assert recorder.wait_for(lambda ms: _seqs(ms) == [1])
                broker.stop()
                for _ in range(30):  # produced while the broker is down: they wait in the spool
                    link.publish_telemetry(sample_telemetry(spool.next_seq(), spool=spool))
                deadline = time.monotonic() + 10
                while link.backoff.failures < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert link.backoff.failures >= 3 and not link.connected
                assert "refused the TCP connection" in (link.last_error or "")
                assert spool.backlog() == 30
                broker.start()
                link.wait_connected(10)
                deadline = time.monotonic() + 10
                while link.backoff.failures and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert link.backoff.failures == 0  # reset once the connection has lasted stable_after_s
                assert link.last_error is None
                assert recorder.wait_for(lambda ms: len(set(_seqs(ms))) == 31, timeout_s=20)
                assert link.flush(5)
                counters = link.counters
        seqs = _seqs(recorder.messages)
        first_arrivals = list(dict.fromkeys(seqs))
        assert first_arrivals == list(range(1, 32))
        assert counters.connects == 2 and counters.reconnects == 1
        assert counters.acked == 31 and counters.dropped == 0
    finally:
        recorder.close()
