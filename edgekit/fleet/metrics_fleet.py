"""Fleet-level Prometheus series, read from the store at scrape time (issue 27): a handful of series per
(fleet, bundle, target) and per (fleet, model, bundle), however many devices there are.

:class:`FleetReader` reads :meth:`FleetStore.device_summaries` (each device's liveness state, already judged by
:mod:`edgekit.fleet.liveness`, and its newest window's figures) and the last few minutes of per-model telemetry,
at most once every ``max_age_s`` seconds, in a thread of its own: a scrape never waits long for the store.
:class:`FleetCollector` turns that read into metric families (``prometheus_client``'s custom-collector
interface). The names and labels are listed in ``deploy/prometheus/METRICS.md``; alert rules build on them.
"""

from __future__ import annotations

import datetime as dt
import logging
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from edgekit.fleet.errors import StoreError
from edgekit.fleet.liveness import STATES
from edgekit.fleet.store import fleet_reads
from edgekit.fleet.store.base import DeviceSummary, FleetStore, ModelAggregate
from edgekit.fleet.store.sql import SqlFleetStore
from edgekit.fleet.store.urls import redact

logger = logging.getLogger(__name__)

#: How long one store read serves scrapes, by default (``fleet collect --metrics-cache-seconds``).
DEFAULT_CACHE_S = 5.0
#: The longest a scrape waits for a store read, when it has nothing it may serve (the first scrapes, cache 0).
READ_WAIT_S = 2.0
#: Each statement of a metrics read on PostgreSQL is cut after this many seconds (statement_timeout).
READ_TIMEOUT_S = 20.0
#: A good read is served until it is this many cache ages old, and at least MIN_STALE_AFTER_S: then store_up is 0.
STALE_AFTER_READS = 3
MIN_STALE_AFTER_S = 60.0
#: Per-model series cover the model windows that ended this recently.
MODEL_LOOKBACK = dt.timedelta(minutes=5)
#: Devices in these states are left out of the median/max statistics: their newest window may be days old.
NOT_REPORTING_STATES = ("offline", "unknown")
#: The statistics over devices each figure is written with (label ``stat``).
DEVICE_STATS = ("median", "max")


@dataclass(frozen=True)
class _FleetFigure:
    name: str
    help: str
    field: str  # DeviceSummary field
    scale: float  # to the base unit


#: Per (fleet, bundle, target): the median and the worst over devices of each device's newest window.
FLEET_FIGURES = (
    _FleetFigure("edgekit_fleet_latency_p50_seconds", "Devices' p50 latency over their newest window: median or max over devices.",
                 "p50_ms", 1e-3),
    _FleetFigure("edgekit_fleet_latency_p99_seconds", "Devices' p99 latency over their newest window: median or max over devices.",
                 "p99_ms", 1e-3),
    _FleetFigure("edgekit_fleet_power_watts", "Devices' mean power over their newest window: median or max over devices.",
                 "power_mean_mw", 1e-3),
    _FleetFigure("edgekit_fleet_energy_per_inference_joules",
                 "Devices' energy per inference over their newest window: median or max over devices.",
                 "energy_per_inference_mj", 1e-3),
    _FleetFigure("edgekit_fleet_temperature_max_celsius",
                 "Devices' hottest thermal zone in their newest window: median or max over devices.", "temperature_max_c", 1.0),
)  # fmt: skip

_GROUP_LABELS = ("fleet", "bundle", "target")
_MODEL_LABELS = ("fleet", "model", "bundle")


@dataclass(frozen=True)
class FleetSnapshot:
    """One read of the store: every device's summary, the recent per-model aggregates, and the metric families
    made of them (made once per read, not per scrape)."""

    summaries: tuple[DeviceSummary, ...]
    models: tuple[ModelAggregate, ...]
    read_at: float  # the reader's clock (monotonic seconds) when the read finished
    read_s: float  # how long the read took
    families: tuple[Metric, ...] = ()


