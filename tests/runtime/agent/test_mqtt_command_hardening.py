"""Hostile commands against MqttLink on a real Mosquitto (issue 18): nothing wedges the link, every bad
command is answered once with a bounded event and consumed, retained poison stays consumed after a
restart, replays are refused across restarts, and the link state follows the broker."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.bounded import MAX_EVENT_BYTES
from edgekit_runtime.agent.mqtt import MAX_PACKET_BYTES, MqttLink
from edgekit_runtime.agent.replay import ReplayWindow
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.schemas import load_schema
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker
from tests.runtime.agent.sample_messages import sample_telemetry

DEVICE, FLEET = "dev-1", "lab"
CMD_TOPIC = f"edgekit/v1/{FLEET}/{DEVICE}/cmd"
EVENTS_TOPIC = f"edgekit/v1/{FLEET}/{DEVICE}/events"
EVENT_VALIDATOR = jsonschema.Draft202012Validator(load_schema("event.v1"))


def _link(url: str, spool: Spool, replay: ReplayWindow | None = None, **kwargs: Any) -> MqttLink:
    kwargs.setdefault("keepalive_s", 5)
    return MqttLink(url, DEVICE, FLEET, DEVICE, spool=spool, replay=replay, backoff=Backoff(initial_s=0.1, max_s=0.3),
                    **kwargs)  # fmt: skip


def _command(command_id: str, command: str = "ping", **fields: Any) -> bytes:
    return json.dumps({"schema": "edgekit.command/1", "id": command_id, "command": command,
                       "issued_at": utc_timestamp(), **fields}).encode()  # fmt: skip


def _events(recorder: MessageRecorder) -> list[dict[str, Any]]:
    events = [m.json() for m in recorder.on("/events")]
    for event, message in zip(events, recorder.on("/events")):
        EVENT_VALIDATOR.validate(event)
        assert len(message.payload) <= MAX_EVENT_BYTES
    return events  # type: ignore[return-value]


def _wait_events(recorder: MessageRecorder, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    assert recorder.wait_for(lambda ms: len([m for m in ms if m.topic.endswith("/events")]) >= count, timeout_s), \
        [m.payload[:200] for m in recorder.on("/events")]  # fmt: skip
    return _events(recorder)


def test_a_too_long_id_and_a_deep_payload_are_rejected_once_and_the_link_goes_on(
    mosquitto: MosquittoBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgekit_runtime.agent.mqtt")
    with MessageRecorder(mosquitto, [EVENTS_TOPIC]) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool, on_command=lambda command: None) as link:
            link.wait_connected(10)
            send = recorder.client.publish
            send(CMD_TOPIC, _command("x" * 5000), qos=1)
            send(CMD_TOPIC, b"[" * 5000, qos=1)
            send(CMD_TOPIC, b" " * 70_000 + b"{}", qos=1)
            send(CMD_TOPIC, _command("after-1"), qos=1)  # answered: the link was not wedged
            events = _wait_events(recorder, 4)
            time.sleep(0.5)  # a wedged link would handle the same packet again and again meanwhile
            counters = link.counters
            link.publish_telemetry(sample_telemetry(spool.next_seq()))
            assert link.flush(5)
            assert link.connected and link.link_state.last_error is None
    assert [(e["kind"], e["command_id"]) for e in events] == [
        ("command_rejected", None), ("command_rejected", None), ("command_rejected", None), ("pong", "after-1")]
    long_id, deep, big = events[:3]
    assert long_id["message"] == "command does not match schema command.v1: id: string of 5000 characters is longer than 128"
    assert long_id["details"]["reason"] == "schema"
    assert long_id["details"]["id_excerpt"] == "x" * 49 + "...[truncated: 5000 characters]"
    assert len(long_id["details"]["payload_excerpt"]) <= 200
    assert deep["message"] == "command payload nests arrays and objects 5000 levels deep, more than the limit of 16"
    assert deep["details"]["payload_excerpt"] == "[" * 174 + "...[truncated: 5000 bytes]"
    assert deep["details"]["payload_bytes"] == 5000 and deep["details"]["reason"] == "unparsable"
    assert big["message"] == "command payload is 70002 bytes, more than the limit of 65536 bytes"
    assert counters.commands_received == 4 and counters.commands_rejected == 3 and counters.callback_errors == 0
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 3  # logged once each, bounded
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


def test_a_packet_over_the_announced_maximum_never_reaches_the_agent(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with MessageRecorder(mosquitto, [EVENTS_TOPIC]) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool) as link:
            link.wait_connected(10)
            recorder.client.publish(CMD_TOPIC, b"[" * (MAX_PACKET_BYTES + 1), qos=1).wait_for_publish(5)
            recorder.client.publish(CMD_TOPIC, _command("after-big"), qos=1)
            events = _wait_events(recorder, 1)
            counters = link.counters
    assert [(e["kind"], e["command_id"]) for e in events] == [("pong", "after-big")]
    assert counters.commands_received == 1  # the broker dropped the big one for this client


def test_retained_poison_is_consumed_once_even_across_restarts(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory()
    handled: list[dict[str, Any]] = []
    with MessageRecorder(broker, [EVENTS_TOPIC]) as recorder:
        recorder.client.publish(CMD_TOPIC, b"[" * 5000, qos=1, retain=True).wait_for_publish(5)
        for run in range(3):  # three agent starts, one replay record
            with Spool(tmp_path / "spool.db") as spool, _link(broker.url, spool, ReplayWindow(tmp_path / "commands.db"),
                                                              on_command=handled.append) as link:  # fmt: skip
                link.wait_connected(10)
                ping = f"ping-{run}"
                recorder.client.publish(CMD_TOPIC, _command(ping), qos=1)  # retained delivery comes before it
                assert recorder.wait_for(lambda ms: any(json.loads(m.payload)["command_id"] == ping for m in ms))
                counters = link.counters
            assert counters.commands_received == 2
            assert counters.commands_duplicate == (0 if run == 0 else 1)
    kinds = [(e["kind"], e["command_id"]) for e in _events(recorder)]
    assert kinds == [("command_rejected", None), ("pong", "ping-0"), ("pong", "ping-1"), ("pong", "ping-2")]
    assert handled == []


def test_a_retained_command_runs_once_and_a_replay_is_refused_after_restart(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory()
    handled: list[str] = []
    ran = threading.Event()

    def on_command(command: dict[str, Any]) -> None:
        handled.append(command["id"])
        ran.set()

    retained = _command("set-1", "set_interval", args={"interval_s": 30})
    with MessageRecorder(broker, [EVENTS_TOPIC]) as recorder:
        recorder.client.publish(CMD_TOPIC, retained, qos=1, retain=True).wait_for_publish(5)
        for run in range(2):
            with Spool(tmp_path / "spool.db") as spool, _link(broker.url, spool, ReplayWindow(tmp_path / "commands.db"),
                                                              on_command=on_command) as link:  # fmt: skip
                link.wait_connected(10)
                if run == 0:
                    assert ran.wait(10)
                    continue
                recorder.client.publish(CMD_TOPIC, b"", qos=1, retain=True)  # the host clears it (ignored)
                for index in range(300):  # more than the 256 ids the agent used to remember
                    recorder.client.publish(CMD_TOPIC, _command(f"filler-{index}"), qos=1)
                recorder.client.publish(CMD_TOPIC, retained, qos=1)  # an attacker replays it, not retained
                assert recorder.wait_for(lambda ms: any(json.loads(m.payload)["command_id"] == "set-1" for m in ms), 20)
                counters = link.counters
    events = _events(recorder)
    assert handled == ["set-1"]
    (replayed,) = [e for e in events if e["command_id"] == "set-1"]
    assert replayed["kind"] == "command_rejected" and replayed["level"] == "warning"
    assert replayed["details"]["reason"] == "replayed"
    assert replayed["message"].startswith("command 'set_interval' refused: command id 'set-1' was already received at ")
    assert counters.commands_duplicate == 1  # the retained copy on the second start, dropped quietly
    assert [e["kind"] for e in events].count("pong") == 300 and len(events) == 301  # the empty clearing message: none


def test_commands_outside_the_window_are_refused(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    with MessageRecorder(mosquitto, [EVENTS_TOPIC]) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool, on_command=lambda c: None) as link:
            link.wait_connected(10)
            send = recorder.client.publish
            send(CMD_TOPIC, _command("old", issued_at="2020-01-01T00:00:00Z"), qos=1)
            send(CMD_TOPIC, _command("future", issued_at="2099-01-01T00:00:00Z"), qos=1)
            send(CMD_TOPIC, json.dumps({"schema": "edgekit.command/1", "id": "undated", "command": "ping"}), qos=1)
            events = _wait_events(recorder, 3)
    reasons = {e["command_id"]: (e["kind"], e["details"]["reason"]) for e in events}
    assert reasons == {"old": ("command_rejected", "expired"), "future": ("command_rejected", "future"),
                       "undated": ("command_rejected", "missing_issued_at")}  # fmt: skip
    by_id = {e["command_id"]: e["message"] for e in events}
    assert "is older than the replay window of 86400 s" in by_id["old"]
    assert "is more than 300 s ahead of the device clock" in by_id["future"]


def test_an_exception_inside_a_callback_is_contained_counted_and_reported_once(
    mosquitto: MosquittoBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with MessageRecorder(mosquitto, [EVENTS_TOPIC]) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(mosquitto.url, spool, on_command=lambda c: None) as link:
            link.wait_connected(10)
            link.replay.close()  # the record breaks: every on_message now raises sqlite3.ProgrammingError
            for index in range(3):
                recorder.client.publish(CMD_TOPIC, _command(f"c-{index}"), qos=1)
            events = _wait_events(recorder, 1)
            time.sleep(1.0)  # before the guard, paho handled the first packet again on every loop
            counters = link.counters
            link.publish_telemetry(sample_telemetry(spool.next_seq()))
            assert link.flush(5) and link.connected
    (error,) = events
    assert error["kind"] == "error" and error["level"] == "error"
    assert error["message"] == "MQTT on_message failed: ProgrammingError: Cannot operate on a closed database."
    assert error["details"] == {"code": "mqtt.callback_failed", "callback": "on_message", "error": "ProgrammingError"}
    assert counters.commands_received == 3 and counters.callback_errors == 3
    assert len([r for r in caplog.records if "MQTT on_message failed" in r.getMessage()]) == 1


def test_link_state_follows_the_broker(mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path) -> None:
    broker = mosquitto_factory()
    with Spool(tmp_path / "spool.db") as spool, _link(broker.url, spool) as link:
        link.wait_connected(10)
        up = link.link_state
        assert up.connected and up.last_error is None and up.since is not None
        broker.stop()
        deadline = time.monotonic() + 10
        while link.link_state.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        down = link.link_state
        assert not down.connected and down.since is not None and down.since > up.since
        assert down.last_error is not None and f"127.0.0.1:{broker.port}" in down.last_error
        time.sleep(0.5)  # failed reconnects meanwhile keep "down since" where it was
        assert link.link_state.since == down.since
        broker.start()
        link.wait_connected(10)
        again = link.link_state
        assert again.connected and again.last_error is None and again.since > down.since
    stopped = link.link_state
    assert not stopped.connected and stopped.last_error == "the link was stopped"


def test_a_stuck_network_thread_is_not_reported_as_connected(mosquitto: MosquittoBroker, tmp_path: Path) -> None:
    release = threading.Event()
    with Spool(tmp_path / "spool.db") as spool:
        link = _link(mosquitto.url, spool, keepalive_s=1)
        original_step = link._step

        def stuck_step() -> None:
            if release.is_set():
                original_step()
            else:
                release.wait(3)  # a network loop stuck in one step

        with link:
            link.wait_connected(10)
            release.clear()
            link._step = stuck_step  # type: ignore[method-assign]
            time.sleep(1.5)
            state = link.link_state
            release.set()
        assert not state.connected
        assert state.last_error == "the MQTT network thread stopped serving the connection; see the agent log"
