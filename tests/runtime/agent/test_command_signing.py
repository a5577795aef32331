"""Commands signed with the fleet key: the host's CommandPublisher signs, MqttLink on a real Mosquitto
verifies; unsigned, tampered, misaddressed and foreign-key commands are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgekit.bundle.signing import generate_keypair
from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.command_signing import CommandSignatureError, sign_command, verify_command
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.topics import TelemetryError
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.signing import load_private_key, load_public_key
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker

FLEET, DEVICE = "lab", "dev-1"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "keys" / "fleet.key.pem", tmp_path / "keys" / "fleet.pub.pem"
    private.parent.mkdir()
    generate_keypair(private, public)
    return private, public


def test_a_signature_binds_the_command_and_its_device(keys: tuple[Path, Path], tmp_path: Path) -> None:
    private, public = load_private_key(keys[0]), load_public_key(keys[1])
    command = build_command("set_interval", {"interval_s": 30}, command_id="c-1")
    signed = sign_command(command, private, fleet=FLEET, device=DEVICE)
    validate_message(signed, "command.v1")
    assert verify_command(json.loads(json.dumps(signed)), public, fleet=FLEET, device=DEVICE)  # survives the wire

    def refusal(message: dict[str, Any], key: Any = public, device: str = DEVICE) -> str:
        with pytest.raises(CommandSignatureError) as info:
            verify_command(message, key, fleet=FLEET, device=device)
        return info.value.message

    assert refusal({**signed, "args": {"interval_s": 1}}).startswith("command signature does not verify under the fleet key")
    assert "for device lab/dev-2: the command was changed after signing, signed for another device" in refusal(signed, device="dev-2")
    other_private, other_public = tmp_path / "other.key.pem", tmp_path / "other.pub.pem"
    generate_keypair(other_private, other_public)
    assert "does not verify" in refusal(sign_command(command, load_private_key(other_private), fleet=FLEET, device=DEVICE))
    assert refusal(command) == "command is not signed, and this agent accepts only signed commands (commands.require_signed)"
    assert refusal({**command, "signature": "not base64!"}).startswith("command signature is not valid base64")
    assert refusal({**command, "signature": "AAAA"}) == "command signature is 3 bytes, an Ed25519 signature is 64"


def _link(broker: MosquittoBroker, spool: Spool, public: Path, required: bool) -> MqttLink:
    return MqttLink(broker.url, DEVICE, FLEET, DEVICE, spool=spool, keepalive_s=5, backoff=Backoff(0.1, 0.3),
                    command_key=load_public_key(public), require_signed_commands=required,
                    on_command=lambda command: None)  # fmt: skip


def test_an_agent_that_requires_signatures_runs_only_what_the_fleet_key_signed_for_it(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    cmd_topic = f"edgekit/v1/{FLEET}/{DEVICE}/cmd"
    signer = load_private_key(keys[0])
    with MessageRecorder(mosquitto, [f"edgekit/v1/{FLEET}/{DEVICE}/events"]) as recorder, \
            Spool(tmp_path / "spool.db") as spool, _link(mosquitto, spool, keys[1], required=True) as link, \
            CommandPublisher(mosquitto.url, signing_key=keys[0]) as publisher:  # fmt: skip
        link.wait_connected(10)
        publisher.send(FLEET, DEVICE, build_command("ping", command_id="signed"))
        raw = recorder.client.publish
        raw(cmd_topic, json.dumps(build_command("ping", command_id="unsigned")), qos=1)
        for_other = sign_command(build_command("ping", command_id="misaddressed"), signer, fleet=FLEET, device="dev-2")
        raw(cmd_topic, json.dumps(for_other), qos=1)
        tampered = sign_command(build_command("set_interval", {"interval_s": 30}, command_id="tampered"), signer,
                                fleet=FLEET, device=DEVICE)  # fmt: skip
        raw(cmd_topic, json.dumps({**tampered, "args": {"interval_s": 1}}), qos=1)
        assert recorder.wait_for(lambda ms: len(ms) == 4)
        events = {m.json()["command_id"]: m.json() for m in recorder.messages}  # type: ignore[index]
    assert events["signed"]["kind"] == "pong"
    assert events["unsigned"]["details"]["reason"] == "unsigned"
    assert events["unsigned"]["message"] == ("command 'ping' refused: command is not signed, and this agent accepts "
                                             "only signed commands (commands.require_signed)")  # fmt: skip
    assert events["misaddressed"]["details"]["reason"] == "bad_signature"
    assert events["tampered"]["details"]["reason"] == "bad_signature"
    assert "signature does not verify under the fleet key" in events["tampered"]["message"]


def test_an_agent_that_does_not_require_signatures_still_checks_present_ones(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    cmd_topic = f"edgekit/v1/{FLEET}/{DEVICE}/cmd"
    forged = {**build_command("ping", command_id="forged"), "signature": "A" * 86 + "=="}
    with MessageRecorder(mosquitto, [f"edgekit/v1/{FLEET}/{DEVICE}/events"]) as recorder, \
            Spool(tmp_path / "spool.db") as spool, _link(mosquitto, spool, keys[1], required=False) as link:  # fmt: skip
        link.wait_connected(10)
        recorder.client.publish(cmd_topic, json.dumps(build_command("ping", command_id="plain")), qos=1)
        recorder.client.publish(cmd_topic, json.dumps(forged), qos=1)
        assert recorder.wait_for(lambda ms: len(ms) == 2)
        events = {m.json()["command_id"]: m.json() for m in recorder.messages}  # type: ignore[index]
    assert events["plain"]["kind"] == "pong"
    assert events["forged"]["kind"] == "command_rejected" and events["forged"]["details"]["reason"] == "bad_signature"


def test_requiring_signatures_needs_a_key(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        with pytest.raises(TelemetryError, match=r"require_signed_commands needs the fleet's public key as command_key"):
            MqttLink("mqtt://127.0.0.1:1", DEVICE, FLEET, DEVICE, spool=spool, require_signed_commands=True)
