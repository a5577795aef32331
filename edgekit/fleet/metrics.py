"""The collector's Prometheus metrics, served by ``prometheus_client`` on ``/metrics`` and ``/metrics/devices``.

``/metrics`` holds the collector's own counters and, given a store, the fleet-level series of
:mod:`edgekit.fleet.metrics_fleet` (devices by fleet, bundle, target and liveness state; latency, power, energy
and temperature as the median and the worst over devices; per model): its size does not grow with the fleet.
Per-device series are opt-in: always on ``/metrics/devices`` (``?fleet=F`` for one fleet), and on ``/metrics``
too with ``per_device=True`` (``fleet collect --metrics-per-device``). ``deploy/prometheus/METRICS.md`` lists
every name and label.

Per-device gauges keep the names ``/metrics`` served before issue 27. They follow Prometheus' base units
(seconds, watts, joules, Celsius) and come from the newest window (highest seq) this collector has stored for
each device; ``edgekit_device_online`` comes from the devices' status messages, which every collector receives
(they are not shared); ``edgekit_device_state`` from the store, judged as ``fleet status`` judges it. Several
collectors each export their own counters; sum them with ``sum without (instance)``.

Per model (issue 20): the ``edgekit_model_*`` gauges carry a ``model`` label besides ``fleet`` and
``device``, one series per model of the newest window (telemetry.v1 ``models``; the window itself under
its ``model`` from agents serving one, an empty ``model`` from agents naming none). Power and
temperature stay per device: the models share them.
"""

from __future__ import annotations

import datetime as dt
import gzip
import logging
import threading
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from edgekit.fleet.errors import CollectorError
from edgekit.fleet.ingest import READ_KINDS, REJECTION_REASONS
from edgekit.fleet.liveness import DEFAULT_INTERVAL_S, liveness_state
from edgekit.fleet.metrics_fleet import DEFAULT_CACHE_S, FleetCollector, FleetReader, FleetSnapshot, device_state_family
from edgekit.fleet.store.base import DeviceStatus, FleetStore, ModelWindow, TelemetryWindow
from edgekit.fleet.store.urls import redact

logger = logging.getLogger(__name__)

