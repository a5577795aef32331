"""A broker password never crosses the network in clear text unless the config says so (issue 28, item 4).

``mqtt://`` to a host that is not loopback with a password: the agent config, ``fleet collect`` and the
simulator refuse it, naming where the password came from and the fix (mqtts://, or
``allow_plaintext_password``); nothing is sent (the refusal comes before any connection, so the unroutable
TEST-NET address 192.0.2.10 is never contacted). On loopback ``edgekit-agent check`` connects to a real
Mosquitto that asks for a password and reports the broker as a warning, not as ``ok``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgekit.fleet.collector import Collector
from edgekit.fleet.errors import CollectorError
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig
from edgekit.fleet.store.sqlite import SqliteStore
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.topics import TelemetryError
from tests.runtime.agent.mosquitto import require_mosquitto, write_password_file

AGENT = Path(sys.executable).parent / "edgekit-agent"
EDGEKIT = Path(sys.executable).parent / "edgekit"
OFF_LOOPBACK = "mqtt://192.0.2.10:1883"  # TEST-NET-1: never routed, and never contacted by these tests


def _secret(path: Path) -> Path:
    path.write_text("s3cret\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def _agent_config(tmp_path: Path, broker: dict[str, Any]) -> Path:
    data = {
        "device_id": "dev-1",
        "fleet": "lab",
        "broker": broker,
        "bundles": {"dir": str(tmp_path / "bundles"), "allow_unsigned": True},
        "api": {"address": "127.0.0.1:0"},
        "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
        "power": {"sensor": "none"},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_agent_refuses_a_password_over_plain_mqtt_off_loopback(tmp_path: Path) -> None:
    config = _agent_config(tmp_path, {"url": OFF_LOOPBACK, "username": "dev-1", "password_file": str(_secret(tmp_path / "pw"))})
    with pytest.raises(AgentConfigError) as caught:
        load_config(config)
    message = caught.value.message
    assert str(config) in message and "broker.password_file" in message and "clear text" in message
    assert "mqtts://" in (caught.value.hint or "") and "broker.allow_plaintext_password: true" in (caught.value.hint or "")
    # the agent itself: `run` and `check` stop at the config (exit 2) before any connection
    for command in ("run", "check"):
        done = subprocess.run([str(AGENT), command, "--config", str(config)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "broker.password_file" in done.stderr and "allow_plaintext_password" in done.stderr


def test_agent_accepts_what_carries_no_password_in_clear(tmp_path: Path) -> None:
    secret = str(_secret(tmp_path / "pw"))
    no_password = load_config(_agent_config(tmp_path, {"url": OFF_LOOPBACK, "username": "dev-1"}))
    assert no_password.broker is not None and not no_password.broker.allow_plaintext_password
    loopback = load_config(_agent_config(tmp_path, {"url": "mqtt://localhost:1883", "username": "d", "password_file": secret}))
    assert loopback.broker is not None
    allowed = load_config(_agent_config(tmp_path, {"url": OFF_LOOPBACK, "username": "d", "password_file": secret,
                                                   "allow_plaintext_password": True}))  # fmt: skip
    assert allowed.broker is not None and allowed.broker.allow_plaintext_password


def test_check_warns_about_a_clear_text_password_on_loopback(tmp_path: Path, mosquitto_factory: Any) -> None:
    require_mosquitto()
    broker = mosquitto_factory(password_file=write_password_file(tmp_path / "passwd", {"dev-1": "s3cret"}))
    config = _agent_config(tmp_path, {"url": broker.url, "username": "dev-1", "password_file": str(_secret(tmp_path / "pw"))})
    done = subprocess.run([str(AGENT), "check", "--json", "--broker-timeout-s", "5", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    report = json.loads(done.stdout)
    assert not any("broker" in line and "accepted" in line for line in report["passed"]), report["passed"]
    warning = next(line for line in report["warnings"] if "clear text" in line)
    assert "accepted the connection as dev-1" in warning and "loopback" in warning and "mqtts://" in warning
    assert str(config) in warning and "broker.password_file" in warning


def test_collector_refuses_a_password_over_plain_mqtt_off_loopback(tmp_path: Path) -> None:
    secret = _secret(tmp_path / "pw")
    with SqliteStore(tmp_path / "fleet.db") as store:
        with pytest.raises(CollectorError) as caught:
            Collector(OFF_LOOPBACK, store, client_id="c", username="collector", password_file=secret)
        assert "--password-file" in caught.value.message and "clear text" in caught.value.message
        assert "--allow-plaintext-password" in (caught.value.hint or "")
        Collector(OFF_LOOPBACK, store, client_id="c", username="collector", password_file=secret,
                  allow_plaintext_password=True)  # built, not started: nothing is sent  # fmt: skip


@pytest.mark.skipif(not EDGEKIT.exists(), reason="the host CLI (edgekit) is not installed here: scripts/check_py310.sh "
                                                 "installs only the runtime; the .venv run covers it")  # fmt: skip
def test_fleet_collect_refuses_a_password_over_plain_mqtt_off_loopback(tmp_path: Path) -> None:
    secret = _secret(tmp_path / "pw")
    done = subprocess.run([str(EDGEKIT), "fleet", "collect", "--broker", OFF_LOOPBACK, "--store", f"sqlite:///{tmp_path / 'f.db'}",
                           "--username", "collector", "--password-file", str(secret), "--no-metrics", "--duration", "1"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert "clear text" in done.stdout + done.stderr and "--allow-plaintext-password" in done.stdout + done.stderr


def test_command_publisher_refuses_a_password_over_plain_mqtt_off_loopback(tmp_path: Path) -> None:
    from edgekit.fleet.commands import CommandError, CommandPublisher

    with pytest.raises(CommandError) as caught:
        CommandPublisher(OFF_LOOPBACK, username="fleet-admin", password_file=_secret(tmp_path / "pw"))
    assert "fleet commands: password_file" in caught.value.message and "clear text" in caught.value.message


def test_simulator_refuses_a_password_over_plain_mqtt_off_loopback(tmp_path: Path) -> None:
    secret = _secret(tmp_path / "pw")
    with pytest.raises(TelemetryError) as caught:
        FleetSimulator(SimulationConfig(OFF_LOOPBACK, devices=1, username="sim", password_file=secret))
    assert "fleet simulate" in caught.value.message and "--password-file" in caught.value.message
    assert "--allow-plaintext-password" in (caught.value.hint or "")
