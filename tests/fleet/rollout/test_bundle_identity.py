"""One bundle id everywhere (issue 32 item 5): ``edgekit pack`` prints it, ``fleet deploy`` sends it, a real agent
(installed with ``edgekit-agent install``, then deployed to) and simulated devices report it, and the store keys on it;
deploying the bundle a device already serves ends as ``already_current``, not ``succeeded``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgekit.cli.main import main as edgekit_main
from tests.fleet.rollout.test_rollout_real_agent import real_agent_fleet  # noqa: F401 (pytest fixture)
from tests.fleet.simulate.test_fleet_cli import _parser


def _pack(bundle: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``edgekit pack BUNDLE --out OUT --json``; returns the bundle id it prints."""
    capsys.readouterr()
    assert edgekit_main(["pack", str(bundle), "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["tar"] == str(out)
    return str(printed["bundle_id"])


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_real_agent_reports_the_id_pack_and_deploy_use(real_agent_fleet, fleet_keys, tmp_path: Path, capsys) -> None:  # noqa: F811
    from edgekit.fleet.store import open_store
    from edgekit_runtime.agent.client import AgentClient

    (tmp_path / "out").mkdir()
    bundle_id = _pack(tmp_path / "tiny-a", tmp_path / "out" / "tiny-a.tar", capsys)  # the bundle the fixture installed
    assert bundle_id.startswith("tiny-a-") and len(bundle_id) == len("tiny-a-") + 12
    client = AgentClient(real_agent_fleet["service"].api_address)
    assert client.health()["bundle_id"] == bundle_id  # installed by `edgekit-agent install`, which names no id
    installed = real_agent_fleet["install_output"]
    assert f"deploy_result: deployed tiny-a as {bundle_id}" in installed, installed  # and says the id when it installs
    device = real_agent_fleet["device"]
    deadline = time.monotonic() + 20
    with open_store(real_agent_fleet["store_url"]) as store:
        while time.monotonic() < deadline:
            summary = next(s for s in store.device_summaries("lab") if s.device == device)
            if summary.bundle_id == bundle_id:
                break
            time.sleep(0.1)
        assert summary.bundle_id == bundle_id
        assert store.known_values("bundle_id", fleet="lab") == [bundle_id]  # one bundle, one id

    inbox = real_agent_fleet["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    again = _parser().parse_args(["deploy", str(tmp_path / "out" / "tiny-a.tar"), "--broker", real_agent_fleet["broker"],
                                  "--store", real_agent_fleet["store_url"], "--devices", device, "--key", str(fleet_keys[1]),
                                  "--inbox", str(inbox), "--deploy-timeout-s", "30", "--health-window-s", "0.5", "--force",
                                  "--json"])  # fmt: skip
    assert again.func(again) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["bundle_id"] == bundle_id and record["state"] == "completed", record
    result = record["device_results"][device]
    assert record["outcomes"][device] == "already_current" and result["outcome"] == "already_current", result
    assert "is already the current bundle" in result["reason"] and result["hint"] is None
    assert f"{device}: already_current" in captured.err and f"{device}: succeeded" not in captured.err
    assert client.health()["bundle_id"] == bundle_id


def test_simulated_devices_report_the_id_pack_prints(signed_bundle, fleet_keys, tmp_path: Path, capsys) -> None:
    """The embedded stack of `fleet up`: simulated devices take the deploy under the pack id, and a second deploy of the
    same tar is already current on each of them."""
    pytest.importorskip("amqtt", reason="amqtt is not installed (pip install amqtt)")
    from edgekit.fleet.local_stack import LocalStack, LocalStackConfig
    from edgekit.fleet.simulate import DeployTiming

    (tmp_path / "out").mkdir()
    tar = tmp_path / "out" / "vision-ids.tar"
    bundle_id = _pack(signed_bundle("vision-ids"), tar, capsys)
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    config = LocalStackConfig(broker_port=0, store_url=store_url, dashboard_port=0, simulate=2, simulate_rate_per_s=10.0,
                              simulation={"targets": ("x86-64-cpu",), "verify_downloads": True,
                                          "deploy_timing": DeployTiming(step_s=0.01, watch_s=0.3)})  # fmt: skip
    with LocalStack(config) as stack:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(s.windows >= 3 for s in stack.store.device_summaries("sim")) < 2:
            time.sleep(0.1)
        argv = ["deploy", str(tar), "--broker", stack.broker_url, "--store", store_url, "--mqtt-version", stack.mqtt_version,
                "--target", "x86-64-cpu", "--waves", "100%", "--health-window-s", "1", "--deploy-timeout-s", "20",
                "--key", str(fleet_keys[1]), "--json"]  # fmt: skip
        first = _parser().parse_args(argv)
        assert first.func(first) == 0, capsys.readouterr().err
        record = _last_json(capsys)
        assert record["bundle_id"] == bundle_id and set(record["outcomes"].values()) == {"succeeded"}
        assert set(stack.simulator.bundles().values()) == {bundle_id}
        second = _parser().parse_args(argv)
        assert second.func(second) == 0, capsys.readouterr().err
        record = _last_json(capsys)
        assert record["state"] == "completed" and set(record["outcomes"].values()) == {"already_current"}, record
