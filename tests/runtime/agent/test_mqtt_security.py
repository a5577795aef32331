"""TLS with CA verification, username + password file, and the shipped ACL template, on a real Mosquitto."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.broker import BrokerConnectionError
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from tests.runtime.agent.mosquitto import (
    ACL_TEMPLATE,
    MessageRecorder,
    MosquittoBroker,
    make_ca,
    make_tls_files,
    render_acl_template,
    write_password_file,
)
from tests.runtime.agent.sample_messages import sample_telemetry

FLEET = "lab"
PASSWORDS = {"dev-a": "pass-a", "dev-b": "pass-b", "collector": "pass-collector"}


def _link(url: str, spool: Spool, device: str = "dev-a", **kwargs: Any) -> MqttLink:
    return MqttLink(url, device, FLEET, device, spool=spool, backoff=Backoff(initial_s=0.1, max_s=0.3),
                    keepalive_s=5, **kwargs)  # fmt: skip


def _secret(path: Path, password: str) -> Path:
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


def test_tls_with_the_right_ca_delivers(mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    broker = mosquitto_factory(tls=tls)
    assert broker.url.startswith("mqtts://127.0.0.1:")
    with MessageRecorder(broker) as recorder, Spool(tmp_path / "spool.db") as spool:
        with _link(broker.url, spool, tls_ca=tls.ca_cert) as link:
            link.wait_connected(10)
            link.publish_telemetry(sample_telemetry(spool.next_seq(), device="dev-a"))
            assert recorder.wait_for(lambda ms: any(m.topic.endswith("/telemetry") for m in ms))
            assert link.flush(5)
        assert recorder.on("/telemetry")[0].json()["seq"] == 1  # type: ignore[index]


def test_tls_with_a_wrong_ca_fails_clearly(mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    broker = mosquitto_factory(tls=tls)
    other_ca, _ = make_ca(tmp_path / "other", "some other CA")
    with Spool(tmp_path / "spool.db") as spool:
        with _link(broker.url, spool, tls_ca=other_ca) as link:
            with pytest.raises(BrokerConnectionError) as info:
                link.wait_connected(1.5)
            assert not link.connected
            assert spool.backlog() == 0
    text = str(info.value)
    assert f"TLS certificate of broker 127.0.0.1:{broker.port} was rejected: unable to get local issuer certificate" \
        in text  # fmt: skip
    assert "check that tls_ca is the CA that signed the broker's certificate" in text


def test_tls_url_against_a_plain_listener_fails_clearly(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory()
    tls = make_tls_files(tmp_path / "tls")
    with Spool(tmp_path / "spool.db") as spool:
        with _link(f"mqtts://127.0.0.1:{broker.port}", spool, tls_ca=tls.ca_cert, connect_timeout_s=2) as link:
            with pytest.raises(BrokerConnectionError) as info:
                link.wait_connected(1.5)
    assert re.search(r"TLS handshake with broker 127\.0\.0\.1:\d+ failed", str(info.value))
    assert "TLS listener (mqtts)" in str(info.value)


def test_username_and_password_file(mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path) -> None:
    broker = mosquitto_factory(password_file=write_password_file(tmp_path / "passwd", PASSWORDS))
    with Spool(tmp_path / "good.db") as spool:
        with _link(broker.url, spool, username="dev-a", password_file=_secret(tmp_path / "pw-a", "pass-a")) as link:
            link.wait_connected(10)
            assert link.connected
    with Spool(tmp_path / "bad.db") as spool:
        with _link(broker.url, spool, username="dev-a", password_file=_secret(tmp_path / "pw-x", "wrong")) as link:
            with pytest.raises(BrokerConnectionError) as info:
                link.wait_connected(1.5)
    text = str(info.value)
    assert f"broker {broker.url} refused the connection:" in text
    assert "Not authorized" in text or "Bad user name or password" in text
    assert "check username, password_file" in text


def test_acl_template_keeps_each_device_on_its_own_topics(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    acl = render_acl_template(tmp_path / "edgekit.acl", collector_user="collector")
    assert "@COLLECTOR_USER@" in ACL_TEMPLATE.read_text() and "@COLLECTOR_USER@" not in acl.read_text()
    broker = mosquitto_factory(password_file=write_password_file(tmp_path / "passwd", PASSWORDS), acl_file=acl)
    pw_a = _secret(tmp_path / "pw-a", "pass-a")
    with MessageRecorder(broker, username="collector", password="pass-collector") as collector:
        # dev-a on its own topics: delivered.
        with Spool(tmp_path / "a.db") as spool, _link(broker.url, spool, username="dev-a", password_file=pw_a) as link:
            link.wait_connected(10)
            link.publish_telemetry(sample_telemetry(spool.next_seq(), device="dev-a"))
            assert collector.wait_for(lambda ms: any(m.topic == "edgekit/v1/lab/dev-a/telemetry" for m in ms))
        # dev-a's credentials claiming to be dev-b: the broker refuses, the link drops and counts it.
        with Spool(tmp_path / "b.db") as spool:
            with _link(broker.url, spool, device="dev-b", username="dev-a", password_file=pw_a) as impostor:
                impostor.wait_connected(10)
                impostor.publish_telemetry(sample_telemetry(spool.next_seq(), device="dev-b"))
                assert impostor.flush(5)
                counters = impostor.counters
        assert counters.rejected == 1 and counters.acked == 0

        # A raw client logged in as dev-a: publishing on dev-b's topic gets "Not authorized", and
        # commands for dev-b never reach it, while its own commands do.
        acks: list[tuple[int, str]] = []
        received: list[str] = []
        own_command = threading.Event()
        subscribed = threading.Event()
        raw = paho.Client(CallbackAPIVersion.VERSION2, client_id="raw-dev-a", protocol=MQTTProtocolVersion.MQTTv5)
        raw.username_pw_set("dev-a", "pass-a")
        raw.on_publish = lambda client, userdata, mid, reason, properties: acks.append((mid, str(reason)))
        raw.on_subscribe = lambda client, userdata, mid, reasons, properties: subscribed.set()

        def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
            received.append(message.topic)
            if message.topic.endswith("/dev-a/cmd"):
                own_command.set()

        raw.on_message = on_message
        raw.connect(broker.host, broker.port)
        raw.loop_start()
        try:
            denied = raw.publish("edgekit/v1/lab/dev-b/telemetry", json.dumps({"seq": 99}), qos=1)
            allowed = raw.publish("edgekit/v1/lab/dev-a/events", b"{}", qos=1)
            denied.wait_for_publish(5)
            allowed.wait_for_publish(5)
            raw.subscribe([("edgekit/v1/lab/dev-b/cmd", 1), ("edgekit/v1/lab/dev-a/cmd", 1)])
            assert subscribed.wait(5)
            collector.client.publish("edgekit/v1/lab/dev-b/cmd", b'{"for": "b"}', qos=1).wait_for_publish(5)
            collector.client.publish("edgekit/v1/lab/dev-a/cmd", b'{"for": "a"}', qos=1).wait_for_publish(5)
            assert collector.wait_for(lambda ms: any(m.topic == "edgekit/v1/lab/dev-a/events" for m in ms))
            assert own_command.wait(5)
            time.sleep(0.3)  # time for a wrongly routed dev-b command to show up
        finally:
            raw.disconnect()
            raw.loop_stop()
        assert dict(acks) == {denied.mid: "Not authorized", allowed.mid: "Success"}
        assert received == ["edgekit/v1/lab/dev-a/cmd"]
        assert not [m for m in collector.messages if m.topic.startswith("edgekit/v1/lab/dev-b/") and
                    not m.topic.endswith("/cmd")]  # fmt: skip


def _publish_reasons(broker: MosquittoBroker, username: str, password: str, topic: str) -> str:
    """Publish one QoS 1 message as ``username`` and return the broker's PUBACK reason ("Success", "Not authorized")."""
    reasons: dict[int, str] = {}
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{username}", protocol=MQTTProtocolVersion.MQTTv5)
    client.username_pw_set(username, password)
    client.on_publish = lambda c, userdata, mid, reason, properties: reasons.__setitem__(mid, str(reason))
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        info = client.publish(topic, b'{"schema": "edgekit.alert/1", "status": "firing"}', qos=1)
        info.wait_for_publish(5)
        deadline = time.monotonic() + 5
        while info.mid not in reasons and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        client.disconnect()
        client.loop_stop()
    return reasons.get(info.mid, "no PUBACK")


