"""The zero-setup stack: the embedded amqtt broker with simulated devices, and `edgekit fleet up` parts."""

from __future__ import annotations

import inspect
import json
import time
import urllib.request

import pytest

from edgekit.fleet.embedded_broker import EmbeddedBroker, EmbeddedBrokerError
from edgekit.fleet.local_stack import LocalStack, LocalStackConfig
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig, SimulationError
from tests.runtime.agent.mosquitto import free_port, mosquitto, mosquitto_factory  # noqa: F401 (fixtures)

pytest.importorskip("amqtt", reason="amqtt is not installed (pip install amqtt)")


def _subscriber(url_port: int, topics: list[str], received: list) -> object:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv311)
    client.on_message = lambda c, u, m: received.append((m.topic, json.loads(m.payload)))
    client.connect("127.0.0.1", url_port)
    client.loop_start()
    client.subscribe([(t, 1) for t in topics])
    time.sleep(0.3)
    return client


def test_embedded_broker_carries_qos1_retained_status_and_wills() -> None:
    with EmbeddedBroker(port=0) as broker:
        config = SimulationConfig(broker.url, devices=2, rate_per_s=10.0, mqtt_version=broker.mqtt_version)
        received: list = []
        client = _subscriber(broker.port, ["edgekit/v1/#"], received)
        with FleetSimulator(config) as simulator:
            time.sleep(0.6)
            victim = sorted(simulator.agents)[0]
            simulator.crash(victim)
            time.sleep(0.5)
            assert simulator.flush(5)
        client.disconnect()
        late: list = []
        late_client = _subscriber(broker.port, ["edgekit/v1/+/+/status"], late)  # retained status arrives on subscribe
        late_client.disconnect()
    telemetry = [p for t, p in received if t.endswith("/telemetry")]
    assert len(telemetry) >= 6 and all(p["schema"] == "edgekit.telemetry/1" for p in telemetry)
    wills = [p for t, p in received if t.endswith(f"{victim}/status") and p["state"] == "offline"]
    assert wills and wills[0]["reason"] == "connection lost"
    assert {p["device"] for _, p in late} == set(simulator.agents) and all(p["state"] == "offline" for _, p in late)


def test_mqtt5_clients_are_refused_by_the_embedded_broker_with_a_hint() -> None:
    with EmbeddedBroker(port=0) as broker:
        with pytest.raises(SimulationError, match="amqtt speaks only 3.1.1"):
            FleetSimulator(SimulationConfig(broker.url, devices=1)).start(wait_s=2.0)


def test_embedded_broker_port_in_use_is_explained() -> None:
    with EmbeddedBroker(port=0) as first:
        with pytest.raises(EmbeddedBrokerError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            EmbeddedBroker(port=first.port).start()


def _wait_devices(url: str, count: int, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        data = json.loads(urllib.request.urlopen(url + "api/devices", timeout=5).read())
        if sum(1 for d in data["devices"] if d["windows"] > 0) >= count or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def test_local_stack_on_a_given_broker_shows_simulated_devices(mosquitto, tmp_path) -> None:  # noqa: F811
    config = LocalStackConfig(broker_url=mosquitto.url, store_url=f"sqlite:///{tmp_path}/fleet.db", dashboard_port=0,
                              simulate=3, simulate_rate_per_s=5.0)  # fmt: skip
    with LocalStack(config) as stack:
        data = _wait_devices(stack.dashboard_url, 3)
    assert len(data["devices"]) == 3 and all(d["state"] == "online" and d["target"] for d in data["devices"])
    assert stack.dashboard is None and stack.collector is None  # all taken down


def test_local_stack_with_the_embedded_broker(tmp_path) -> None:
    from edgekit.fleet.collector import Collector

    config = LocalStackConfig(broker_port=free_port(), store_url=f"sqlite:///{tmp_path}/fleet.db", dashboard_port=0,
                              simulate=2, simulate_rate_per_s=5.0)  # fmt: skip
    if "mqtt_version" not in inspect.signature(Collector).parameters:
        with pytest.raises(EmbeddedBrokerError, match="the collector speaks only MQTT 5"):
            LocalStack(config).start()
        return
    with LocalStack(config) as stack:
        assert stack.mqtt_version == "3.1.1"
        data = _wait_devices(stack.dashboard_url, 2)
    assert len(data["devices"]) == 2
