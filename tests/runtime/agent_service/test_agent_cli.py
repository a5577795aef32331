"""``edgekit-agent check`` and ``install``: exit codes and what they print."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit_runtime.agent.cli import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEMS, main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.errors import AgentApiError
from tests.runtime.agent.mosquitto import (  # noqa: F401 (pytest fixtures)
    MosquittoBroker,
    free_port,
    make_tls_files,
    mosquitto,
    mosquitto_factory,
    write_password_file,
)

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
    captured = capsys.readouterr()
    assert "deploy_progress: self check passed" in captured.err  # progress on stderr
    assert "deploy_result: deployed tiny-a" in captured.out and "deploy_progress" not in captured.out  # the outcome on stdout
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


# -- the broker check: a real connection ----------------------------------------------------------


def _check(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "--config", str(config), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def _secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def test_check_connects_to_the_broker(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], mosquitto: MosquittoBroker,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = agent_config(broker={"url": mosquitto.url})
    assert main(["install", str(signed_bundle("tiny-a")), "--config", str(config)]) == EXIT_OK
    capsys.readouterr()
    code, report = _check(config, capsys)
    assert code == EXIT_OK, report
    assert f"broker {mosquitto.url} accepted the connection (no TLS)" in report["passed"]
    assert "edgekit-lab-dev-1-check-" in mosquitto.log()  # its own client id: a running agent keeps its session
    assert main(["check", "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"ok    broker {mosquitto.url} accepted the connection" in out and out.rstrip().endswith("all checks passed")


def test_check_fails_on_a_port_where_nothing_listens(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"mqtt://127.0.0.1:{free_port()}"
    config = agent_config(broker={"url": dead})
    assert main(["install", str(signed_bundle("tiny-a")), "--config", str(config)]) == EXIT_OK
    capsys.readouterr()
    started = time.monotonic()
    assert main(["check", "--config", str(config)]) == EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert time.monotonic() - started < 30
    assert f"FAIL  broker 127.0.0.1:{dead.rsplit(':', 1)[1]} refused the TCP connection (nothing listening?)" in out
    assert "check that the broker is running" in out and "all checks passed" not in out
    assert out.rstrip().endswith("1 problem(s)")


def test_check_times_out_on_a_port_that_never_answers(agent_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as silent:  # accepts TCP (the kernel's backlog) but never speaks MQTT
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        started = time.monotonic()
        code, report = _check(agent_config(broker={"url": f"mqtt://127.0.0.1:{port}"}), capsys, "--broker-timeout-s", "1")
        assert time.monotonic() - started < 15
    assert code == EXIT_PROBLEMS
    assert any(f"broker mqtt://127.0.0.1:{port} accepted the TCP connection but sent no CONNACK within 1 s" in line
               for line in report["problems"]), report  # fmt: skip


def test_check_rejects_a_bad_timeout(agent_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(agent_config()), "--broker-timeout-s", "0"]) == EXIT_CONFIG
    assert "--broker-timeout-s must be positive, got 0" in capsys.readouterr().err


def test_check_logs_in_with_the_configured_credentials(
    agent_config: Callable[..., Path], mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker = mosquitto_factory(password_file=write_password_file(tmp_path / "passwd", {"dev-1": "right-pass"}))
    good = agent_config(broker={"url": broker.url, "username": "dev-1", "password_file": _secret(tmp_path / "pw", "right-pass")})
    _, report = _check(good, capsys)
    # issue 28: a password over mqtt:// is a warning even on loopback, never "ok"
    assert any(line.startswith(f"broker {broker.url} accepted the connection as dev-1 (no TLS)") and "clear text" in line
               for line in report["warnings"]), report  # fmt: skip
    bad = agent_config(broker={"url": broker.url, "username": "dev-1", "password_file": _secret(tmp_path / "pw-bad", "wrong")})
    code, report = _check(bad, capsys)
    assert code == EXIT_PROBLEMS
    (problem,) = [line for line in report["problems"] if "broker" in line]
    assert f"broker {broker.url} refused the login: " in problem and "check broker.username, broker.password_file" in problem
    assert "Bad user name or password" in problem or "Not authorized" in problem
    anonymous = agent_config(broker={"url": broker.url})
    _, report = _check(anonymous, capsys)
    assert any("refused the login" in line for line in report["problems"]), report


def test_check_verifies_the_brokers_tls_certificate(
    agent_config: Callable[..., Path], mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    tls = make_tls_files(tmp_path / "tls")
    broker = mosquitto_factory(tls=tls)
    _, report = _check(agent_config(broker={"url": broker.url, "tls": {"ca": str(tls.ca_cert)}}), capsys)
    assert f"broker {broker.url} accepted the connection (TLS verified)" in report["passed"], report
    other = make_tls_files(tmp_path / "other-tls", ca_name="someone else's CA")
    code, report = _check(agent_config(broker={"url": broker.url, "tls": {"ca": str(other.ca_cert)}}), capsys)
    assert code == EXIT_PROBLEMS
    assert any(f"TLS certificate of broker 127.0.0.1:{broker.port} was rejected" in line and "check that tls_ca" in line
               for line in report["problems"]), report  # fmt: skip
    plain = mosquitto_factory()  # mqtts:// to a plain listener: the TLS handshake fails
    code, report = _check(agent_config(broker={"url": f"mqtts://127.0.0.1:{plain.port}", "tls": {"ca": str(tls.ca_cert)}}), capsys,
                          "--broker-timeout-s", "3")  # fmt: skip
    assert code == EXIT_PROBLEMS
    assert any("TLS handshake with broker" in line or "timed out" in line for line in report["problems"]), report
