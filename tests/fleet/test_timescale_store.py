"""The PostgreSQL store on TimescaleDB (issue 27 item 1): detected at open, rollups and fleet buckets as
hypertables, rollup retention as retention policies and dropped chunks, and every read the same as the native
layout's on the same data.

Runs against the real extension on a private PostgreSQL 15 (initdb on a free loopback port, started with
``shared_preload_libraries=timescaledb``); the shared server at 127.0.0.1:5432 is never touched. Skips where
``timescaledb.so`` is not installed into this PostgreSQL: CI cannot install it (TimescaleDB is not in Debian's
archive); ``scripts/install_timescaledb.sh`` builds and installs it from source.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from edgekit.fleet.store import FleetStore, open_store, timescale
from tests.fleet.messages import T0, window

DAY = dt.timedelta(days=1)
D0 = T0.replace(hour=0)


def _missing_timescaledb() -> str | None:
    if shutil.which("pg_config") is None or shutil.which("initdb") is None:
        return "PostgreSQL server binaries (pg_config, initdb) are not on PATH"
    libdir = subprocess.run(["pg_config", "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(libdir) / "timescaledb.so").is_file():
        return (f"TimescaleDB is not installed into this PostgreSQL ({libdir}/timescaledb.so missing); CI cannot install "
                "it (it is not in Debian's archive): run scripts/install_timescaledb.sh to build it from source")
    return None


@pytest.fixture(scope="module")
def timescale_server() -> Iterator[str]:
    """URL of the ``postgres`` database of a private server that preloads TimescaleDB."""
    missing = _missing_timescaledb()
    if missing:
        pytest.skip(missing)
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'edgekit[fleet]')")
    from scripts.bench_fleet import Postgres

    parent = Path(tempfile.mkdtemp(prefix="edgekit-timescale-"))  # not under pytest's 0700 folder: the server runs as postgres
    server = Postgres(parent / "pg", settings=(
        "shared_preload_libraries=timescaledb", "timescaledb.telemetry_level=off", "max_worker_processes=16"))
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(parent, ignore_errors=True)


_databases = iter(range(1_000_000))


@pytest.fixture
def new_database(timescale_server: str) -> Any:
    """Makes a fresh database on the private server and returns its URL."""
    import psycopg

    def make() -> str:
        name = f"fleet_{next(_databases)}"
        with psycopg.connect(timescale_server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return timescale_server.rsplit("/", 1)[0] + f"/{name}"

    return make


def _seed(store: FleetStore, days: int = 3, per_day: int = 6, devices: int = 3) -> None:
    windows = [window(day * per_day + i + 1, device=f"dev-{d}", start=D0 + day * DAY + i * dt.timedelta(hours=4),
                      latencies_ms=(1.0 + d, 2.0 * d, 3.0 + i, 9.0 + day))
               for d in range(1, devices + 1) for day in range(days) for i in range(per_day)]  # fmt: skip
    store.add_windows(windows)


def _rounded(value: Any) -> Any:
    """``value`` with every float to 12 significant digits: a percentile merged from rollups sums its parts in
    the order the scan returns them (hypertable chunks vs. partitions), which moves the last bit (9.864999999999998
    vs 9.864999999999997); everything else must match exactly."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(_rounded(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def _reads(store: FleetStore) -> dict[str, Any]:
    """Every read the console, report and dashboard use, as plain values (floats to 12 significant digits)."""
    return _rounded({
        "summaries": store.device_summaries(),
        "by_bundle": store.aggregate(("bundle_id", "target")),
        "by_device": store.aggregate(("device",)),
        "hours": store.aggregate((), bucket_s=3600),
        "minutes": store.aggregate((), since=D0, until=D0 + 3 * DAY, bucket_s=60),
        "one_device": store.aggregate(("device",), devices=[("lab", "dev-1")]),
        "models": store.model_aggregate(),
        "spans": store.bundle_spans(),
        "windows": list(store.windows()),
        "missing": store.missing_seqs("lab", "dev-2"),
    })


def _scalar(store: FleetStore, sql: str) -> Any:
    return store._query("test", sql)[0][0]  # type: ignore[attr-defined]


def test_detected_at_open_with_hypertables_for_the_rollups_and_buckets(new_database: Any) -> None:
    with open_store(new_database()) as store:
        assert store.layout == timescale.TIMESCALEDB  # type: ignore[attr-defined]
        assert store.timescale_detection.reason.startswith("created extension timescaledb 2.")  # type: ignore[attr-defined]
        rows = store._query("test", "SELECT hypertable_name, d.time_interval FROM timescaledb_information.hypertables h "  # type: ignore[attr-defined]
                            "JOIN timescaledb_information.dimensions d USING (hypertable_schema, hypertable_name) "
                            "ORDER BY 1")  # fmt: skip
        assert {name: interval for name, interval in rows} == {
            "fleet_minute_buckets": DAY, "fleet_model_minute_buckets": DAY,
            "telemetry_model_rollups": DAY, "telemetry_rollups": DAY}  # fmt: skip
        assert _scalar(store, "SELECT relkind FROM pg_class WHERE oid = to_regclass('telemetry_windows')") == "r"


