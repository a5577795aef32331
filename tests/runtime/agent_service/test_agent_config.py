"""The agent's YAML configuration: valid files load into typed data, every mistake names file, key and fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from edgekit_runtime.agent.config import ApiAddress, load_config, parse_api_address
from edgekit_runtime.agent.errors import AgentConfigError

REPO = Path(__file__).resolve().parents[3]


def test_valid_config_loads_with_defaults_and_resolved_paths(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    path = agent_config(bundles={"dir": "bundles", "allow_unsigned": True})
    config = load_config(path)
    assert config.device_id == "dev-1" and config.fleet == "lab"
    assert config.bundles.dir == tmp_path / "bundles"  # relative to the config file
    assert config.bundles.allow_unsigned is True and config.bundles.public_key is None
    assert config.broker is None and config.batching is None and config.probe is None
    assert config.api.address == ApiAddress(host="127.0.0.1", port=0)
    assert config.power.sensor == "none" and config.telemetry.interval_s == 60.0
    assert config.health.max_error_rate == 0.1


def test_example_config_is_valid(tmp_path: Path) -> None:
    text = (REPO / "runtime" / "agent.example.yaml").read_text(encoding="utf-8")
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("ca.pem", "device.pem", "device.key", "mqtt-password", "fleet.pub.pem"):
        (etc / name).write_text("x", encoding="utf-8")
    path = tmp_path / "agent.yaml"
    path.write_text(text.replace("/etc/edgekit/", f"{etc}/").replace("/var/lib/edgekit/", f"{tmp_path}/var/"), encoding="utf-8")
    config = load_config(path)
    assert config.broker is not None and config.broker.uses_tls and config.broker.tls.key == etc / "device.key"
    assert config.telemetry.spool.path == tmp_path / "var" / "spool.db"
    assert config.health.min_requests == 20


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"brokr": {"url": "mqtt://127.0.0.1"}}, ["brokr: is not a known key", "did you mean 'broker'"]),
        ({"broker": {"url": "mqtt://127.0.0.1", "keepalive": 30}}, ["broker.keepalive: is not a known key", "did you mean 'broker.keepalive_s'"]),
        ({"broker": {"url": "http://broker:1883"}}, ["broker.url: 'http://broker:1883' must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT]"]),
        ({"broker": {"url": "mqtt://b", "tls": {"ca": "/nonexistent/ca.pem"}}}, ["broker.tls: is set but broker.url uses mqtt://", "use mqtts://"]),
        ({"broker": {"url": "mqtts://b", "tls": {"ca": "/nonexistent/ca.pem"}}}, ["broker.tls.ca: file '/nonexistent/ca.pem' does not exist"]),
        ({"broker": {"url": "mqtt://b", "password_file": "pw"}}, ["broker.password_file: is set without broker.username"]),
        ({"device_id": None}, ["device_id: is required", "e.g. device_id: jetson-07"]),
        ({"device_id": "a/b"}, ["device_id: 'a/b' may only hold letters, digits"]),
        ({"api": {"address": "0.0.0.0:8470"}}, ["api.address: '0.0.0.0:8470' is not a loopback address", "SSH port forwarding"]),
        ({"api": {"address": "192.168.1.5:8470"}}, ["is not a loopback address"]),
        ({"api": {"address": "unix:relative.sock"}}, ["Unix socket path 'relative.sock' must be absolute"]),
        # bind() takes 107 bytes: before, the agent started and failed to listen with a hint about another process
        ({"api": {"address": "unix:/run/" + "d" * 120 + "/agent.sock"}}, ["is 136 bytes; the system takes at most 107 (sun_path)"]),
        ({"bundles": {"dir": "b"}}, ["bundles.public_key: is required", "edgekit keygen --out DIR"]),
        ({"bundles": {"dir": "b", "public_key": "missing.pem"}}, ["bundles.public_key: file", "missing.pem' does not exist"]),
        ({"bundles": {"dir": "b", "allow_unsigned": "yes"}}, ["bundles.allow_unsigned: expected true or false, got 'yes'"]),
        ({"power": {"sensor": "ina3211"}}, ["power.sensor: unknown sensor 'ina3211'", "did you mean 'ina3221'?"]),
        ({"health": {"max_error_rate": 2}}, ["health.max_error_rate: expected a number >= 0 and <= 1, got 2"]),
        ({"telemetry": {"interval_s": 0, "spool": {"path": "s.db"}}}, ["telemetry.interval_s: expected a number > 0 and <= 86400, got 0"]),
        ({"telemetry": {"interval_s": 5}}, ["telemetry.spool.path: is required"]),
        ({"batching": {"max_batch": 0, "max_delay_ms": 1}}, ["batching.max_batch: expected an integer >= 1, got 0"]),
        ({"probe": {"interval_s": 5, "dims": {"batch": 0}}}, ["probe.dims.batch: expected an integer >= 1, got 0"]),
        ({"power": ["auto"]}, ["power: must be a mapping of keys, got list"]),
    ],
)
def test_config_errors_name_file_key_and_fix(agent_config: Callable[..., Path], overrides: dict, expected: list[str]) -> None:
    path = agent_config(**overrides)
    with pytest.raises(AgentConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(str(path.resolve())), text
    for fragment in expected:
        assert fragment in text, text


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="agent configuration '.*nope.yaml' does not exist") as info:
        load_config(tmp_path / "nope.yaml")
    assert "agent.example.yaml" in str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("device_id: [unclosed\n", encoding="utf-8")
    with pytest.raises(AgentConfigError, match=r"broken.yaml:2:1: YAML syntax error"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump(["a"]), encoding="utf-8")
    with pytest.raises(AgentConfigError, match="top level: must be a mapping"):
        load_config(listed)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8470", ApiAddress(host="127.0.0.1", port=8470)),
        ("localhost:9000", ApiAddress(host="127.0.0.1", port=9000)),
        ("[::1]:8470", ApiAddress(host="::1", port=8470)),
        ("127.1.2.3:1", ApiAddress(host="127.1.2.3", port=1)),
        ("unix:/run/edgekit/agent.sock", ApiAddress(unix_path=Path("/run/edgekit/agent.sock"))),
    ],
)
def test_api_addresses_accepted(text: str, expected: ApiAddress) -> None:
    assert parse_api_address(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("0.0.0.0:8470", "not a loopback"), ("[::]:8470", "not a loopback"), ("example.com:80", "not a loopback"),
     ("127.0.0.1", "is not HOST:PORT"), ("127.0.0.1:70000", "out of range")],
)  # fmt: skip
def test_api_addresses_refused(text: str, fragment: str) -> None:
    with pytest.raises(AgentConfigError, match=fragment):
        parse_api_address(text)


_POSITIONED = """\
device_id: dev-1
fleet: lab
bundles:
  dir: bundles
  allow_unsigned: true
  max_download_mb: {max_download_mb}
