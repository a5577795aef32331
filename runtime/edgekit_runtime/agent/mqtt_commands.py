"""Commands arriving on the MQTT link's ``.../cmd`` topic: untrusted, checked before anything acts on them.

Commands on ``.../cmd`` are untrusted. Each is parsed with size and depth limits
(:data:`MAX_COMMAND_BYTES`, :data:`MAX_COMMAND_DEPTH`), checked against ``command.v1``, then against
the fleet key when signed or when signatures are required (:mod:`~edgekit_runtime.agent.command_signing`),
then against the :class:`~edgekit_runtime.agent.replay.ReplayWindow` (``issued_at`` inside the
window, id not seen before, persisted across restarts). A command that fails any check is answered by one bounded
``command_rejected`` event (ids and payloads quoted in at most 200 characters) and acknowledged, so
it is consumed; a *retained* or redelivered payload that was answered before is dropped quietly, so a
retained poison message does not come back after a restart. ``ping`` is answered by a ``pong``
event; the rest go to ``on_command`` on a separate thread (so a slow deploy does not stall the
network), and a handler that raises is answered by a ``command_failed`` event.

A part of :class:`~edgekit_runtime.agent.mqtt.MqttLink`, which supplies the state named below.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho

from edgekit_runtime.agent.bounded import excerpt, excerpt_bytes
from edgekit_runtime.agent.command_signing import SIGNATURE_FIELD, CommandSignatureError, verify_command
from edgekit_runtime.agent.delivery import DeliveryTracker
from edgekit_runtime.agent.replay import ReplayError, ReplayWindow
from edgekit_runtime.agent.telemetry import EVENT_COMMAND_FAILED, EVENT_COMMAND_REJECTED, EVENT_PONG, EventLevel
from edgekit_runtime.agent.topics import DeviceTopics, TelemetryError
from edgekit_runtime.agent.wire import JsonLimitError, loads_limited
from edgekit_runtime.schemas import schema_problems

logger = logging.getLogger("edgekit_runtime.agent.mqtt")

#: Largest command payload the agent parses (a deploy command is under 3 KB).
MAX_COMMAND_BYTES = 64 * 1024
#: Deepest JSON nesting a command may have (command.v1 needs 3).
MAX_COMMAND_DEPTH = 16
_LISTED_SCHEMA_PROBLEMS = 5

CommandHandler = Callable[[dict[str, Any]], None]


class CommandIntake:
    """The command half of :class:`~edgekit_runtime.agent.mqtt.MqttLink`: check, answer or queue, dispatch."""

    topics: DeviceTopics
    delivery: DeliveryTracker
    replay: ReplayWindow
    _on_command: CommandHandler | None
    _command_key: Any
    _require_signed: bool
    _counts: dict[str, int]
    _counts_lock: threading.Lock
    _commands: queue.Queue[dict[str, Any] | None]
    emit_event: Callable[..., int]

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        if message.topic == self.topics.ack and self.delivery.waits_for_collector:
            self.delivery.ack_received(bytes(message.payload))
            return
        if message.topic != self.topics.cmd:
            logger.debug("ignoring message on %s", message.topic)
            return
        with self._counts_lock:
            self._counts["commands_received"] += 1
        try:
            self._handle_command(bytes(message.payload), redelivered=bool(message.retain or message.dup))
        except (TelemetryError, ReplayError):
            logger.exception("cannot answer a command on %s", message.topic)

    def _handle_command(self, payload: bytes, *, redelivered: bool = False) -> None:
        if not payload:  # how a host deletes a retained command; nothing to answer
            logger.debug("empty message on %s (a retained command was cleared)", self.topics.cmd)
            return
        digest = hashlib.sha256(payload).hexdigest()
        if redelivered and self.replay.payload_seen(digest):
            with self._counts_lock:
                self._counts["commands_duplicate"] += 1
            logger.info("retained or redelivered command %s... on %s was answered before; dropped", digest[:12],
                        self.topics.cmd)  # fmt: skip
            return
        command = self._checked_command(payload, digest)
        if command is None:
            return
        if command["command"] == "ping":
            self.emit_event(EVENT_PONG, "pong", command_id=command["id"])
        elif self._on_command is None:
            self._reject_command(f"this agent has no handler for command '{command['command']}'", payload, digest,
                                 command["id"], kind=EVENT_COMMAND_FAILED)  # fmt: skip
        else:
            self._commands.put(command)

    def _checked_command(self, payload: bytes, digest: str) -> dict[str, Any] | None:
        """The command in ``payload`` when it passes every check, else None (after rejecting it)."""
        try:
            command = loads_limited(payload, what="command payload", max_bytes=MAX_COMMAND_BYTES, strict=True,
                                    max_depth=MAX_COMMAND_DEPTH)  # fmt: skip
        except JsonLimitError as err:
            self._reject_command(err.message, payload, digest, None, reason="unparsable")
            return None
        raw_id = command.get("id") if isinstance(command, dict) else None
        problems = schema_problems(command, "command.v1", limit=_LISTED_SCHEMA_PROBLEMS)
        if problems:
            self._reject_command(f"command does not match schema command.v1: {'; '.join(problems)}", payload, digest,
                                 raw_id, reason="schema")  # fmt: skip
            return None
        if self._command_key is not None and (self._require_signed or SIGNATURE_FIELD in command):
            try:
                verify_command(command, self._command_key, fleet=self.topics.fleet, device=self.topics.device)
            except (CommandSignatureError, ValueError) as err:  # ValueError: a command its canonical form cannot hold
                message = err.message if isinstance(err, CommandSignatureError) else f"its signed form cannot be made: {err}"
                self._reject_command(f"command {command['command']!r} refused: {message}", payload, digest,
                                     command["id"], reason="unsigned" if SIGNATURE_FIELD not in command else "bad_signature")  # fmt: skip
                return None
        try:
            refusal = self.replay.admit(command["id"], command.get("issued_at"), payload_digest=digest)
        except ReplayError as err:  # an impossible date, or the record cannot be written: refuse, fail closed
            self._reject_command(f"command {command['command']!r} refused: {err.message}", payload, digest,
                                 command["id"], reason="replay_record")  # fmt: skip
            return None
        if refusal is not None:
            self._reject_command(f"command {command['command']!r} refused: {refusal.message}", payload, digest,
                                 command["id"], reason=refusal.reason, level="warning")  # fmt: skip
            return None
        return dict(command)

    def _reject_command(self, problem: str, payload: bytes, digest: str, raw_id: object, *,
                        kind: str = EVENT_COMMAND_REJECTED, reason: str | None = None,
                        level: EventLevel = "error") -> None:  # fmt: skip
        with self._counts_lock:
            self._counts["commands_rejected"] += 1
        try:  # remembered first: a retained or redelivered copy is then dropped, not answered again
            self.replay.remember_payload(digest)
        except ReplayError as err:
            logger.error("rejected command %s... not remembered: %s", digest[:12], err)
        command_id = raw_id if isinstance(raw_id, str) and 1 <= len(raw_id) <= 128 else None
        details: dict[str, Any] = {"topic": self.topics.cmd, "payload_excerpt": excerpt_bytes(payload),
                                   "payload_bytes": len(payload), "payload_sha256": digest}  # fmt: skip
        if reason is not None:
            details["reason"] = reason
        if command_id is None and isinstance(raw_id, str):
            details["id_excerpt"] = excerpt(raw_id, 80)
        logger.warning("command on %s rejected: %s", self.topics.cmd, excerpt(problem, 500))
        self.emit_event(kind, problem, level=level, command_id=command_id, details=details)

    def _dispatch_commands(self) -> None:
        while True:
            command = self._commands.get()
            handler = self._on_command
            if command is None:
                return
            if handler is None:  # commands are queued only when a handler exists
                continue
            try:
                handler(command)
            except Exception as exc:  # a failing handler must not end the thread
                logger.exception("command %s (%s) failed", command["id"], command["command"])
                try:
                    self.emit_event(EVENT_COMMAND_FAILED, f"command '{command['command']}' failed: "
                                    f"{type(exc).__name__}: {exc}", level="error", command_id=command["id"])  # fmt: skip
                except TelemetryError:
                    logger.exception("cannot report the failure of command %s", command["id"])