#: The text exposition format 0.0.4, which ``prometheus_client.generate_latest`` writes for these names.
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
    """Thread-safe counters and per-device gauges the collector updates and the metrics server renders."""

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

    def counter_families(self) -> list[Metric]:
        """The collector's own counters and gauges (names unchanged since before issue 27)."""
        with self._lock:
            received, stored, duplicates = dict(self.received), dict(self.stored), dict(self.duplicates)
            rejected, store_errors, queue_depth, connected = dict(self.rejected), self.store_errors, self.queue_depth, self.connected
        families: list[Metric] = []
        for name, help_text, label, keys, counts in (
            ("edgekit_collector_messages_received_total", "MQTT messages received, by topic kind.", "kind", READ_KINDS, received),
            ("edgekit_collector_records_stored_total", "Records written to the store, by kind.", "kind", READ_KINDS, stored),
            ("edgekit_collector_duplicates_total",
             "Records not stored again, by kind: windows and events already stored (QoS 1 redelivery, spool replay), "
             "statuses older than the stored one.", "kind", READ_KINDS, duplicates),
            ("edgekit_collector_messages_rejected_total", "Messages rejected, by reason.", "reason", REJECTION_REASONS, rejected),
        ):  # fmt: skip
            family = CounterMetricFamily(name, help_text, labels=[label])
            for key in keys:
                family.add_metric([key], counts.get(key, 0))
            families.append(family)
        families.append(CounterMetricFamily("edgekit_collector_store_errors_total", "Failed store writes (retried).",
                                            value=store_errors))  # fmt: skip
        families.append(GaugeMetricFamily("edgekit_collector_queue_depth", "Records waiting for the store writer.", value=queue_depth))
        families.append(GaugeMetricFamily("edgekit_collector_connected", "1 while connected to the broker.", value=1 if connected else 0))
        return families

    def expire(self, now: dt.datetime | None = None) -> None:
        """Forget the newest window of the devices :mod:`edgekit.fleet.liveness` judges offline by silence (received
        10 of its intervals ago): their figures then leave the scrape. Their ``edgekit_device_online`` stays: it
        follows their status messages (a will tells a crash from a device gone quiet with its status still online)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        with self._lock:
            gone = [key for key, window in self._latest.items() if _silent_too_long(window, now)]
            for key in gone:
                del self._latest[key]

    def device_families(self, fleet: str | None = None, now: dt.datetime | None = None) -> list[Metric]:
        """Per-device and per-model gauges from the newest window this collector stored for each device, for the
        devices not offline by silence (:meth:`expire`)."""
        self.expire(now)
        with self._lock:
            latest = sorted((key, w) for key, w in self._latest.items() if fleet is None or key[0] == fleet)
            online = {key: up for key, up in self._online.items() if fleet is None or key[0] == fleet}
        online_family = GaugeMetricFamily("edgekit_device_online", "1 when the device's last status is online.",
                                          labels=["fleet", "device"])  # fmt: skip
        for key in sorted(set(online) | {key for key, _ in latest}):
            online_family.add_metric(list(key), 1 if online.get(key) else 0)
        info = GaugeMetricFamily("edgekit_device_info", "The bundle a device runs (value always 1).", labels=["fleet", "device", "bundle"])
        last_seq = GaugeMetricFamily("edgekit_device_last_seq", "Sequence number of the device's newest window.", labels=["fleet", "device"])
        last_end = GaugeMetricFamily("edgekit_device_last_window_end_timestamp_seconds",
                                     "When the device's newest window ended (Unix time, the device's clock).",
                                     labels=["fleet", "device"])  # fmt: skip
        gauges = [GaugeMetricFamily(g.name, g.help, labels=["fleet", "device"]) for g in DEVICE_GAUGES]
        model_info = GaugeMetricFamily("edgekit_model_info", "The bundle each model of a device runs (value always 1).",
                                       labels=["fleet", "device", "model", "bundle"])  # fmt: skip
        model_gauges = [GaugeMetricFamily(g.name, g.help, labels=["fleet", "device", "model"]) for g in MODEL_GAUGES]
        for (fleet_id, device), window in latest:
            info.add_metric([fleet_id, device, window.bundle_id or ""], 1)
            last_seq.add_metric([fleet_id, device], window.seq)
            last_end.add_metric([fleet_id, device], window.window_end.timestamp())
            for gauge, family in zip(DEVICE_GAUGES, gauges):
                value = getattr(window, gauge.field)
                if value is not None:
                    family.add_metric([fleet_id, device], value * gauge.scale)
            for model in model_windows(window):
                model_info.add_metric([fleet_id, device, model.model or "", model.bundle_id or ""], 1)
                for gauge, family in zip(MODEL_GAUGES, model_gauges):
                    value = getattr(model, gauge.field)
                    if value is not None:
                        family.add_metric([fleet_id, device, model.model or ""], value * gauge.scale)
        return [online_family, info, last_seq, last_end, *gauges, model_info, *model_gauges]

    def render(self, per_device: bool = True) -> str:
        """The counters (and the per-device gauges) in the text format 0.0.4."""
        return render_families([*self.counter_families(), *(self.device_families() if per_device else [])])


def _silent_too_long(window: TelemetryWindow, now: dt.datetime) -> bool:
    """Whether the device of ``window`` (its newest) is offline by silence, as ``fleet status`` judges it."""
    interval_s = (window.window_end - window.window_start).total_seconds()
    last_seen = window.received_at or window.window_end
    return liveness_state(None, last_seen, interval_s if interval_s > 0 else DEFAULT_INTERVAL_S, now) == "offline"


class UnknownFleetError(CollectorError):
    """``/metrics/devices?fleet=F`` names a fleet no device of the store ever reported."""


class _Families:
    """Metric families as a ``prometheus_client`` collector (what ``generate_latest`` reads)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def render_families(families: Iterable[Metric]) -> str:
    return generate_latest(_Families(families)).decode("utf-8")


