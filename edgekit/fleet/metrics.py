"""The collector's Prometheus metrics: ingest counters and per-device gauges, served on ``/metrics``.

Written in the text exposition format 0.0.4 (``text/plain; version=0.0.4``). Gauges follow
Prometheus' base units (seconds, watts, joules, Celsius) and come from the newest window (highest
seq) this collector has stored for each device; ``edgekit_device_online`` comes from the devices'
status messages, which every collector receives (they are not shared). Several collectors each
export their own counters; sum them with ``sum without (instance)``.

Per model (issue 20): the ``edgekit_model_*`` gauges carry a ``model`` label besides ``fleet`` and
``device``, one series per model of the newest window (telemetry.v1 ``models``; the window itself under
its ``model`` from agents serving one, an empty ``model`` from agents naming none). Power and
temperature stay per device: the models share them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable

from edgekit.fleet.errors import CollectorError
from edgekit.fleet.ingest import READ_KINDS, REJECTION_REASONS
from edgekit.fleet.store.base import DeviceStatus, ModelWindow, TelemetryWindow

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class _Gauge:
    name: str
    help: str
    field: str
    scale: float


#: Per-device gauges: metric name, help, TelemetryWindow field, factor to the base unit.
DEVICE_GAUGES = (
    _Gauge("edgekit_device_latency_p50_seconds", "Median inference latency over the device's newest window.", "p50_ms", 1e-3),
    _Gauge("edgekit_device_latency_p99_seconds", "99th-percentile inference latency over the newest window.", "p99_ms", 1e-3),
    _Gauge("edgekit_device_power_watts", "Mean power over the newest window.", "power_mean_mw", 1e-3),
    _Gauge("edgekit_device_energy_per_inference_joules", "Energy of one inference in the newest window.",
           "energy_per_inference_mj", 1e-3),
    _Gauge("edgekit_device_temperature_max_celsius", "Hottest thermal zone in the newest window.", "temperature_max_c", 1.0),
    _Gauge("edgekit_device_throughput_per_second", "Inferences per second over the newest window.", "throughput_per_s", 1.0),
)  # fmt: skip

#: Per-model gauges (label ``model``): metric name, help, ModelWindow field, factor to the base unit.
MODEL_GAUGES = (
    _Gauge("edgekit_model_latency_p50_seconds", "Median latency of the model over the device's newest window.", "p50_ms", 1e-3),
    _Gauge("edgekit_model_latency_p99_seconds", "99th-percentile latency of the model over the newest window.", "p99_ms", 1e-3),
    _Gauge("edgekit_model_throughput_per_second", "The model's inferences per second over the newest window.",
           "throughput_per_s", 1.0),
    _Gauge("edgekit_model_inferences", "The model's inferences in the newest window.", "count", 1.0),
    _Gauge("edgekit_model_errors", "The model's failed inferences in the newest window.", "errors", 1.0),
    _Gauge("edgekit_model_memory_bytes", "Memory the model holds (its loaded files), as the agent reports it.",
           "memory_mb", 1024.0 * 1024.0),
)  # fmt: skip


def model_windows(window: TelemetryWindow) -> tuple[ModelWindow, ...]:
    """The window's models: its ``models``, else the window itself under its ``model`` ('' when unnamed)."""
    if window.models:
        return window.models
    return (ModelWindow(window.model or "", window.bundle_id, window.count, window.errors, window.p50_ms, window.p99_ms,
                        window.throughput_per_s),)  # fmt: skip


