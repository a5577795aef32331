"""/metrics at fleet scale (issue 27 item 6): fleet-level series read from a real store at scrape time, parsed with
prometheus_client's own text parser and the strict one of tests/fleet/prometheus_text.py; the per-device series
opt-in; one store read shared by concurrent scrapes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgekit.fleet.metrics import IngestMetrics, MetricsServer
from edgekit.fleet.metrics_fleet import FleetReader
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceStatus
from tests.fleet.messages import BUNDLE_A, BUNDLE_B, window
from tests.fleet.prometheus_text import Family, parse_exposition

#: device -> (bundle, target, seconds since its newest window ended (None: no window), p50 ms, reported state)
DEVICES = {
    "on-1": (BUNDLE_A, "orin", 2, 10.0, "online"),
    "on-2": (BUNDLE_A, "orin", 3, 20.0, "online"),
    "on-3": (BUNDLE_A, "orin", 4, 30.0, "online"),
    "stale-1": (BUNDLE_A, "orin", 60, 40.0, "online"),  # 6 silent 10 s intervals: stale
    "stale-2": (BUNDLE_A, "orin", 90, 50.0, "online"),
    "gone": (BUNDLE_A, "orin", 400, 999.0, "online"),  # 40 intervals: offline, left out of the statistics
    "will": (BUNDLE_A, "orin", 5, 888.0, "offline"),  # its last will arrived: offline although heard from
    "nano-1": (BUNDLE_B, "nano", 1, 7.0, "online"),
    "nano-2": (BUNDLE_B, "nano", 2, 9.0, "online"),
}


def _fill(store: FleetStore) -> FleetStore:
    """DEVICES in fleet ``lab`` (10 s windows, the newest one ``age`` seconds ago), one device of fleet ``other``,
    and a device ``new-1`` whose target is known but which never reported."""
    now = dt.datetime.now(dt.timezone.utc)
    for device, (bundle, target, age, p50, reported) in DEVICES.items():
        end = now - dt.timedelta(seconds=age)
        windows = [window(seq, device=device, bundle=bundle, latencies_ms=[p50] * 10, power_mw=1000.0 * p50,
                          start=end - dt.timedelta(seconds=10 * (3 - seq)))
                   for seq in (1, 2)]  # fmt: skip
        store.add_windows([dataclasses.replace(w, received_at=w.window_end) for w in windows])
        store.upsert_status(DeviceStatus("lab", device, reported, bundle.id, target, "1.0", end))
    store.add_windows([window(1, device="elsewhere", fleet="other", start=now - dt.timedelta(seconds=10))])
    store.set_device_target("lab", "new-1", "nano")
    return store


@pytest.fixture
def fleet_store(store_url: str) -> Iterator[FleetStore]:
    """:func:`_fill` on SQLite, and on a real PostgreSQL where one is reachable."""
    with open_store(store_url) as store:
        yield _fill(store)


@pytest.fixture
def sqlite_fleet_store(tmp_path: Path) -> Iterator[FleetStore]:
    """:func:`_fill` on SQLite only (for what the store's engine does not change: caching, failed reads)."""
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        yield _fill(store)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode("utf-8")


def _parsed(text: str) -> dict[str, Family]:
    """Both parsers agree on every sample (prometheus_client's drops the _total of counter family names)."""
    families = parse_exposition(text)
    theirs = {(s.name, tuple(sorted(s.labels.items())), s.value) for f in text_string_to_metric_families(text) for s in f.samples}
    ours = {(name, tuple(sorted(labels.items())), value) for name, f in families.items() for labels, value in f.samples}
    assert theirs == ours
    return families


#: The order of the label values in _by_labels' keys (the exposition lists labels sorted by name).
LABEL_ORDER = ("fleet", "device", "model", "bundle", "target", "state", "stat")


def _by_labels(family: Family, **fixed: str) -> dict[tuple[str, ...], float]:
    """The family's samples with the ``fixed`` labels, keyed by their other label values in LABEL_ORDER."""
    return {tuple(labels[k] for k in LABEL_ORDER if k in labels and k not in fixed): value
            for labels, value in family.samples if labels.items() >= fixed.items()}  # fmt: skip


def test_fleet_series_count_devices_per_state_and_summarise_the_live_ones(fleet_store: FleetStore) -> None:
    server = MetricsServer(IngestMetrics(), 0, store=MetricsStore.of(fleet_store), fleet="lab").start()
    try:
        text = _get(server.url)
    finally:
        server.stop()
    families = _parsed(text)
    assert not [name for name in families if name.startswith("edgekit_device_") or name.startswith("edgekit_model_")]
    devices = _by_labels(families["edgekit_fleet_devices"], fleet="lab")
    a, b = BUNDLE_A.id, BUNDLE_B.id
    assert devices == {
        (a, "orin", "online"): 3, (a, "orin", "stale"): 2, (a, "orin", "offline"): 2, (a, "orin", "unknown"): 0,
        (b, "nano", "online"): 2, (b, "nano", "stale"): 0, (b, "nano", "offline"): 0, (b, "nano", "unknown"): 0,
        ("", "nano", "online"): 0, ("", "nano", "stale"): 0, ("", "nano", "offline"): 0, ("", "nano", "unknown"): 1,
    }  # fmt: skip
    assert _by_labels(families["edgekit_fleet_devices_reporting"], fleet="lab") == {(a, "orin"): 5, (b, "nano"): 2, ("", "nano"): 0}
    p50 = _by_labels(families["edgekit_fleet_latency_p50_seconds"], fleet="lab")
    assert p50 == pytest.approx({(a, "orin", "median"): 0.030, (a, "orin", "max"): 0.050,
                                 (b, "nano", "median"): 0.008, (b, "nano", "max"): 0.009})  # fmt: skip
    power = _by_labels(families["edgekit_fleet_power_watts"], fleet="lab")
    assert power[(a, "orin", "median")] == pytest.approx(30.0) and power[(a, "orin", "max")] == pytest.approx(50.0)
    for name in ("edgekit_fleet_latency_p99_seconds", "edgekit_fleet_energy_per_inference_joules",
                 "edgekit_fleet_temperature_max_celsius"):  # fmt: skip
        assert set(_by_labels(families[name], fleet="lab")) == set(p50), name
    # per model, over the last 5 minutes: every device but "gone" (its windows ended 400 s ago); the store counts the
    # most devices in one minute, which holds the three newest of bundle A (their windows lie 2-4 s apart) and both of B
    model_devices = _by_labels(families["edgekit_fleet_model_devices"], fleet="lab", model="")
    assert set(model_devices) == {(a,), (b,)} and 3 <= model_devices[(a,)] <= 6 and model_devices[(b,)] == 2
    assert _by_labels(families["edgekit_fleet_model_latency_p99_seconds"], fleet="lab", model="", stat="max")[(a,)] == pytest.approx(0.888)
    assert _by_labels(families["edgekit_fleet_model_error_ratio"], fleet="lab", model="") == {(a,): 0.0, (b,): 0.0}
    assert all(labels["fleet"] == "lab" for f in families.values() for labels, _ in f.samples if "fleet" in labels)
    assert families["edgekit_fleet_store_read_seconds"].value({}) > 0
    assert families["edgekit_fleet_store_read_errors_total"].value({}) == 0
    assert families["edgekit_collector_messages_received_total"].type == "counter"


def test_per_device_series_are_opt_in(fleet_store: FleetStore) -> None:
    metrics = IngestMetrics()
    recent = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=30)  # heard from: not expired (test_metrics_store_outage.py)
    metrics.observe_windows([window(2, device="on-1", latencies_ms=[10.0] * 10, start=recent),
                             window(5, device="elsewhere", fleet="other", start=recent)])  # fmt: skip
    plain = MetricsServer(metrics, 0, store=MetricsStore.of(fleet_store)).start()
    opted = MetricsServer(metrics, 0, store=MetricsStore.of(fleet_store), per_device=True).start()
    try:
        assert "edgekit_device_" not in _get(plain.url)
        lab = _parsed(_get(plain.url + "/devices?fleet=lab"))
        everything = _parsed(_get(plain.url + "/devices"))
        on_metrics = _parsed(_get(opted.url))
        for path in ("/devices?fleet=lab&device=x", "/devices?fleet=a&fleet=b", "?fleet=lab"):
            with pytest.raises(urllib.error.HTTPError, match="400"):
                urllib.request.urlopen(plain.url + path, timeout=10)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(plain.url.replace("/metrics", "/metrics/other"), timeout=10)
        with pytest.raises(urllib.error.HTTPError, match="404") as unknown:
            urllib.request.urlopen(plain.url + "/devices?fleet=lba", timeout=10)
        assert "no device of fleet 'lba' ever reported" in unknown.value.read().decode()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(plain.url + "/devices?fleet=%C3%A9", timeout=10)  # not Latin-1: still an answer
    finally:
        plain.stop()
        opted.stop()
    states = _by_labels(lab["edgekit_device_state"], fleet="lab")
    assert states == {("on-1", "online"): 1, ("on-2", "online"): 1, ("on-3", "online"): 1, ("stale-1", "stale"): 1,
                      ("stale-2", "stale"): 1, ("gone", "offline"): 1, ("will", "offline"): 1, ("nano-1", "online"): 1,
                      ("nano-2", "online"): 1, ("new-1", "unknown"): 1}  # fmt: skip
    assert lab["edgekit_device_latency_p50_seconds"].samples == [({"fleet": "lab", "device": "on-1"}, pytest.approx(0.010))]
    assert lab["edgekit_device_last_seq"].value({"fleet": "lab", "device": "on-1"}) == 2
    assert everything["edgekit_device_last_seq"].value({"fleet": "other", "device": "elsewhere"}) == 5
    assert len(everything["edgekit_device_state"].samples) == len(DEVICES) + 2
    assert on_metrics["edgekit_device_info"].value({"fleet": "lab", "device": "on-1", "bundle": BUNDLE_A.id}) == 1
    assert on_metrics["edgekit_fleet_devices"].samples and on_metrics["edgekit_device_state"].samples


