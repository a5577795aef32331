"""The agent reports what it is: identity, detected target and power mode in its retained status (real
Mosquitto on 127.0.0.1:1883) and in /v1/health; a power mode change republishes the status."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent_service.test_agent_service_mqtt import Listener, broker_up

IDENTITY = Path(__file__).resolve().parents[1] / "sensors" / "fixtures" / "identity"

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")


def _agent_on_the_broker(agent_config: Callable[..., Path], tmp_path: Path, root: Path) -> tuple[AgentService, Listener]:
    """A started agent that reads the board at ``root``, on the test broker, and a listener for its messages."""
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    listener = Listener(fleet, device)
    config = load_config(agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        power={"sensor": "none", "root": str(root)},
        telemetry={"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
    ))  # fmt: skip
    return AgentService(config).start(), listener


def test_status_and_health_carry_identity_and_follow_the_power_mode(agent_config: Callable[..., Path],
                                                                      tmp_path: Path) -> None:  # fmt: skip
    root = tmp_path / "board"
    shutil.copytree(IDENTITY / "jetson_orin_nano_super_jp62", root, symlinks=True)
    service, listener = _agent_on_the_broker(agent_config, tmp_path, root)
    try:
        online = listener.next("status", lambda m: m["state"] == "online")
        validate_message(online, "status.v1")
        assert online["target"]["name"] == "jetson-orin-nano-super"
        assert "nvpmodel mode MAXN_SUPER offered (/etc/nvpmodel.conf)" in online["target"]["evidence"]
        identity = online["identity"]
        assert identity["board"] == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
        assert (identity["l4t"], identity["jetpack"], identity["cuda"]) == ("36.4.3", "6.2", "12.6.68")
        assert identity["cpu"] == {"arch": "arm64", "model": "Cortex-A78AE", "cores": 6,
                                   "isa_flags": ["asimd", "asimdhp", "asimddp"]}  # fmt: skip
        assert (online["power_mode"]["name"], online["power_mode"]["clocks_locked"]) == ("MAXN_SUPER", True)

        health = AgentClient(service.api_address).health()
        assert health["target"]["name"] == "jetson-orin-nano-super"
        assert health["identity"]["soc"] == "nvidia,tegra234"
        assert health["power_mode"]["id"] == 2

        # `nvpmodel -m 3` (7W) and clocks released: the next telemetry window re-reads them and the
        # retained status follows, identity unchanged.
        (root / "var/lib/nvpmodel/status").write_text("pmode:0003 fmode:quiet\n")
        (root / "sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq").write_text("729600\n")
        window = service.publish_telemetry()  # measured in MAXN_SUPER+clocks, then the mode changed
        assert window["power_mode"] == "MAXN_SUPER+clocks"
        assert {"code": "power_mode.changed", "message": "power mode changed from MAXN_SUPER+clocks to 7W during this "
                "window (nvpmodel -m or jetson_clocks)"} in window["errors"]  # fmt: skip
        following = service.publish_telemetry()
        assert following["power_mode"] == "7W" and not any(e["code"] == "power_mode.changed" for e in following["errors"])
        validate_message(following, "telemetry.v1")
        changed = listener.next("status", lambda m: m["state"] == "online" and m["power_mode"]["id"] == 3)
        assert (changed["power_mode"]["name"], changed["power_mode"]["clocks_locked"]) == ("7W", False)
        assert changed["identity"] == identity
        assert AgentClient(service.api_address).health()["power_mode"]["name"] == "7W"
    finally:
        service.stop()
        listener.close()
    offline = listener.next("status", lambda m: m["state"] == "offline")
    assert offline["target"]["name"] == "jetson-orin-nano-super" and offline["power_mode"]["name"] == "7W"


def test_onnxruntime_providers_are_reported_once_a_model_has_loaded(agent_config: Callable[..., Path], tmp_path: Path,
                                                                    signed_bundle: Callable[..., Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The identity is read at start without importing onnxruntime (its version from the distribution's metadata),
    so its providers come once a model has loaded it: in /v1/health and in the retained status."""
    import onnxruntime

    from edgekit_runtime.agent import service as service_module
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.sensors.identity import PythonEnvironment, read_identity

    # what the live root reads before onnxruntime is imported: a version, no providers yet (a fixture tree, not /)
    metadata_only = PythonEnvironment(lambda name: "1.20.1" if name == "onnxruntime" else None, list)
    monkeypatch.setattr(service_module, "read_identity", lambda root: read_identity(root, python=metadata_only))
    fleet, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    listener = Listener(fleet, device)
    config = load_config(agent_config(
        fleet=fleet, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        power={"sensor": "none", "root": str(IDENTITY / "x86_server")},
        telemetry={"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
    ))  # fmt: skip
    try:
        service = AgentService(config).start()
        try:
            health = AgentClient(service.api_address).health()
            assert health["status"] == "no_model"
            assert health["identity"]["onnxruntime"] == {"version": "1.20.1", "providers": []}
        finally:
            service.stop()
        assert agent_main(["install", str(signed_bundle("tiny-a")), "--config", str(config.source)]) == 0
        service = AgentService(config).start()
        try:
            providers = onnxruntime.get_available_providers()
            assert "CPUExecutionProvider" in providers
            online = listener.next("status", lambda m: m["state"] == "online" and m.get("bundle") is not None)
            validate_message(online, "status.v1")
            assert online["identity"]["onnxruntime"] == {"version": "1.20.1", "providers": providers}
            assert AgentClient(service.api_address).health()["identity"]["onnxruntime"]["providers"] == providers
        finally:
            service.stop()
    finally:
        listener.close()


def test_a_many_core_server_with_a_cpufreq_policy_a_core_goes_online(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    """intel_pstate (and many-core Arm servers) give each core its own cpufreq policy: 64 clock domains, past the 32
    that status.v1 holds, so the status (and the will) failed its check and the agent never connected. Now the
    policies that share a range are reported as one domain; clocks_locked still counts every one."""
    root = tmp_path / "server"
    for core in range(64):
        policy = root / "sys/devices/system/cpu/cpufreq" / f"policy{core}"
        policy.mkdir(parents=True)
        (policy / "scaling_min_freq").write_text("800000\n")
        (policy / "scaling_max_freq").write_text(("3900000" if core < 16 else "2900000") + "\n")  # performance and efficient cores
    service, listener = _agent_on_the_broker(agent_config, tmp_path, root)
    try:
        online = listener.next("status", lambda m: m["state"] == "online")
        validate_message(online, "status.v1")
        assert online["power_mode"]["clocks"] == [
            {"domain": "cpu:policy0-15", "min_khz": 800000.0, "max_khz": 3900000.0},
            {"domain": "cpu:policy16-63", "min_khz": 800000.0, "max_khz": 2900000.0},
        ]
        assert online["power_mode"]["clocks_locked"] is False
    finally:
        service.stop()
        listener.close()
    assert listener.next("status", lambda m: m["state"] == "offline")["power_mode"]["clocks"][0]["domain"] == "cpu:policy0-15"
