"""Broker URL, TLS files and password file: every bad setting is refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit_runtime.agent.broker import BrokerAddress, make_tls_context, parse_broker_url, read_password_file
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.topics import TelemetryError


def test_urls_and_default_ports() -> None:
    assert parse_broker_url("mqtt://broker.lan") == BrokerAddress("broker.lan", 1883, False)
    assert parse_broker_url("mqtts://broker.lan") == BrokerAddress("broker.lan", 8883, True)
    assert parse_broker_url("mqtts://10.0.0.5:9883/") == BrokerAddress("10.0.0.5", 9883, True)
    assert parse_broker_url("mqtt://[::1]:1884").host == "::1"
    assert parse_broker_url("mqtts://h:1").url == "mqtts://h:1"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("tcp://broker:1883", r"has scheme 'tcp'; only mqtt and mqtts are supported"),
        ("ws://broker", r"has scheme 'ws'"),
        ("broker:1883", r"has scheme 'broker'"),
        ("mqtt://user:pw@broker", r"carries credentials"),
        ("mqtt://broker/topic", r"has a path, query or fragment"),
        ("mqtt://broker:99999", r"has an invalid port"),
        ("mqtt://:1883", r"has no host"),
    ],
)
def test_bad_urls_are_refused(url: str, expected: str) -> None:
    with pytest.raises(TelemetryError, match=expected) as info:
        parse_broker_url(url)
    assert "hint:" in str(info.value)


def test_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\nignored second line\n")
    secret.chmod(0o600)
    assert read_password_file(secret) == "s3cret"
    with pytest.raises(TelemetryError, match=r"cannot read password_file .*missing: No such file"):
        read_password_file(tmp_path / "missing")
    (tmp_path / "empty").write_text("")
    with pytest.raises(TelemetryError, match=r"password_file .*empty is empty"):
        read_password_file(tmp_path / "empty")


def test_tls_files_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TelemetryError, match=r"tls_cert and tls_key go together"):
        make_tls_context(None, tmp_path / "c.pem", None)
    with pytest.raises(TelemetryError, match=r"tls_ca file .*nope\.pem does not exist"):
        make_tls_context(tmp_path / "nope.pem", None, None)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TelemetryError, match=r"tls_ca .*garbage\.pem is not a PEM CA certificate"):
        make_tls_context(garbage, None, None)
    context = make_tls_context(None, None, None)  # system CAs, host name checked
    assert context.check_hostname


def test_link_settings_are_checked(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        def link(**kwargs: object) -> MqttLink:
            arguments: dict = {"broker_url": "mqtt://127.0.0.1:1883", "client_id": "dev-1", "fleet": "lab",
                               "device": "dev-1", "spool": spool, **kwargs}  # fmt: skip
            return MqttLink(**arguments)

        with pytest.raises(TelemetryError, match=r"TLS files were given but the broker URL .* is plain mqtt://"):
            link(tls_ca=tmp_path / "ca.pem")
        with pytest.raises(TelemetryError, match=r"password_file was given without a username"):
            link(password_file=tmp_path / "pw")
        with pytest.raises(TelemetryError, match=r"client_id must be a non-empty string"):
            link(client_id="")
        with pytest.raises(TelemetryError, match=r"keepalive_s must be an int >= 1, got 0"):
            link(keepalive_s=0)
        with pytest.raises(TelemetryError, match=r"device id 'a#b' contains '#'"):
            link(device="a#b")
        with pytest.raises(TelemetryError, match=r"has scheme 'http'"):
            link(broker_url="http://127.0.0.1")
