"""Sending ``command.v1`` messages to devices: QoS 1 on ``edgekit/v1/<fleet>/<device>/cmd``, never retained,
each with a fresh id and ``issued_at`` (devices refuse replays and stale commands). With a ``signing_key``
each command is signed for the device it goes to (:mod:`edgekit_runtime.agent.command_signing`), as
agents with ``commands.require_signed`` demand."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from edgekit.fleet.errors import FleetError
from edgekit_runtime.agent.broker import make_tls_context, parse_broker_url, read_password_file, refuse_plaintext_password
from edgekit_runtime.agent.command_signing import sign_command
from edgekit_runtime.agent.telemetry import COMMAND_SCHEMA, encode_message, utc_timestamp
from edgekit_runtime.agent.topics import DeviceTopics
from edgekit_runtime.schemas import validate_message

logger = logging.getLogger(__name__)

CommandName = Literal["deploy", "rollback", "set_interval", "ping", "deploy_pipeline"]


class CommandError(FleetError):
    """A command could not be delivered to the broker."""


def build_command(command: CommandName, args: Mapping[str, Any] | None = None, *, command_id: str | None = None) -> dict[str, Any]:
    """A ``command.v1`` message, checked against its schema."""
    message: dict[str, Any] = {"schema": COMMAND_SCHEMA, "id": command_id or uuid.uuid4().hex, "command": command,
                               "issued_at": utc_timestamp()}  # fmt: skip
    if args is not None:
        message["args"] = dict(args)
    validate_message(message, "command.v1", what=f"{command} command")
    return message


class CommandPublisher:
    """One MQTT connection that publishes commands and waits for the broker's PUBACK."""

    def __init__(self, broker_url: str, *, mqtt_version: Literal["5", "3.1.1"] = "5", tls_ca: Path | None = None,
                 username: str | None = None, password_file: Path | None = None, client_id: str | None = None,
                 signing_key: Path | None = None, allow_plaintext_password: bool = False) -> None:  # fmt: skip
        """``signing_key``: the fleet's private key (PEM from ``edgekit keygen``); every command sent is signed.
        A password over ``mqtt://`` to a broker off loopback is refused unless ``allow_plaintext_password``."""
        from edgekit_runtime.agent.topics import TelemetryError
        from edgekit_runtime.signing import load_private_key

        self.address = parse_broker_url(broker_url)
        try:
            refuse_plaintext_password(broker_url, has_password=password_file is not None, allow=allow_plaintext_password,
                                      source="fleet commands", field="password_file",
                                      allow_option="CommandPublisher(allow_plaintext_password=True)")  # fmt: skip
        except TelemetryError as exc:
            raise CommandError(exc.message, hint=exc.hint) from exc
        self._signing_key = load_private_key(signing_key) if signing_key is not None else None
        protocol = MQTTProtocolVersion.MQTTv5 if mqtt_version == "5" else MQTTProtocolVersion.MQTTv311
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or f"edgekit-deploy-{uuid.uuid4().hex[:8]}",
                                   protocol=protocol)  # fmt: skip
        if self.address.tls:
            self._client.tls_set_context(make_tls_context(tls_ca, None, None))
        if username is not None:
            self._client.username_pw_set(username, read_password_file(password_file) if password_file else None)
        self._connected = threading.Event()
        self._failure: str | None = None
        self._client.on_connect = self._on_connect

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._failure = str(reason)
        self._connected.set()

    def connect(self, timeout_s: float = 10.0) -> CommandPublisher:
        try:
            self._client.connect(self.address.host, self.address.port, keepalive=30)
        except OSError as err:
            raise CommandError(f"cannot connect to broker {self.address.url}: {err}",
                               hint="check --broker and that the broker is running") from err  # fmt: skip
        self._client.loop_start()
        if not self._connected.wait(timeout_s) or self._failure:
            self.close()
            raise CommandError(f"broker {self.address.url} did not accept the connection: {self._failure or 'no CONNACK'}",
                               hint="check --broker, credentials and the broker's ACL for the deploy tool")  # fmt: skip
        return self

    def send(self, fleet: str, device: str, message: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        topic = DeviceTopics(fleet, device).cmd
        if self._signing_key is not None:
            message = sign_command(message, self._signing_key, fleet=fleet, device=device)
        info = self._client.publish(topic, encode_message(message), qos=1, retain=False)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise CommandError(f"cannot publish {message.get('command')} to {topic}: {paho.error_string(info.rc)}")
        info.wait_for_publish(timeout_s)
        if not info.is_published():
            raise CommandError(f"broker {self.address.url} did not acknowledge the {message.get('command')} command to {topic} "
                               f"within {timeout_s:g} s", hint="check the broker and its ACL")  # fmt: skip
        logger.info("sent %s %s to %s", message.get("command"), message.get("id"), topic)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> CommandPublisher:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