class IngestMetrics:
    """Thread-safe counters and gauges the collector updates and ``/metrics`` renders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received: dict[str, int] = defaultdict(int)  # kind -> messages
        self.stored: dict[str, int] = defaultdict(int)  # kind -> records written (new)
        self.duplicates: dict[str, int] = defaultdict(int)  # kind -> records already in the store
        self.rejected: dict[str, int] = defaultdict(int)  # reason -> messages
        self.store_errors = 0
        self.queue_depth = 0
        self.connected = False
        self._latest: dict[tuple[str, str], TelemetryWindow] = {}
        self._online: dict[tuple[str, str], bool] = {}

    def count_received(self, kind: str) -> None:
        with self._lock:
            self.received[kind] += 1

    def count_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def count_written(self, kind: str, offered: int, new: int) -> None:
        with self._lock:
            self.stored[kind] += new
            self.duplicates[kind] += offered - new

    def count_store_error(self) -> None:
        with self._lock:
            self.store_errors += 1

    def observe_windows(self, windows: Iterable[TelemetryWindow]) -> None:
        with self._lock:
            for window in windows:
                key = (window.fleet, window.device)
                current = self._latest.get(key)
                if current is None or window.seq >= current.seq:
                    self._latest[key] = window

    def observe_status(self, status: DeviceStatus) -> None:
        with self._lock:
            self._online[(status.fleet, status.device)] = status.state == "online"

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Counter values, for logs and tests."""
        with self._lock:
            return {"received": dict(self.received), "stored": dict(self.stored),
                    "duplicates": dict(self.duplicates), "rejected": dict(self.rejected)}  # fmt: skip

    def render(self) -> str:
        """Everything in the Prometheus text format 0.0.4."""
        with self._lock:
            lines: list[str] = []
            _family(lines, "edgekit_collector_messages_received_total", "counter", "MQTT messages received, by topic kind.",
                    [({"kind": kind}, self.received.get(kind, 0)) for kind in READ_KINDS])
            _family(lines, "edgekit_collector_records_stored_total", "counter", "Records written to the store, by kind.",
                    [({"kind": kind}, self.stored.get(kind, 0)) for kind in READ_KINDS])
            _family(lines, "edgekit_collector_duplicates_total", "counter",
                    "Telemetry windows and events already stored (QoS 1 redelivery, spool replay), by kind.",
                    [({"kind": kind}, self.duplicates.get(kind, 0)) for kind in READ_KINDS])
            _family(lines, "edgekit_collector_messages_rejected_total", "counter", "Messages rejected, by reason.",
                    [({"reason": reason}, self.rejected.get(reason, 0)) for reason in REJECTION_REASONS])
            _family(lines, "edgekit_collector_store_errors_total", "counter", "Failed store writes (retried).",
                    [({}, self.store_errors)])
            _family(lines, "edgekit_collector_queue_depth", "gauge", "Records waiting for the store writer.",
                    [({}, self.queue_depth)])
            _family(lines, "edgekit_collector_connected", "gauge", "1 while connected to the broker.",
                    [({}, 1 if self.connected else 0)])
            devices = sorted(set(self._latest) | set(self._online))
            _family(lines, "edgekit_device_online", "gauge", "1 when the device's last status is online.",
                    [({"fleet": f, "device": d}, 1 if self._online.get((f, d)) else 0) for f, d in devices])
            _family(lines, "edgekit_device_info", "gauge", "The bundle a device runs (value always 1).",
                    [({"fleet": w.fleet, "device": w.device, "bundle": w.bundle_id or ""}, 1)
                     for _, w in sorted(self._latest.items())])
            _family(lines, "edgekit_device_last_seq", "gauge", "Sequence number of the device's newest window.",
                    [({"fleet": w.fleet, "device": w.device}, w.seq) for _, w in sorted(self._latest.items())])
            for gauge in DEVICE_GAUGES:
                samples = [({"fleet": w.fleet, "device": w.device}, getattr(w, gauge.field) * gauge.scale)
                           for _, w in sorted(self._latest.items()) if getattr(w, gauge.field) is not None]
                _family(lines, gauge.name, "gauge", gauge.help, samples)
            models = [(w, m) for _, w in sorted(self._latest.items()) for m in model_windows(w)]
            _family(lines, "edgekit_model_info", "gauge", "The bundle each model of a device runs (value always 1).",
                    [({"fleet": w.fleet, "device": w.device, "model": m.model or "", "bundle": m.bundle_id or ""}, 1)
                     for w, m in models])  # fmt: skip
            for gauge in MODEL_GAUGES:
                found = [({"fleet": w.fleet, "device": w.device, "model": m.model or ""}, getattr(m, gauge.field))
                         for w, m in models if getattr(m, gauge.field) is not None]  # fmt: skip
                _family(lines, gauge.name, "gauge", gauge.help,
                        [(labels, value * gauge.scale if gauge.scale != 1.0 else value) for labels, value in found])
        return "\n".join(lines) + "\n"


def _family(lines: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[dict[str, str], float]]) -> None:  # fmt: skip
    lines.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2)}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        label_text = ",".join(f'{key}="{escape_label(str(val))}"' for key, val in labels.items())
        lines.append(f"{name}{{{label_text}}} {format_value(value)}" if label_text else f"{name} {format_value(value)}")


def escape_label(value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0: any free port; see :attr:`port`), in a daemon thread."""

    def __init__(self, metrics: IngestMetrics, port: int, host: str = "127.0.0.1") -> None:
        self.metrics = metrics
        handler = _handler_for(metrics)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise CollectorError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
                                 hint="pick a free port with --metrics-port (0 picks one)") from exc  # fmt: skip
        self._server.daemon_threads = True
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="edgekit-metrics", daemon=True)  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        self._thread.start()
        logger.info("metrics on %s", self.url)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(metrics: IngestMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] not in ("/metrics", "/metrics/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.render().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            logger.debug("metrics %s - %s", self.address_string(), format % args)

    return Handler


__all__ = ["CONTENT_TYPE", "DEVICE_GAUGES", "MODEL_GAUGES", "IngestMetrics", "MetricsServer", "escape_label", "format_value",
           "model_windows"]
