"""Telemetry windows that end now (so the store judges their devices online), built with the runtime's own builder,
and what an operator's tools receive of alerts (an MQTT subscriber and a webhook server)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from edgekit_runtime.agent.telemetry import BundleRef, TelemetryProblem, build_telemetry, encode_message
from edgekit_runtime.sensors.base import DeviceState, PowerSample, summarize_samples
from edgekit_runtime.timing import LatencyStats

from edgekit.fleet.alerts.notify import ALERT_SCHEMA_PATH
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store.base import TelemetryWindow
from tests.runtime.agent.mosquitto import MosquittoBroker

BUNDLE = BundleRef(id="det-int8", sha256="d" * 64)


def live_telemetry(seq: int, *, device: str = "dev-1", fleet: str = "lab", p99_ms: float = 5.0, inferences: int = 50,
                   failed: int = 0, temperature_c: float = 50.0, problems: Sequence[str] = (), window_s: float = 1.0,
                   end: dt.datetime | None = None, bundle: BundleRef | None = BUNDLE) -> dict[str, Any]:  # fmt: skip
    """A telemetry.v1 window of ``window_s`` seconds ending at ``end`` (default now) whose p99 is ``p99_ms``."""
    end = end or dt.datetime.now(dt.timezone.utc)
    start = end - dt.timedelta(seconds=window_s)
    power = summarize_samples([PowerSample(0.0, {"VDD_IN": 5000.0}, 5000.0),
                               PowerSample(window_s, {"VDD_IN": 5000.0}, 5000.0)], source="ina3221 VDD_IN")  # fmt: skip
    return build_telemetry(
        seq=seq, device=device, fleet=fleet, window_start=start, window_end=end,
        latency=LatencyStats.from_samples([p99_ms] * inferences) if inferences else None, power=power,
        device_state=DeviceState({"cpu-thermal": temperature_c}, 2048.0, 7620.0, 30.0, 10.0), failed_inferences=failed,
        bundle=bundle, errors=[TelemetryProblem(code, f"{code} (test)") for code in problems],
    )  # fmt: skip


def live_window(seq: int, **options: Any) -> TelemetryWindow:
    """``live_telemetry`` through the collector's parser, received at its window's end."""
    message = live_telemetry(seq, **options)
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"].replace("Z", "+00:00")))  # fmt: skip
    assert isinstance(record, TelemetryWindow), record
    return record


def alert_validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(ALERT_SCHEMA_PATH.read_text()))


class AlertListener:
    """What an operator's tools receive: MQTT alert messages and webhook POSTs, each with its arrival time."""

    def __init__(self, broker: MosquittoBroker, fleet: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.mqtt: list[tuple[float, dict[str, Any]]] = []
        self.webhook: list[tuple[float, dict[str, Any]]] = []
        subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"alert-listener-{fleet}")
        self.client.on_connect = lambda c, *a: c.subscribe(f"edgekit/v1/{fleet}/alerts", qos=1)
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_message = lambda c, u, m: self.mqtt.append((time.monotonic(), json.loads(m.payload)))
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        assert subscribed.wait(10), "the alert listener could not subscribe"
        received = self.webhook

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((time.monotonic(), json.loads(body)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.webhook_url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def messages(self, status: str, device: str | None = None, where: str = "mqtt") -> list[dict[str, Any]]:
        found = self.mqtt if where == "mqtt" else self.webhook
        return [m for _, m in found if m["status"] == status and (device is None or m["device"] == device)]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
        self.server.shutdown()
        self.server.server_close()
