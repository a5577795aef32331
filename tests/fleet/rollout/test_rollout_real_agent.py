"""`edgekit fleet deploy` to a real agent (AgentService: MQTT, the allowed-sources policy, OTA checks, serving) through
a real Mosquitto and collector into SQLite: the default file:// URL, which a default agent refuses, stops the deploy
before anything is sent (with --file-url the agent refuses it with its reason and a hint), and --inbox puts the tar where
the agent takes it from."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

from edgekit.bundle.pack import pack_bundle
from edgekit.fleet.rollout_bundle import BundleSourceError
from edgekit.fleet.store import open_store
from tests.fleet.simulate.test_fleet_cli import _parser
from tests.runtime.agent.mosquitto import MosquittoBroker


@pytest.fixture
def real_agent_fleet(mosquitto: MosquittoBroker, tmp_path: Path, fleet_keys: tuple[Path, Path], signed_bundle,  # noqa: F811
                     request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]):  # fmt: skip
    """One real agent (``@pytest.mark.parametrize("real_agent_fleet", [{"commands": {...}}], indirect=True)`` adds config)."""
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.store import open_store
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.service import AgentService

    fleet, device = "lab", f"dev-{uuid.uuid4().hex[:6]}"
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(yaml.safe_dump({
        "device_id": device, "fleet": fleet, "broker": {"url": mosquitto.url, "keepalive_s": 10},
        "bundles": {"dir": str(tmp_path / "device" / "bundles"), "public_key": str(fleet_keys[1])},  # no allowed_sources
        "api": {"address": "127.0.0.1:0"},
        "telemetry": {"interval_s": 0.3, "spool": {"path": str(tmp_path / "device" / "spool.db")}},
        "power": {"sensor": "none"}, "health": {"window_s": 0.3, "max_error_rate": 0.5, "min_requests": 1},
        "probe": {"interval_s": 0.1, "dims": {"batch": 2}}, **getattr(request, "param", {}),
    }), encoding="utf-8")  # fmt: skip
    assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config_path)]) == 0
    install_output = capsys.readouterr().out
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    store = open_store(store_url)
    collector = Collector(mosquitto.url, store, client_id=f"collector-{device}", flush_interval_s=0.05).start()
    config = load_config(config_path)
    service = AgentService(config).start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            summaries = [s for s in store.device_summaries(fleet) if s.device == device and s.state == "online" and s.windows >= 2]
            if summaries:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the real agent's telemetry did not reach the store: {store.device_summaries(fleet)}")
        yield {"store_url": store_url, "broker": mosquitto.url, "device": device, "service": service, "config": config,
               "install_output": install_output}
    finally:
        service.stop()
        collector.stop()
        store.close()


def test_deploy_to_a_real_agent_needs_a_source_it_accepts(real_agent_fleet, signed_bundle, fleet_keys, tmp_path: Path,
                                                          capsys) -> None:  # fmt: skip
    from edgekit_runtime.agent.client import AgentClient

    (tmp_path / "out").mkdir()
    tar = pack_bundle(signed_bundle("tiny-b"), tmp_path / "out" / "tiny-b.tar")
    base = ["deploy", str(tar), "--broker", real_agent_fleet["broker"], "--store", real_agent_fleet["store_url"], "--devices",
            real_agent_fleet["device"], "--key", str(fleet_keys[1]), "--deploy-timeout-s", "30", "--force", "--json"]  # fmt: skip

    # the tar's own file:// URL is one a default agent refuses: the deploy stops before sending (issue 32 item 6)
    stopped = _parser().parse_args(base)
    with pytest.raises(BundleSourceError) as info:
        stopped.func(stopped)
    assert f"{real_agent_fleet['device']} (agent " in info.value.message and tar.as_uri() in info.value.message
    assert "nothing was sent" in info.value.message and "--inbox DIR" in info.value.hint and "--file-url" in info.value.hint
    with open_store(real_agent_fleet["store_url"]) as store:
        assert store.rollouts("lab") == [] and not [e for e in store.events("lab") if e.kind == "deploy_result"]

    # sent anyway (--file-url: "their allowed_sources list it"), the agent refuses it with its reason and the hint
    refused = _parser().parse_args(base + ["--file-url"])
    assert refused.func(refused) == 1
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = record["device_results"][real_agent_fleet["device"]]
    assert record["state"] == "stopped" and result["outcome"] == "failed" and result["step"] == "download"
    assert f"deploy source refused: '{tar.as_uri()}' is not under the agent's inbox" in result["reason"]
    assert "--inbox DIR" in result["hint"]

    inbox = real_agent_fleet["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    accepted = _parser().parse_args(base + ["--inbox", str(inbox)])
    assert accepted.func(accepted) == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["url"] == (inbox / "tiny-b.tar").as_uri()
    assert record["device_results"][real_agent_fleet["device"]]["outcome"] == "succeeded"
    health = AgentClient(real_agent_fleet["service"].api_address).health()
    assert health["model"] == "tiny-b" and health["bundle_id"] == record["bundle_id"]


def test_deploy_on_the_local_stack_of_fleet_up(signed_bundle, fleet_keys, tmp_path: Path, capsys) -> None:
    """`edgekit fleet up --simulate 3` (embedded amqtt broker, MQTT 3.1.1) and `edgekit fleet deploy` against it."""
    pytest.importorskip("amqtt", reason="amqtt is not installed (pip install amqtt)")
    from edgekit.fleet.local_stack import LocalStack, LocalStackConfig
    from edgekit.fleet.simulate import DeployTiming

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    config = LocalStackConfig(broker_port=0, store_url=store_url, dashboard_port=0, simulate=3, simulate_rate_per_s=10.0,
                              simulation={"targets": ("x86-64-cpu",), "verify_downloads": True,
                                          "deploy_timing": DeployTiming(step_s=0.01, watch_s=0.3)})  # fmt: skip
    with LocalStack(config) as stack:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(s.windows >= 3 for s in stack.store.device_summaries("sim")) < 3:
            time.sleep(0.1)
        bundle = signed_bundle("vision-local")
        args = _parser().parse_args(["deploy", str(bundle), "--broker", stack.broker_url, "--store", store_url, "--mqtt-version",
                                     stack.mqtt_version, "--target", "x86-64-cpu", "--waves", "1,100%", "--health-window-s", "1",
                                     "--deploy-timeout-s", "20", "--key", str(fleet_keys[1]), "--json"])  # fmt: skip
        assert args.func(args) == 0, capsys.readouterr().err
        record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert record["state"] == "completed" and [len(w["devices"]) for w in record["waves"]] == [1, 2]
        assert set(stack.simulator.bundles().values()) == {record["bundle_id"]}


@pytest.mark.parametrize("real_agent_fleet", [{"commands": {"require_signed": True}}], indirect=True)
def test_an_agent_that_requires_signed_commands_takes_the_deploy_only_signed(real_agent_fleet, signed_bundle, fleet_keys,
                                                                              tmp_path: Path, capsys) -> None:  # fmt: skip
    (tmp_path / "out").mkdir()
    tar = pack_bundle(signed_bundle("tiny-c"), tmp_path / "out" / "tiny-c.tar")
    inbox = real_agent_fleet["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    base = ["deploy", str(tar), "--broker", real_agent_fleet["broker"], "--store", real_agent_fleet["store_url"], "--devices",
            real_agent_fleet["device"], "--inbox", str(inbox), "--deploy-timeout-s", "30", "--force", "--json"]  # fmt: skip

    unsigned = _parser().parse_args(base + ["--key", str(fleet_keys[1])])
    assert unsigned.func(unsigned) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["device_results"][real_agent_fleet["device"]]
    assert result["outcome"] == "rejected" and result["step"] == "unsigned", result
    assert "--sign-commands fleet.key.pem" in result["hint"]

    signed = _parser().parse_args(base + ["--sign-commands", str(fleet_keys[0])])  # its public half checks the bundle too
    assert signed.func(signed) == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["signed_commands"] is True and record["options"]["signed_by"]


@pytest.mark.parametrize("real_agent_fleet", [{"commands": {"require_signed": True}}], indirect=True)
def test_a_downgrade_is_refused_by_the_agent_until_allowed(real_agent_fleet, signed_bundle, fleet_keys, tmp_path: Path,
                                                          capsys) -> None:  # fmt: skip
    """allow_downgrade is honoured only in a signed command to an agent that requires them (issue 28 item 6)."""
    from edgekit.bundle.signing import sign_bundle
    from tests.runtime.agent_service.bundles import make_bundle

    (tmp_path / "out").mkdir()
    old = make_bundle(tmp_path / "old" / "tiny-a", name="tiny-a", bundle_version=1)  # the served tiny-a dates from 2025
    sign_bundle(old, fleet_keys[0])
    tar = pack_bundle(old, tmp_path / "out" / "tiny-a-old.tar")
    inbox = real_agent_fleet["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    base = ["deploy", str(tar), "--broker", real_agent_fleet["broker"], "--store", real_agent_fleet["store_url"], "--devices",
            real_agent_fleet["device"], "--inbox", str(inbox), "--sign-commands", str(fleet_keys[0]), "--deploy-timeout-s",
            "30", "--force", "--json"]  # fmt: skip
    refused = _parser().parse_args(base)
    assert refused.func(refused) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["device_results"][real_agent_fleet["device"]]
    assert result["outcome"] == "failed" and result["step"] == "version" and "refusing a downgrade" in result["reason"]
    assert "--allow-downgrade" in result["hint"]
    allowed = _parser().parse_args(base + ["--allow-downgrade"])
    assert allowed.func(allowed) == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["allow_downgrade"] is True


def test_a_signature_change_is_refused_by_the_agent_until_allowed(real_agent_fleet, signed_bundle, fleet_keys, tmp_path: Path,
                                                                 capsys) -> None:  # fmt: skip
    from edgekit_runtime.agent.client import AgentClient

    (tmp_path / "out").mkdir()
    tar = pack_bundle(signed_bundle("tiny-flat", model="flat_input"), tmp_path / "out" / "tiny-flat.tar")  # image [batch, 64]
    inbox = real_agent_fleet["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    base = ["deploy", str(tar), "--broker", real_agent_fleet["broker"], "--store", real_agent_fleet["store_url"], "--devices",
            real_agent_fleet["device"], "--inbox", str(inbox), "--sign-commands", str(fleet_keys[0]), "--deploy-timeout-s",
            "30", "--force", "--json"]  # fmt: skip
    refused = _parser().parse_args(base)
    assert refused.func(refused) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["device_results"][real_agent_fleet["device"]]
    assert result["outcome"] == "failed" and result["step"] == "io_signature" and "input 'image'" in result["reason"]
    assert "--allow-signature-change" in result["hint"]
    allowed = _parser().parse_args(base + ["--allow-signature-change"])
    assert allowed.func(allowed) == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["allow_signature_change"] is True
    assert AgentClient(real_agent_fleet["service"].api_address).health()["model"] == "tiny-flat"
