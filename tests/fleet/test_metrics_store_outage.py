"""/metrics when the store fails or hangs, the per-model lookback, per-device expiry and gzip (review of issue 27's
metrics): real stores (SQLite, and PostgreSQL where reachable), a real HTTP server, promtool where installed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from edgekit.fleet.ingest import parse_message
from edgekit.fleet.metrics import IngestMetrics, MetricsServer, accepts_gzip
from edgekit.fleet.metrics_fleet import FleetReader
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceStatus, TelemetryWindow
from tests.fleet.messages import BUNDLE_A, telemetry, window
from tests.fleet.prometheus_text import Family, parse_exposition

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
_UTC = dt.timezone.utc


def _fill(store: FleetStore, devices: int = 3) -> None:
    now = dt.datetime.now(_UTC)
    for index in range(devices):
        w = window(1, device=f"d{index}", bundle=BUNDLE_A, start=now - dt.timedelta(seconds=12))
        store.add_windows([dataclasses.replace(w, received_at=w.window_end)])
        store.upsert_status(DeviceStatus("lab", f"d{index}", "online", BUNDLE_A.id, "orin", "1.0", now))


def _long_window(device: str, start: dt.datetime, end: dt.datetime, model: str | None = None) -> TelemetryWindow:
    """A window of any length (the agent's ``window_s``), received when it ended."""
    message = telemetry(1, device=device, start=start)
    message["window"]["end"] = end.strftime("%Y-%m-%dT%H:%M:%SZ")
    if model is not None:
        message["model"] = model
    record = parse_message(f"edgekit/v1/lab/{device}/telemetry", json.dumps(message), received_at=end)
    assert isinstance(record, TelemetryWindow), record
    return record


def _get(url: str, timeout: float = 10.0, **headers: str) -> tuple[float, str, dict[str, str]]:
    started = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
        body = response.read()
        got = dict(response.headers.items())
    if got.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return time.monotonic() - started, body.decode("utf-8"), got


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def _fleet_series(families: dict[str, Family]) -> list[str]:
    """The families read from the store that hold samples (not the store_* gauges about the read)."""
    return [name for name, f in families.items() if f.samples and (name == "edgekit_device_state" or (
        name.startswith("edgekit_fleet_") and not name.startswith("edgekit_fleet_store_")))]  # fmt: skip


# -- 1: an outage is visible, not papered over with the last good figures ------------------------------------------
def test_a_read_older_than_the_limit_is_not_served(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        _fill(store)
    clock = [1000.0]
    with open_store(url) as own:
        reader = FleetReader(own, max_age_s=5.0, clock=lambda: clock[0])
        assert reader.stale_after_s == 60.0 and FleetReader(own, max_age_s=30.0).stale_after_s == 90.0
        first = reader.snapshot()
        assert first is not None and first.summaries
        own.close()  # every later read fails
        clock[0] += 4.0
        assert reader.snapshot() is first  # within the cache age: not read again
        clock[0] += 2.0
        # a failed read: the last good one is still served (one failure must not blank the series: Prometheus would
        # mark them stale and every rule's `for:` would start again), until it is too old
        assert reader.snapshot() is first and reader.read_errors == 1
        clock[0] += 55.0  # 61 s old: past 3 x 5 s, at least 60 s
        assert reader.snapshot() is None and reader.read_errors >= 2
        assert reader.latest() is first  # (its age is still published)
        reader.close()


@pytest.mark.skipif(not Path(PROMTOOL).is_file(), reason="promtool is not installed (apt-get install prometheus)")
def test_the_store_down_rule_passes_promtool_and_fires() -> None:
    rules = DEPLOY / "collector_rules.yml"
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 2 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", "collector_rules_test.yml"], cwd=DEPLOY, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    assert "increase(edgekit_fleet_store_read_errors_total[10m])" in rules.read_text()
    assert "edgekit_fleet_store_up" in rules.read_text() and "`edgekit_fleet_store_up`" in (DEPLOY / "METRICS.md").read_text()


# -- 2: a hanging store costs a scrape little, and PostgreSQL cuts the read ------------------------------------------
def test_a_hanging_postgres_read_does_not_hang_the_scrape(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    import psycopg

    with open_store(postgres_url) as store:
        _fill(store)
    metrics = IngestMetrics()
    metrics.count_received("telemetry")
    own = open_store(postgres_url)
    locker = psycopg.connect(postgres_url, autocommit=False)
    try:
        tables = [r[0] for r in locker.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()]
        locker.execute("LOCK TABLE " + ", ".join(f'"{t}"' for t in tables) + " IN ACCESS EXCLUSIVE MODE")
        server = MetricsServer(metrics, 0, store=own, cache_s=0.5)
        server.reader.wait_s = 1.0
        own.bound_reads(3.0)  # as the reader does with READ_TIMEOUT_S, shorter
        server.start()
        try:
            results: list[tuple[float, str, dict[str, str]]] = []
            scrapes = [threading.Thread(target=lambda: results.append(_get(server.url))) for _ in range(3)]
            for scrape in scrapes:
                scrape.start()
            for scrape in scrapes:
                scrape.join(15)
            assert len(results) == 3
            for took, text, _ in results:  # the read hangs on the lock: counters served, no fleet series
                families = parse_exposition(text)
                assert took < 2.5 and families["edgekit_fleet_store_up"].value({}) == 0 and not _fleet_series(families)
                assert families["edgekit_collector_messages_received_total"].value({"kind": "telemetry"}) == 1
            took, text, _ = _get(server.url + "/devices?fleet=nope")  # no store call while it hangs: an empty answer
            assert took < 2.5
            # the statement timeout ends the read: an error, and a new read (which hangs again)
            assert _eventually(lambda: server.reader.read_errors >= 1)
            assert _eventually(lambda: "did not answer within 3 s" in caplog.text)
            locker.rollback()
            assert _eventually(lambda: parse_exposition(_get(server.url)[1])["edgekit_fleet_store_up"].value({}) == 1, 15)
            families = parse_exposition(_get(server.url)[1])
            assert families["edgekit_fleet_devices"].value({"fleet": "lab", "bundle": BUNDLE_A.id, "target": "orin",
                                                            "state": "online"}) == 3  # fmt: skip
        finally:
            locker.rollback()
            server.stop()
    finally:
        locker.close()
        own.close()


def test_while_a_read_hangs_the_last_good_one_is_served_up_to_the_limit(postgres_url: str) -> None:
    import psycopg

    with open_store(postgres_url) as store:
        _fill(store)
    clock = [1000.0]
    own = open_store(postgres_url)
    locker = psycopg.connect(postgres_url, autocommit=False)
    reader = FleetReader(own, max_age_s=5.0, wait_s=0.5, read_timeout_s=30.0, clock=lambda: clock[0])
    try:
        first = reader.snapshot()
        assert first is not None and reader.reads == 1
        locker.execute('LOCK TABLE "device_status" IN ACCESS EXCLUSIVE MODE')
        clock[0] += 6.0
        started = time.monotonic()
        assert reader.snapshot() is first and time.monotonic() - started < 1.5  # waited for its own read, then served
        clock[0] += 50.0
        started = time.monotonic()
        assert reader.snapshot() is first and time.monotonic() - started < 0.3  # a read in progress: not waited for
        clock[0] += 5.0  # 61 s old: past 3 x 5 s, at least 60 s
        assert reader.snapshot() is None and reader.latest() is first and reader.read_errors == 0
    finally:
        locker.rollback()
        locker.close()
        reader.close()
        own.close()
    assert reader.reads == 2  # the hung read ended once the lock went


def test_bound_reads_leave_writes_and_other_stores_alone(postgres_url: str) -> None:
    with open_store(postgres_url) as writer, open_store(postgres_url) as reader:
        reader.bound_reads(0.5)
        assert writer.read_timeout_s is None and reader.read_timeout_s == 0.5
        assert reader._query("reading the timeout", "SHOW statement_timeout")[0][0] == "500ms"
        assert writer._query("reading the timeout", "SHOW statement_timeout")[0][0] == "0"
        _fill(writer)
        assert len(reader.device_summaries("lab")) == 3


# -- 3: per-model series select windows by their end -------------------------------------------------------------
def test_model_series_cover_long_windows_that_ended_in_the_lookback(store_url: str) -> None:
    now = dt.datetime.now(_UTC)
    with open_store(store_url) as store:
        for device, length_s, ended_ago_s in (("five-min", 300, 60), ("ten-min", 600, 20), ("gone", 300, 420)):
            store.add_windows([_long_window(device, now - dt.timedelta(seconds=length_s + ended_ago_s),
                                            now - dt.timedelta(seconds=ended_ago_s), model=device)])  # fmt: skip
    with open_store(store_url) as own:
        server = MetricsServer(IngestMetrics(), 0, store=own)
        try:
            families = parse_exposition(server.render())
        finally:
            server.reader.close()
    models = {labels["model"]: value for labels, value in families["edgekit_fleet_model_devices"].samples}
    assert models == {"five-min": 1, "ten-min": 1}  # windows that ended in the last 5 minutes, however long
    rate = {labels["model"]: value for labels, value in families["edgekit_fleet_model_inferences_per_second"].samples}
    assert set(rate) == {"five-min", "ten-min"} and all(value > 0 for value in rate.values())


# -- 4: per-device series expire with the device; the newest window's end is exported -------------------------------
def test_per_device_series_of_devices_offline_by_silence_expire() -> None:
    now = dt.datetime.now(_UTC)
    metrics = IngestMetrics()
    fresh = window(4, device="fresh", start=now - dt.timedelta(seconds=15))
    slow = _long_window("slow", now - dt.timedelta(minutes=45), now - dt.timedelta(minutes=40))  # 5-min windows: 50 min
    gone = window(7, device="gone", start=now - dt.timedelta(days=3))
    metrics.observe_windows([fresh, slow, gone])
    server = MetricsServer(metrics, 0).start()
    try:
        _, text, _ = _get(server.url.replace("/metrics", "/metrics/devices"))
    finally:
        server.stop()
    families = parse_exposition(text)
    assert {labels["device"] for labels, _ in families["edgekit_device_last_seq"].samples} == {"fresh", "slow"}
    assert {labels["device"] for labels, _ in families["edgekit_device_online"].samples} == {"fresh", "slow"}
    ends = {labels["device"]: value for labels, value in families["edgekit_device_last_window_end_timestamp_seconds"].samples}
    assert ends == pytest.approx({"fresh": fresh.window_end.timestamp(), "slow": slow.window_end.timestamp()})
    assert families["edgekit_device_last_window_end_timestamp_seconds"].type == "gauge"
    _promtool_checks(text)


# -- 5: gzip when the scraper allows it -----------------------------------------------------------------------------
def test_responses_are_gzipped_when_the_scraper_accepts_it(tmp_path: Path) -> None:
    now = dt.datetime.now(_UTC)
    metrics = IngestMetrics()
    metrics.observe_windows([window(1, device=f"d{i}", start=now - dt.timedelta(seconds=15)) for i in range(200)])
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        _fill(store)
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as own:
        server = MetricsServer(metrics, 0, store=own).start()
        try:
            for path in ("/metrics", "/metrics/devices"):
                url = server.url.replace("/metrics", path)
                request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})  # what Prometheus sends
                with urllib.request.urlopen(request, timeout=10) as response:
                    raw, headers = response.read(), response.headers
                assert headers["Content-Encoding"] == "gzip" and int(headers["Content-Length"]) == len(raw)
                text = gzip.decompress(raw).decode("utf-8")
                _, plain, plain_headers = _get(url)  # urllib sends no Accept-Encoding: identity
                assert "Content-Encoding" not in plain_headers
                assert _samples(text) == _samples(plain) and len(raw) < len(plain.encode()) / 3
                _, refused, refused_headers = _get(url, **{"Accept-Encoding": "gzip;q=0, identity"})
                assert "Content-Encoding" not in refused_headers and _samples(refused) == _samples(plain)
                _promtool_checks(text)
        finally:
            server.stop()


def _samples(text: str) -> set[str]:
    """Sample lines but the ones that change between two scrapes (the read's age and duration)."""
    return {line for line in text.splitlines() if not line.startswith(("#", "edgekit_fleet_store_read_"))}


def test_accept_encoding_is_parsed_as_http_says() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("identity, gzip;q=0.5") and accepts_gzip("*") and accepts_gzip("GZIP ; q=1")
    assert not accepts_gzip("") and not accepts_gzip("identity") and not accepts_gzip("gzip;q=0")
    assert not accepts_gzip("*, gzip;q=0") and not accepts_gzip("br, deflate")


def _promtool_checks(text: str) -> None:
    if not Path(PROMTOOL).is_file():
        return
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_unknown_fleet_is_answered_from_the_read_being_served_not_the_store(tmp_path: Path) -> None:
    """/metrics/devices?fleet=F for a fleet no device reported: 404 from the fleets of the read being served; before,
    the scrape asked the store from its own thread, and a hanging store hung it (7 s, up to twice the timeout)."""
    from edgekit.fleet.metrics import UnknownFleetError

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        _fill(store)
    own = open_store(url)
    server = MetricsServer(IngestMetrics(), 0, store=own, cache_s=60.0)
    try:
        assert server.reader is not None and server.reader.snapshot() is not None

        def hanging(*args: object, **kwargs: object) -> list[str]:
            raise AssertionError("the scrape asked the store")

        own.known_values = hanging  # type: ignore[method-assign]
        with pytest.raises(UnknownFleetError, match="no device of fleet 'nope' ever reported") as info:
            server.render_devices("nope")
        assert "known fleets: lab" in (info.value.hint or "")
        assert "edgekit_device_state" in server.render_devices("lab")
    finally:
        server.reader.close()
        own.close()