def test_turned_off_keeps_the_native_layout_and_says_why(new_database: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(timescale.MODE_ENV, "off")
    with open_store(new_database()) as store:
        assert store.layout == timescale.NATIVE  # type: ignore[attr-defined]
        assert store.timescale_detection.reason == "TimescaleDB turned off (EDGEKIT_FLEET_TIMESCALEDB=off)"  # type: ignore[attr-defined]
        assert _scalar(store, "SELECT relkind FROM pg_class WHERE oid = to_regclass('telemetry_rollups')") == "p"
        assert _scalar(store, "SELECT COUNT(*) FROM pg_extension WHERE extname = 'timescaledb'") == 0
    monkeypatch.setenv(timescale.MODE_ENV, "sometimes")
    from edgekit.fleet.errors import StoreError

    with pytest.raises(StoreError, match="environment variable EDGEKIT_FLEET_TIMESCALEDB='sometimes' is not one of auto, off"):
        open_store(new_database())


def test_reads_and_retention_are_the_same_as_the_native_layout(new_database: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.fleet.store.postgres import PostgresStore

    native = PostgresStore(new_database(), timescaledb="off")
    timescaled = PostgresStore(new_database())
    try:
        assert (native.layout, timescaled.layout) == ("native", "timescaledb")
        for store in (native, timescaled):
            _seed(store)
        assert _reads(timescaled) == _reads(native)  # raw windows, ingest-time buckets
        for store in (native, timescaled):  # everything rolled up into 5-minute rollups
            assert store.apply_retention(dt.timedelta(0), rollup_minutes=5, now=D0 + 4 * DAY) == 54
        assert _reads(timescaled) == _reads(native)
        assert _scalar(timescaled, "SELECT COUNT(*) FROM timescaledb_information.chunks "
                                   "WHERE hypertable_name = 'telemetry_rollups'") == 3  # one a day  # fmt: skip
        for store in (native, timescaled):  # keep two days back from D0 + 3 days: day 0's rollups go
            store.apply_retention(dt.timedelta(0), now=D0 + 3 * DAY, rollups_for=2 * DAY)
        assert _reads(timescaled) == _reads(native)
        assert _scalar(timescaled, "SELECT COUNT(*) FROM telemetry_rollups") == 36
        assert _scalar(timescaled, "SELECT COUNT(*) FROM timescaledb_information.chunks "
                                   "WHERE hypertable_name = 'telemetry_rollups'") == 2  # day 0 dropped whole  # fmt: skip
        assert timescaled.storage_layout()["retention_policies"] == {
            "telemetry_rollups": "48:00:00", "telemetry_model_rollups": "48:00:00"}  # fmt: skip
        timescaled.apply_retention(dt.timedelta(0), now=D0 + 3 * DAY, rollups_for=3 * DAY)  # policy replaced
        assert timescaled.storage_layout()["retention_policies"]["telemetry_rollups"] == "72:00:00"
    finally:
        native.close()
        timescaled.close()


def test_the_retention_policy_job_drops_old_chunks_itself(new_database: Any) -> None:
    with open_store(new_database()) as store:
        _seed(store, days=2)  # D0 is days in the past: both days are past a 1-day policy
        store.apply_retention(dt.timedelta(0), now=D0 + 10 * DAY)
        assert _scalar(store, "SELECT COUNT(*) FROM telemetry_rollups") == 36
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            timescale.ensure_retention_policy(cursor, store.timescale_detection.schema, "telemetry_rollups", DAY)  # type: ignore[attr-defined]
            cursor.execute("SELECT job_id FROM timescaledb_information.jobs WHERE proc_name = 'policy_retention'")
            (job_id,) = cursor.fetchone()
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            cursor.execute(f"CALL {store.timescale_detection.schema}.run_job({job_id})")  # type: ignore[attr-defined]
        assert _scalar(store, "SELECT COUNT(*) FROM telemetry_rollups") == 0
        assert store.aggregate((), bucket_s=3600) != []  # fleet hour tier kept


def test_a_redelivered_window_is_stored_once_before_and_after_its_rollup(new_database: Any) -> None:
    with open_store(new_database()) as store:
        first = window(1, start=D0)
        assert store.add_windows([first, window(2, start=D0 + dt.timedelta(seconds=10))]) == 2
        assert store.add_windows([first]) == 0  # raw row still there
        store.apply_retention(dt.timedelta(0), now=D0 + DAY)
        assert store.add_windows([first]) == 0  # rolled up: the rolled seqs remember it
        (device,) = store.aggregate(("device",))
        assert device.windows == 2
        assert store.device_summaries()[0].windows == 2


def test_a_store_made_natively_stays_native_when_timescaledb_appears(new_database: Any) -> None:
    from edgekit.fleet.store.postgres import PostgresStore

    url = new_database()
    with PostgresStore(url, timescaledb="off") as store:
        _seed(store, days=1)
    with PostgresStore(url) as reopened:
        assert reopened.layout == timescale.NATIVE
        assert "laid out natively before; the extension is not created for it" in reopened.timescale_detection.reason
        assert len(reopened.device_summaries()) == 3
        reopened.apply_retention(dt.timedelta(0), now=D0 + 3 * DAY, rollups_for=DAY)  # drops partitions as before
        assert _scalar(reopened, "SELECT COUNT(*) FROM telemetry_rollups") == 0


def test_a_server_without_timescaledb_preloaded_gets_the_native_layout(postgres_url: str) -> None:
    """The shared test server: TimescaleDB not installed, or installed but not preloaded; either way native, said why."""
    with open_store(postgres_url) as store:
        assert (store.layout, store.timescale_detection.path) == ("native", "native")  # type: ignore[attr-defined]
        assert store.timescale_detection.reason in (  # type: ignore[attr-defined]
            "the server has no timescaledb extension installed (pg_available_extensions)",
        ) or "does not preload it" in store.timescale_detection.reason  # type: ignore[attr-defined]
        assert store.storage_layout() == {"layout": "native", "detected": store.timescale_detection.reason,  # type: ignore[attr-defined]
                                          "retention_policies": {}, "hour_tier": "table", "refresh_policies": {}}
        assert _scalar(store, "SELECT relkind FROM pg_class WHERE oid = to_regclass('telemetry_rollups')") == "p"