class MetricsServer:
    """``GET /metrics`` and ``GET /metrics/devices[?fleet=F]`` on ``host:port`` (port 0: any free port; see
    :attr:`port`), in a daemon thread.

    ``store``: read for the fleet-level series (give the server a store of its own, not the collector's, so a
    read never waits for the writer): by the first scrape, then in the background every ``cache_s`` seconds while
    scrapes keep coming, so a scrape never waits for the store (:class:`FleetReader`); ``fleet`` restricts them to
    one fleet. ``per_device``: the per-device series on ``/metrics`` too; by default only without a
    store (then they are all the server knows, as before issue 27)."""

    def __init__(self, metrics: IngestMetrics, port: int, host: str = "127.0.0.1", *, store: FleetStore | None = None,
                 fleet: str | None = None, per_device: bool | None = None, cache_s: float = DEFAULT_CACHE_S) -> None:  # fmt: skip
        self.metrics = metrics
        self.reader = FleetReader(store, fleet=fleet, max_age_s=cache_s, background=True) if store is not None else None
        self.per_device = store is None if per_device is None else per_device
        try:
            self._server = ThreadingHTTPServer((host, port), _handler_for(self))
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

    def render(self) -> str:
        """What ``/metrics`` serves."""
        families = self.metrics.counter_families()
        if self.reader is not None:
            families.extend(FleetCollector(self.reader).collect())
        if self.per_device:
            families.extend(self._device_families(None, self.reader.snapshot() if self.reader is not None else None))
        return render_families(families)

    def render_devices(self, fleet: str | None = None) -> str:
        """What ``/metrics/devices`` serves: the per-device series, of one fleet or all. Raises
        :class:`UnknownFleetError` for a fleet the store has never heard of (a typo in a scrape config)."""
        snapshot = self.reader.snapshot() if self.reader is not None else None
        families = self._device_families(fleet, snapshot)
        if fleet is not None and self.reader is not None and snapshot is not None and not any(f.samples for f in families):
            # the fleets of the read being served, never the store from this thread (a hanging store would hang it)
            known = sorted({summary.fleet for summary in snapshot.summaries})
            if fleet not in known:
                raise UnknownFleetError(f"no device of fleet {fleet!r} ever reported to the store {redact(self.reader.store.url)}",
                                        hint=f"known fleets: {', '.join(known[:8]) or 'none yet'}")  # fmt: skip
        return render_families(families)

    def _device_families(self, fleet: str | None, snapshot: FleetSnapshot | None) -> list[Metric]:
        families = self.metrics.device_families(fleet)
        if snapshot is not None:
            families.append(device_state_family(snapshot.summaries, fleet))
        return families

    def start(self) -> MetricsServer:
        if self.reader is not None:
            self.reader.prime()
        self._thread.start()
        logger.info("metrics on %s", self.url)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self.reader is not None:
            self.reader.close()


#: gzip level of the responses: fast (a 15 MB /metrics/devices in a fraction of a second), nearly as small as 9.
GZIP_LEVEL = 3


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header allows gzip (``gzip`` or ``*``, with no ``q=0``)."""
    allowed: dict[str, bool] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        quality = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if coding.strip():
            allowed[coding.strip().lower()] = quality > 0
    return allowed.get("gzip", allowed.get("x-gzip", allowed.get("*", False)))


def _handler_for(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path, _, query = self.path.partition("?")
            params = urllib.parse.parse_qs(query, keep_blank_values=True)
            if path.rstrip("/") == "/metrics" and not params:
                self._send(server.render())
            elif path.rstrip("/") == "/metrics/devices" and set(params) <= {"fleet"} and len(params.get("fleet", [""])) == 1:
                try:
                    self._send(server.render_devices(params["fleet"][0] if "fleet" in params else None))
                except UnknownFleetError as exc:
                    self.send_error(404, "unknown fleet", f"{exc.message}; {exc.hint}")  # the body: any characters
            elif path.rstrip("/") in ("/metrics", "/metrics/devices"):
                self.send_error(400, "unknown query", f"unknown query {query!r}: /metrics takes none, /metrics/devices takes fleet=F once")
            else:
                self.send_error(404, "only /metrics and /metrics/devices[?fleet=F] are served here")

        def _send(self, text: str) -> None:
            body = text.encode("utf-8")
            zipped = accepts_gzip(self.headers.get("Accept-Encoding", ""))
            if zipped:  # Prometheus always asks for it: 15 MB of per-device series at 10,000 devices are 1.4 MB
                body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if zipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the scraper gave up (its scrape_timeout)
                logger.info("metrics: %s closed the connection before %s was sent", self.address_string(), self.path)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            logger.debug("metrics %s - %s", self.address_string(), format % args)

    return Handler


__all__ = ["CONTENT_TYPE", "accepts_gzip", "DEVICE_GAUGES", "MODEL_GAUGES", "IngestMetrics", "MetricsServer", "UnknownFleetError", "model_windows",
           "render_families"]
