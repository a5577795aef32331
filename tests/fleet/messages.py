"""Real agent messages for the fleet tests, built with the runtime's own builders, and a test publisher."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any, Sequence

from edgekit_runtime.agent.telemetry import BundleRef, build_event, build_status, build_telemetry, encode_message
from edgekit_runtime.sensors.base import DeviceState, PowerSample, summarize_samples
from edgekit_runtime.timing import LatencyStats

from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store.base import TelemetryWindow
from tests.runtime.agent.mosquitto import MosquittoBroker

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
WINDOW_S = 10
BUNDLE_A = BundleRef(id="minilm-int8-a", sha256="a" * 64)
BUNDLE_B = BundleRef(id="minilm-int8-b", sha256="b" * 64)


def telemetry(seq: int, *, device: str = "dev-1", fleet: str = "lab", bundle: BundleRef | None = BUNDLE_A,
              latencies_ms: Sequence[float] = (2.0, 2.5, 3.0, 4.0, 12.0), power_mw: float = 5000.0,
              temperature_c: float = 50.0, start: dt.datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """A telemetry.v1 window ``seq`` starting at T0 + (seq - 1) windows, with constant ``power_mw``."""
    start = start or T0 + dt.timedelta(seconds=WINDOW_S * (seq - 1))
    power = summarize_samples([PowerSample(0.0, {"VDD_IN": power_mw}, power_mw),
                               PowerSample(float(WINDOW_S), {"VDD_IN": power_mw}, power_mw)], source="ina3221 VDD_IN")  # fmt: skip
    return build_telemetry(
        seq=seq, device=device, fleet=fleet, window_start=start, window_end=start + dt.timedelta(seconds=WINDOW_S),
        latency=LatencyStats.from_samples(list(latencies_ms)) if latencies_ms else None, power=power,
        device_state=DeviceState({"cpu-thermal": temperature_c, "soc": temperature_c - 2}, 2048.0, 7620.0, 30.0, 10.0),
        bundle=bundle,
    )  # fmt: skip


def window(seq: int, **options: Any) -> TelemetryWindow:
    """``telemetry(seq, ...)`` through the collector's parser, as the store receives it."""
    message = telemetry(seq, **options)
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"]))  # fmt: skip
    assert isinstance(record, TelemetryWindow), record
    return record


def status(state: str = "online", *, device: str = "dev-1", fleet: str = "lab", **options: Any) -> dict[str, Any]:
    return build_status(device=device, fleet=fleet, state=state, **options)  # type: ignore[arg-type]


def event(kind: str = "deploy_result", *, device: str = "dev-1", fleet: str = "lab", **options: Any) -> dict[str, Any]:
    return build_event(device=device, fleet=fleet, kind=kind, message=options.pop("message", "deployed"), **options)


def topic(kind: str, device: str = "dev-1", fleet: str = "lab") -> str:
    return f"edgekit/v1/{fleet}/{device}/{kind}"


class Publisher:
    """A paho MQTT 5 client that publishes QoS 1 and waits for the broker's PUBACKs."""

    def __init__(self, broker: MosquittoBroker, client_id: str = "", *, will: tuple[str, bytes] | None = None) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.max_inflight_messages_set(500)
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1, retain=True)
        connected = threading.Event()
        self.client.on_connect = lambda *args: connected.set()
        self.client.connect(broker.host, broker.port, keepalive=5)
        self.client.loop_start()
        if not connected.wait(10):
            raise RuntimeError(f"test publisher could not connect to {broker.url}")

    def publish(self, topic: str, payload: bytes | str | dict[str, Any], *, retain: bool = False) -> None:
        if isinstance(payload, dict):
            payload = json.dumps(payload)
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        infos = [self.client.publish(t, p, qos=1) for t, p in messages]
        for info in infos:
            info.wait_for_publish(30)

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT, so the broker publishes the will."""
        self.client.socket().close()
        self.client.loop_stop()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
