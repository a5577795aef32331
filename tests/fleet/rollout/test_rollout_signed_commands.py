"""`edgekit fleet deploy --sign-commands`: every command the rollout sends is signed for its device."""

from __future__ import annotations

import json

from edgekit_runtime.agent.command_signing import verify_command
from edgekit_runtime.agent.topics import parse_topic
from edgekit_runtime.signing import load_public_key
from tests.fleet.simulate.test_fleet_cli import _parser
from tests.runtime.agent.mosquitto import MessageRecorder


def test_deploy_with_sign_commands_signs_each_command_for_its_device(live_fleet, signed_bundle, fleet_keys) -> None:
    fleet = live_fleet(devices=2)
    bundle = signed_bundle("vision-signed")
    args = _parser().parse_args(["deploy", str(bundle), "--broker", fleet.broker.url, "--store", fleet.store_url,
                                 "--target", "x86-64-cpu", "--canary", "1", "--health-window-s", "1",
                                 "--deploy-timeout-s", "10", "--sign-commands", str(fleet_keys[0])])  # fmt: skip
    with MessageRecorder(fleet.broker, ["edgekit/v1/sim/+/cmd"]) as recorder:
        assert args.func(args) == 0
        assert recorder.wait_for(lambda ms: len(ms) == 2)
        commands = [(parse_topic(m.topic), json.loads(m.payload)) for m in recorder.messages]
    public = load_public_key(fleet_keys[1])
    assert sorted(topic.device for topic, _ in commands) == sorted(fleet.simulator.bundles())
    for topic, command in commands:
        assert command["command"] == "deploy" and len(command["signature"]) == 88
        verify_command(command, public, fleet=topic.fleet, device=topic.device)