models:
  names: [detector, {second_model}]
power:
  {power_key}: none
telemetry:
  spool: {{path: spool.db}}
"""


@pytest.mark.parametrize(
    ("values", "where", "fragment"),
    [
        ({"max_download_mb": "-3"}, ":6:3: bundles.max_download_mb: expected a number >= 0.001, got -3", None),
        ({"second_model": "'bad name'"}, ":8:21: models.names[1]: 'bad name' is not a model name", None),
        ({"power_key": "sensr"}, ":10:3: power.sensr: is not a known key", "did you mean 'power.sensor'"),
    ],
)
def test_config_errors_carry_line_and_column(tmp_path: Path, values: dict[str, str], where: str, fragment: str | None) -> None:
    """Like recipe errors, agent config errors say FILE:LINE:COLUMN of the key they are about (issue 32 item 8)."""
    fields = {"max_download_mb": "64", "second_model": "keywords", "power_key": "sensor", **values}
    path = tmp_path / "agent.yaml"
    path.write_text(_POSITIONED.format(**fields), encoding="utf-8")
    with pytest.raises(AgentConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path.resolve()}{where}"), text
    assert fragment is None or fragment in text, text


def test_missing_key_points_at_its_section(tmp_path: Path) -> None:
    """A required key that is absent is placed at the section that should hold it."""
    path = tmp_path / "agent.yaml"
    path.write_text("device_id: dev-1\nfleet: lab\nbundles:\n  allow_unsigned: true\n", encoding="utf-8")
    with pytest.raises(AgentConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path.resolve()}:3:1: bundles.dir: is required"), str(info.value)
