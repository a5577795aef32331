"""A real PostgreSQL outage: a private server (initdb on a free loopback port) is stopped, then started again.
The collector stores every window published meanwhile exactly once (it acknowledges a message to the broker only
once its batch is committed); the dashboard answers 503 while the database is away and its first read after the
restart succeeds."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.dashboard.app import DashboardApp
from edgekit.fleet.dashboard.http import Request
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker


@pytest.fixture
def private_postgres() -> Iterator[object]:
    """A throwaway PostgreSQL server (``scripts.bench_fleet.Postgres``), stopped and removed afterwards."""
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not on PATH (apt-get install postgresql-15)")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'edgekit[fleet]')")
    from scripts.bench_fleet import Postgres

    parent = Path(tempfile.mkdtemp(prefix="edgekit-pg-outage-"))  # not under pytest's 0700 folder: it runs as postgres
    server = Postgres(parent / "pg")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(parent, ignore_errors=True)


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_windows_published_while_postgresql_is_down_are_stored_once_it_is_back(fleet_broker: MosquittoBroker,
                                                                              private_postgres: object) -> None:  # fmt: skip
    url = private_postgres.start()  # type: ignore[attr-defined]
    with open_store(url):  # the schema, made before the collector starts
        pass
    collector = Collector(fleet_broker.url, open_store(url), client_id="outage-collector", fleet="outage",
                          flush_interval_s=0.05).start()  # fmt: skip

    def stored() -> list[int]:
        with open_store(url) as reader:
            return sorted(w.seq for w in reader.windows(fleet="outage", device="dev-1"))

    try:
        with Publisher(fleet_broker) as device:
            def publish(seqs: range) -> None:
                device.publish_many([(topic("telemetry", fleet="outage"), encode_message(telemetry(seq, fleet="outage")))
                                     for seq in seqs])  # fmt: skip

            publish(range(1, 31))
            _wait(lambda: stored() == list(range(1, 31)), "the first 30 windows in PostgreSQL")
            private_postgres.stop()  # type: ignore[attr-defined]
            publish(range(31, 61))
            _wait(lambda: collector.metrics.store_errors >= 1, "the collector to meet the outage")
            time.sleep(1.0)  # a few retries against the stopped server
            private_postgres.start_again()  # type: ignore[attr-defined]
            _wait(lambda: stored() == list(range(1, 61)), "every window after the outage")
            publish(range(61, 71))  # and the collector carries on as before
            _wait(lambda: stored() == list(range(1, 71)), "the windows after the outage")
    finally:
        collector.stop()
    assert stored() == list(range(1, 71))  # each once: none lost, none twice


def test_the_dashboard_says_503_while_postgresql_is_down_and_reads_again_at_once_when_it_is_back(
        private_postgres: object) -> None:  # fmt: skip
    import json

    from edgekit.fleet.sim.seed import seed_history

    url = private_postgres.start()  # type: ignore[attr-defined]
    with open_store(url) as store:
        seed_history(store, devices=20, hours=1, window_s=300)
    app = DashboardApp(url, cache_s=0)  # every request reads the store
    app.open()

    def get(path: str) -> tuple[int, dict, dict]:
        response = app.handle(Request("GET", path, {}, {}))
        return response.status, json.loads(response.body), response.headers

    try:
        assert get("/api/overview")[0] == 200
        private_postgres.stop()  # type: ignore[attr-defined]
        private_postgres.start_again()  # type: ignore[attr-defined]
        # a restart between two refreshes: the connections it cut are found out and replaced within the request
        # (before: the first read on each of them answered 500, "terminating connection due to administrator command")
        assert get("/api/overview")[0] == 200 and get("/api/devices")[0] == 200
        private_postgres.stop()  # type: ignore[attr-defined]
        for path in ("/api/overview", "/api/devices"):
            status, body, headers = get(path)
            assert status == 503, body  # the database is away: not a dashboard bug (500)
            assert "fleet store postgresql://postgres@127.0.0.1" in body["error"] and headers["Retry-After"] == "5"
        private_postgres.start_again()  # type: ignore[attr-defined]
        assert get("/api/overview")[0] == 200 and get("/api/devices")[1]["total"] == 20
    finally:
        app.close()