def test_acl_template_lets_the_collector_publish_alerts_and_an_alerts_user_read_them(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    acl = render_acl_template(tmp_path / "edgekit.acl", collector_user="collector")
    text = acl.read_text()
    assert "#user @ALERTS_USER@\n#topic read edgekit/v1/+/alerts\n" in text  # optional, off until uncommented
    acl.write_text(text.replace("#user @ALERTS_USER@", "user alerts").replace("#topic read edgekit/v1/+/alerts",
                                                                                 "topic read edgekit/v1/+/alerts"))  # fmt: skip
    broker = mosquitto_factory(password_file=write_password_file(tmp_path / "passwd", {**PASSWORDS, "alerts": "pass-alerts"}),
                               acl_file=acl)  # fmt: skip
    with MessageRecorder(broker, ("edgekit/v1/+/alerts",), username="alerts", password="pass-alerts") as reader, \
            MessageRecorder(broker, username="collector", password="pass-collector") as collector:  # fmt: skip
        assert _publish_reasons(broker, "collector", "pass-collector", "edgekit/v1/lab/alerts") == "Success"
        assert _publish_reasons(broker, "dev-a", "pass-a", "edgekit/v1/lab/alerts") == "Not authorized"
        assert _publish_reasons(broker, "alerts", "pass-alerts", "edgekit/v1/lab/alerts") == "Not authorized"
        assert _publish_reasons(broker, "alerts", "pass-alerts", "edgekit/v1/lab/dev-a/cmd") == "Not authorized"
        assert reader.wait_for(lambda ms: len(ms) >= 1) and collector.wait_for(lambda ms: len(ms) >= 1)
        time.sleep(0.3)  # time for a wrongly authorised alert to show up
    assert [m.topic for m in reader.messages] == ["edgekit/v1/lab/alerts"]
    assert [m.topic for m in collector.messages] == ["edgekit/v1/lab/alerts"]