class FleetReader:
    """Reads ``store`` (one of its own: a scrape then never waits for the collector's writer) at most once every
    ``max_age_s`` seconds; ``fleet`` restricts it to one fleet. :meth:`snapshot` returns the newest good read while
    it may be served: at most :attr:`stale_after_s` old (3 x ``max_age_s``, at least 60 s), whether or not later
    reads failed; else None, and the scrape serves no series from the store (``edgekit_fleet_store_up`` 0).

    Reads run in a thread of their own, never in the caller's, and one at a time. A call finding the newest read
    older than ``max_age_s`` starts one unless one is in progress. It waits (at most ``wait_s``) for a read it
    started itself, and for one in progress only while no read has ended yet (the first scrapes after the server
    started); a call finding a read in progress otherwise returns at once with what may be served, if anything. A
    store that hangs thus costs a scrape ``wait_s`` at most, the first ones only (on PostgreSQL each statement of
    these reads is also cut after ``read_timeout_s``: :meth:`PostgresStore.bound_reads`).

    ``background=True`` (what the metrics server uses; it calls :meth:`prime` when it starts): a thread reads the
    store again every ``max_age_s`` seconds for as long as calls keep coming (it stops after ``idle_s`` without
    one), and a call returns the newest good read at once while that thread keeps it fresh, so a scrape costs the
    same however slow the store read is and serves figures at most ``max_age_s`` plus one read old. The first call
    after such a pause (the thread stopped, the read older than that) waits for a new read as above: it never
    serves figures from before the pause."""

    def __init__(self, store: FleetStore, *, fleet: str | None = None, max_age_s: float = DEFAULT_CACHE_S,
                 background: bool = False, idle_s: float = 300.0, wait_s: float = READ_WAIT_S,
                 read_timeout_s: float = READ_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if not max_age_s >= 0:
            raise StoreError(f"metrics cache age must be >= 0 seconds, got {max_age_s!r}",
                             hint="give --metrics-cache-seconds a number of seconds (0 reads the store on every scrape)")  # fmt: skip
        self.store, self.fleet, self.max_age_s, self._clock = store, fleet, max_age_s, clock
        self.background, self.idle_s, self.wait_s = background and max_age_s > 0, idle_s, wait_s
        self.stale_after_s = max(STALE_AFTER_READS * max_age_s, MIN_STALE_AFTER_S)
        bound_reads = getattr(store, "bound_reads", None)  # PostgreSQL: a statement timeout on this store's reads
        if callable(bound_reads):
            bound_reads(read_timeout_s)
        self._state = threading.Condition()  # guards everything below; notified when a read ends
        self._snapshot: FleetSnapshot | None = None  # the newest good read
        self._reading: threading.Thread | None = None  # the read in progress
        self._ended = 0  # reads ended (succeeded or failed)
        self._refresher: threading.Thread | None = None
        self._asked_at = clock()
        self._closed = threading.Event()
        self.reads = 0
        self.read_errors = 0

    def snapshot(self) -> FleetSnapshot | None:
        """The newest good read while it may be served (see the class), else None."""
        with self._state:
            self._asked_at = now = self._clock()
            current, refreshing = self._servable(now), self._refresher is not None
            if current is not None and now - current.read_at < self.max_age_s:
                return current
            in_progress, ended, ever_read = self._reading is not None, self._ended, self._ended > 0
            self._start_read()
        if self.background:
            self._start_refresher()
            if current is not None and (refreshing or now - current.read_at < self.max_age_s + current.read_s):
                return current  # the refresher keeps it fresh: served at once, read again behind it
        if in_progress and (current is not None or ever_read):
            return current  # a read is under way: serve what there is, without waiting for it
        with self._state:
            self._state.wait_for(lambda: self._ended > ended or self._closed.is_set(), timeout=self.wait_s)
            return self._servable(self._clock())

    def latest(self) -> FleetSnapshot | None:
        """The newest good read, however old (for its age and duration)."""
        with self._state:
            return self._snapshot

    def _servable(self, now: float) -> FleetSnapshot | None:
        current = self._snapshot
        # served after a failed read too, until stale: one failed read must not blank the series (Prometheus would mark
        # them stale and every rule's `for:` would start again); repeated failures show in read_errors_total
        if current is None or now - current.read_at > self.stale_after_s:
            return None
        return current

    def _start_read(self) -> None:
        """A read in a thread of its own, unless one is in progress (call with ``_state`` held)."""
        if self._reading is None and not self._closed.is_set():
            self._reading = threading.Thread(target=self._read, name="edgekit-metrics-read", daemon=True)
            self._reading.start()

    def _read(self) -> None:
        started = self._clock()
        fresh: FleetSnapshot | None = None
        try:
            summaries = tuple(self.store.device_summaries(self.fleet))
            models = tuple(self._models())
            families = (*fleet_families(summaries), *model_families(models))
            finished = self._clock()
            fresh = FleetSnapshot(summaries, models, read_at=finished, read_s=finished - started, families=families)
        except StoreError as exc:
            # the last good read is still served until it is stale_after_s old (edgekit_fleet_store_up 0 after that)
            logger.warning("metrics: cannot read the fleet store %s: %s", redact(self.store.url), exc)
        except Exception:  # a bug, not the store: the scrape still serves the collector's counters
            logger.exception("metrics: reading the fleet store %s failed", redact(self.store.url))
        finally:
            with self._state:
                if fresh is not None:
                    self._snapshot, self.reads = fresh, self.reads + 1
                else:
                    self.read_errors += 1
                self._reading = None
                self._ended += 1
                self._state.notify_all()

    def _models(self) -> list[ModelAggregate]:
        """The per-model aggregates over the windows that ended in the last :data:`MODEL_LOOKBACK`."""
        since = dt.datetime.now(dt.timezone.utc) - MODEL_LOOKBACK
        if isinstance(self.store, SqlFleetStore):
            return fleet_reads.recent_model_aggregate(self.store, fleet=self.fleet, ended_since=since)
        return list(self.store.model_aggregate(("fleet", "model", "bundle_id"), fleet=self.fleet, since=since))

    def prime(self) -> None:
        """Start one read in the background now, so that the first call need not wait for all of it."""
        if self.background:
            with self._state:
                if self._ended == 0:
                    self._start_read()

    def _start_refresher(self) -> None:
        with self._state:
            if self._refresher is not None or self._closed.is_set():
                return
            self._refresher = threading.Thread(target=self._refresh_loop, name="edgekit-metrics-reader", daemon=True)
            self._refresher.start()

    def _refresh_loop(self) -> None:
        try:
            while not self._closed.is_set():
                with self._state:
                    if self._clock() - self._asked_at >= self.idle_s:
                        return
                    ended = self._ended
                    self._start_read()
                    self._state.wait_for(lambda: self._ended > ended or self._closed.is_set())
                self._closed.wait(self.max_age_s)
        finally:
            with self._state:
                self._refresher = None

    def close(self) -> None:
        """Stop the background reads (the store is the caller's to close)."""
        self._closed.set()
        with self._state:
            self._state.notify_all()
            threads = (self._refresher, self._reading)
        for thread in threads:
            if thread is not None:
                thread.join(timeout=30)

    def age_s(self, snapshot: FleetSnapshot) -> float:
        return max(self._clock() - snapshot.read_at, 0.0)


class FleetCollector:
    """A ``prometheus_client`` collector of the fleet-level series (register it, or pass it to ``generate_latest``)."""

    def __init__(self, reader: FleetReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        snapshot = self.reader.snapshot()
        if snapshot is not None:
            yield from snapshot.families
        yield GaugeMetricFamily("edgekit_fleet_store_up",
                                "1 while the fleet series are served from a recent good store read; 0 when the newest good one "
                                "is too old or there is none (the fleet series are then left out).",
                                value=1 if snapshot is not None else 0)  # fmt: skip
        latest = self.reader.latest()
        read = GaugeMetricFamily("edgekit_fleet_store_read_seconds", "How long the newest good store read for these metrics took.")
        age = GaugeMetricFamily("edgekit_fleet_store_read_age_seconds", "Age of the newest good store read (served or not).")
        if latest is not None:
            read.add_metric([], latest.read_s)
            age.add_metric([], self.reader.age_s(latest))
        yield read
        yield age
        yield CounterMetricFamily("edgekit_fleet_store_read_errors_total", "Store reads for these metrics that failed.",
                                  value=self.reader.read_errors)  # fmt: skip


def fleet_families(summaries: Iterable[DeviceSummary]) -> list[Metric]:
    """Devices by (fleet, bundle, target, state) and each figure's median and max over the devices reporting."""
    groups: dict[tuple[str, str, str], list[DeviceSummary]] = defaultdict(list)
    for summary in summaries:
        groups[(summary.fleet, summary.bundle_id or "", summary.target or "")].append(summary)
    devices = GaugeMetricFamily("edgekit_fleet_devices", "Devices in each liveness state (edgekit.fleet.liveness).",
                                labels=[*_GROUP_LABELS, "state"])  # fmt: skip
    reporting = GaugeMetricFamily("edgekit_fleet_devices_reporting",
                                  "Devices the median/max statistics are over: those with a newest window, not offline or unknown.",
                                  labels=list(_GROUP_LABELS))  # fmt: skip
    figures = {figure.name: GaugeMetricFamily(figure.name, figure.help, labels=[*_GROUP_LABELS, "stat"]) for figure in FLEET_FIGURES}
    for key in sorted(groups):
        group = groups[key]
        counts = Counter(summary.state for summary in group)
        for state in (*STATES, *sorted(set(counts) - set(STATES))):
            devices.add_metric([*key, state], counts.get(state, 0))
        live = [s for s in group if s.state not in NOT_REPORTING_STATES
                and any(getattr(s, figure.field) is not None for figure in FLEET_FIGURES)]  # fmt: skip
        reporting.add_metric(list(key), len(live))
        for figure in FLEET_FIGURES:
            values = [getattr(s, figure.field) * figure.scale for s in live if getattr(s, figure.field) is not None]
            if values:
                figures[figure.name].add_metric([*key, "median"], statistics.median(values))
                figures[figure.name].add_metric([*key, "max"], max(values))
    return [devices, reporting, *figures.values()]


def model_families(models: Sequence[ModelAggregate]) -> list[Metric]:
    """Per (fleet, model, bundle), over the model windows of the last :data:`MODEL_LOOKBACK`."""
    minutes = f"{MODEL_LOOKBACK.total_seconds() / 60:g} minutes"
    count = GaugeMetricFamily("edgekit_fleet_model_devices", f"Devices that sent windows of the model in the last {minutes}.",
                              labels=list(_MODEL_LABELS))  # fmt: skip
    rate = GaugeMetricFamily("edgekit_fleet_model_inferences_per_second",
                             f"The model's inferences per second summed over devices, last {minutes}.", labels=list(_MODEL_LABELS))  # fmt: skip
    p50 = GaugeMetricFamily("edgekit_fleet_model_latency_p50_seconds",
                            f"Inference-weighted mean of the model's windows' p50, last {minutes}.", labels=list(_MODEL_LABELS))  # fmt: skip
    p99 = GaugeMetricFamily("edgekit_fleet_model_latency_p99_seconds",
                            f"The model's windows' p99, last {minutes}: inference-weighted mean or worst window.",
                            labels=[*_MODEL_LABELS, "stat"])  # fmt: skip
    errors = GaugeMetricFamily("edgekit_fleet_model_error_ratio",
                               f"Failed inferences over attempted ones (completed + failed) of the model, last {minutes}.",
                               labels=list(_MODEL_LABELS))  # fmt: skip
    for row in sorted(models, key=lambda r: (r.fleet or "", r.model or "", r.bundle_id or "")):
        key = [row.fleet or "", row.model or "", row.bundle_id or ""]
        count.add_metric(key, row.devices)
        if row.throughput_per_s is not None:
            rate.add_metric(key, row.throughput_per_s * row.devices)
        if row.p50_ms is not None:
            p50.add_metric(key, row.p50_ms * 1e-3)
        if row.p99_ms is not None:
            p99.add_metric([*key, "mean"], row.p99_ms * 1e-3)
        if row.p99_max_ms is not None:
            p99.add_metric([*key, "max"], row.p99_max_ms * 1e-3)
        attempts = (row.inferences or 0) + (row.errors or 0)  # the inferences count only those that completed
        if attempts:
            errors.add_metric(key, (row.errors or 0) / attempts)
    return [count, rate, p50, p99, errors]


def device_state_family(summaries: Iterable[DeviceSummary], fleet: str | None = None) -> GaugeMetricFamily:
    """``edgekit_device_state{fleet,device,state} 1``: each device's liveness state (per-device output only)."""
    family = GaugeMetricFamily("edgekit_device_state", "The device's liveness state (edgekit.fleet.liveness); value always 1.",
                               labels=["fleet", "device", "state"])  # fmt: skip
    for summary in summaries:
        if fleet is None or summary.fleet == fleet:
            family.add_metric([summary.fleet, summary.device, summary.state], 1)
    return family


__all__ = ["DEFAULT_CACHE_S", "DEVICE_STATS", "FLEET_FIGURES", "MODEL_LOOKBACK", "READ_TIMEOUT_S", "READ_WAIT_S", "FleetCollector", "FleetReader", "FleetSnapshot",
           "device_state_family", "fleet_families", "model_families"]
