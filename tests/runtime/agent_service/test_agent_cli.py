"""``edgekit-agent check`` and ``install``: exit codes and what they print."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.cli import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEMS, main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.errors import AgentApiError

AGENT_SCRIPT = Path(sys.executable).parent / "edgekit-agent"


def test_check_with_an_invalid_config_exits_2(agent_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = agent_config(api={"adress": "127.0.0.1:8470"})
    assert main(["check", "--config", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "api.adress: is not a known key" in err and "did you mean 'api.address'?" in err


def test_check_without_a_bundle_exits_1(agent_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(agent_config())]) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "FAIL  bundles.dir" in out and "FAIL  no current bundle" in out and "edgekit-agent install" in out
    assert out.rstrip().endswith("problem(s)")


def test_install_then_check_passes(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = agent_config()
    assert main(["install", str(signed_bundle("tiny-a")), "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "deploy_progress: self check passed" in out and "deploy_result: deployed tiny-a" in out
    assert main(["check", "--config", str(config), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["problems"] == []
    assert any(line.startswith("current bundle tiny-a: signed by") and "self-check passed" in line for line in report["passed"])
    assert any("power sensor none" in line for line in report["passed"])
    assert "no previous bundle" in " ".join(report["warnings"])


def test_install_refuses_an_unsigned_bundle(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["install", str(signed_bundle("tiny-u", sign=False)), "--config", str(agent_config())]) == EXIT_PROBLEMS
    assert "is not signed" in capsys.readouterr().out


def test_check_reports_a_broken_current_bundle_and_a_missing_sensor(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = agent_config(power={"sensor": "ina3221", "root": str(tmp_path / "fake-root")})
    assert main(["install", str(signed_bundle("tiny-a")), "--config", str(config)]) == EXIT_OK
    current = tmp_path / "bundles" / "current"
    (current / "golden" / "outputs_000.npz").write_bytes(b"garbage")
    capsys.readouterr()
    assert main(["check", "--config", str(config)]) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "FAIL  current bundle" in out and "modified: golden/outputs_000.npz" in out
    assert "FAIL  power sensor 'ina3221' is unavailable" in out


def test_console_script_exit_codes(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    assert AGENT_SCRIPT.exists(), "pip install -e runtime creates the edgekit-agent script"
    bad = subprocess.run([str(AGENT_SCRIPT), "check", "--config", str(tmp_path / "absent.yaml")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == EXIT_CONFIG and "does not exist" in bad.stderr


def test_run_serves_until_sigterm_then_stops_cleanly(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], tmp_path: Path
) -> None:
    socket_path = tmp_path / "run" / "agent.sock"
    config = agent_config(api={"address": f"unix:{socket_path}"})
    assert main(["install", str(signed_bundle("tiny-a")), "--config", str(config)]) == EXIT_OK
    process = subprocess.Popen([str(AGENT_SCRIPT), "run", "--config", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        client = AgentClient(f"unix:{socket_path}", timeout_s=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                health = client.health()
                break
            except AgentApiError:
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read() if process.stderr else ""
                time.sleep(0.1)
        assert health["status"] == "ok" and health["model"] == "tiny-a"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == EXIT_OK, stderr
    assert "received SIGTERM; stopping" in stderr and "agent stopped" in stderr
    assert not socket_path.exists()