def test_concurrent_scrapes_share_one_store_read(sqlite_fleet_store: FleetStore) -> None:
    clock = [100.0]
    store = MetricsStore.of(sqlite_fleet_store)
    reader = FleetReader(store, max_age_s=5.0, clock=lambda: clock[0])
    snapshots = []
    threads = [threading.Thread(target=lambda: snapshots.append(reader.snapshot())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(snapshots) == 8 and len({id(s) for s in snapshots}) == 1 and store.reads == 1 and reader.reads == 1
    clock[0] += 4.9
    assert reader.snapshot() is snapshots[0] and store.reads == 1
    clock[0] += 0.2
    assert reader.snapshot() is not snapshots[0] and store.reads == 2


def test_in_the_background_a_scrape_never_waits_for_a_slow_store(sqlite_fleet_store: FleetStore) -> None:
    store = MetricsStore.of(sqlite_fleet_store)
    store.delay_s = 0.5
    reader = FleetReader(store, max_age_s=0.3, background=True, idle_s=1.0)
    try:
        first = reader.snapshot()  # the first scrape waits for the first read
        assert first is not None and store.reads == 1 and first.read_s >= 0.5
        time.sleep(0.35)
        started = time.monotonic()
        assert reader.snapshot() is first  # old now: served at once, read again behind it
        assert time.monotonic() - started < 0.2
        assert _eventually(lambda: reader.snapshot() is not first)
        reads = store.reads
        assert _eventually(lambda: store.reads >= reads + 1)  # every 0.3 s while asked within idle_s...
        time.sleep(2.5)
        reads = store.reads
        time.sleep(1.0)
        assert store.reads == reads  # ...and not after
    finally:
        reader.close()


def test_a_primed_reader_has_read_before_the_first_scrape(sqlite_fleet_store: FleetStore) -> None:
    store = MetricsStore.of(sqlite_fleet_store)
    store.delay_s = 0.3
    reader = FleetReader(store, max_age_s=5.0, background=True)
    try:
        reader.prime()  # as MetricsServer.start() does
        assert _eventually(lambda: reader.reads == 1)
        started = time.monotonic()
        assert reader.snapshot() is not None and time.monotonic() - started < 0.2 and store.reads == 1
    finally:
        reader.close()


def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_failed_store_read_serves_the_last_good_one_until_it_is_stale(sqlite_fleet_store: FleetStore) -> None:
    """After a failed read the scrape still serves the last good figures (store_up 1) and counts the error: one
    failure must not blank the series. Once the good read is too old they are left out
    (tests/fleet/test_metrics_store_outage.py::test_a_read_older_than_the_limit_is_not_served)."""
    store = MetricsStore.of(sqlite_fleet_store)
    server = MetricsServer(IngestMetrics(), 0, store=store, cache_s=0.0).start()
    try:
        first = _parsed(_get(server.url))
        store.close_for_good()
        second = _parsed(_get(server.url))
    finally:
        server.stop()
    assert first["edgekit_fleet_devices"].samples and first["edgekit_fleet_store_up"].value({}) == 1
    assert second["edgekit_fleet_devices"].samples == first["edgekit_fleet_devices"].samples
    assert second["edgekit_fleet_store_up"].value({}) == 1
    assert second["edgekit_fleet_store_read_errors_total"].value({}) == 1
    assert second["edgekit_fleet_store_read_age_seconds"].value({}) >= 0
    assert second["edgekit_collector_messages_received_total"].type == "counter"


class MetricsStore:
    """The metrics server's own connection to the test's store (as ``fleet collect`` opens one), counting reads."""

    def __init__(self, url: str) -> None:
        self.inner = open_store(url)
        self.url, self.reads, self.delay_s = url, 0, 0.0

    @classmethod
    def of(cls, store: FleetStore) -> "MetricsStore":
        return cls(store.url)

    def device_summaries(self, fleet: str | None = None):  # type: ignore[no-untyped-def]
        self.reads += 1
        time.sleep(self.delay_s)
        return self.inner.device_summaries(fleet)

    def model_aggregate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.inner.model_aggregate(*args, **kwargs)

    def known_values(self, key: str, **options):  # type: ignore[no-untyped-def]
        return self.inner.known_values(key, **options)

    def close_for_good(self) -> None:
        """Close the connection: every later read fails with the store's own error."""
        self.inner.close()
