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
    # no background workers: the tests seed days in the past, which a policy job started by the clock would drop or
    # refresh behind the test's back; the tests run the jobs themselves (run_job) where that is the point
    server = Postgres(parent / "pg", settings=(
        "shared_preload_libraries=timescaledb", "timescaledb.telemetry_level=off", "max_worker_processes=16",
        "timescaledb.max_background_workers=0"))
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


def test_the_hour_tier_is_a_real_time_continuous_aggregate_of_the_minute_tier(new_database: Any) -> None:
    from edgekit.fleet.store import timescale_aggregates

    with open_store(new_database()) as store:
        layout = store.storage_layout()  # type: ignore[attr-defined]
        assert (layout["hour_tier"], layout["refresh_policies"]) == (
            "continuous aggregate", {"fleet_hour_buckets": None, "fleet_model_hour_buckets": None})  # fmt: skip
        rows = store._query("test", "SELECT view_name, materialized_only, hypertable_name "  # type: ignore[attr-defined]
                            "FROM timescaledb_information.continuous_aggregates ORDER BY 1")  # fmt: skip
        assert rows == [("fleet_hour_buckets", False, "fleet_minute_buckets"),
                        ("fleet_model_hour_buckets", False, "fleet_model_minute_buckets")]  # fmt: skip
        for view in timescale_aggregates.TIERED:  # the reads' tables are views: minutes UNION ALL hours
            assert _scalar(store, f"SELECT relkind FROM pg_class WHERE oid = to_regclass('{view}')") == "v"
        _seed(store, days=1)
        assert _scalar(store, "SELECT COUNT(*) FROM fleet_minute_buckets WHERE bucket_s <> 60") == 0  # ingest writes minutes


def _dense(store: FleetStore, first_seq: int = 1) -> None:
    """3 devices, a window every 10 minutes for 6 hours: each hour holds 6 minutes of each device."""
    store.add_windows([window(first_seq + i, device=f"dev-{d}", start=D0 + i * dt.timedelta(minutes=10),
                              latencies_ms=(1.0 + d, 2.0 + i % 7, 5.0 * d))
                       for d in range(1, 4) for i in range(36)])  # fmt: skip


def test_hours_count_distinct_devices_and_match_native_before_and_after_refresh_and_late_windows(new_database: Any) -> None:
    from edgekit.fleet.store import timescale_aggregates
    from edgekit.fleet.store.postgres import PostgresStore

    native = PostgresStore(new_database(), timescaledb="off")
    timescaled = PostgresStore(new_database())
    try:
        for store in (native, timescaled):
            _dense(store)
        hours = timescaled.aggregate((), bucket_s=3600)
        assert [(h.devices, h.windows) for h in hours] == [(3, 18)] * 6  # not the 18 device-minutes summed
        assert _scalar(timescaled, "SELECT SUM(devices) FROM fleet_minute_buckets") == 108  # minutes: 3 devices x 36
        assert _reads(timescaled) == _reads(native)  # nothing materialized yet: real-time aggregation
        with timescaled._transaction("test", write=False) as cursor:  # type: ignore[attr-defined]
            assert timescale_aggregates.watermark(cursor) is None
        timescaled._refresh_hours(None, D0 + dt.timedelta(hours=4))  # type: ignore[attr-defined]  # what the policy does
        with timescaled._transaction("test", write=False) as cursor:  # type: ignore[attr-defined]
            assert timescale_aggregates.watermark(cursor) == D0 + dt.timedelta(hours=4)
        assert _scalar(timescaled, "SELECT COUNT(*) FROM _timescaledb_catalog.continuous_agg c JOIN "
                                   "timescaledb_information.chunks k ON k.hypertable_name = "
                                   "(SELECT table_name FROM _timescaledb_catalog.hypertable WHERE id = c.mat_hypertable_id)") == 2  # fmt: skip
        assert _reads(timescaled) == _reads(native)  # four hours materialized, two computed at read time
        for store in (native, timescaled):  # a late window (spool replay) of dev-1 in a materialized hour, and a new device
            assert store.add_windows([window(100, device="dev-1", start=D0 + dt.timedelta(minutes=65), latencies_ms=(40.0,)),
                                      window(1, device="dev-9", start=D0 + dt.timedelta(minutes=70), latencies_ms=(7.0,))]) == 2  # fmt: skip
        assert [(h.devices, h.windows) for h in timescaled.aggregate((), bucket_s=3600)][1] == (4, 20)
        assert _reads(timescaled) == _reads(native)
    finally:
        native.close()
        timescaled.close()


def test_retention_bounds_the_refresh_policy_and_the_hour_tier_outlives_its_minutes(new_database: Any) -> None:
    from edgekit.fleet.store.postgres import PostgresStore

    native = PostgresStore(new_database(), timescaledb="off")
    timescaled = PostgresStore(new_database())
    try:
        for store in (native, timescaled):
            _seed(store, days=3)
            store.apply_retention(dt.timedelta(0), now=D0 + 3 * DAY + dt.timedelta(hours=2), rollups_for=DAY + dt.timedelta(hours=2))
        # minutes before D0 + 2 days are gone on both (a chunk dropped, the rest hidden); every hour is kept
        assert _reads(timescaled) == _reads(native)
        assert len(timescaled.aggregate((), bucket_s=3600)) == 18
        assert timescaled.aggregate((), since=D0, until=D0 + 2 * DAY, bucket_s=60) == []
        assert _scalar(timescaled, "SELECT COUNT(*) FROM timescaledb_information.chunks "
                                   "WHERE hypertable_name = 'fleet_minute_buckets'") == 1  # fmt: skip
        assert timescaled.storage_layout()["refresh_policies"] == {  # type: ignore[attr-defined]
            "fleet_hour_buckets": "25:00:00", "fleet_model_hour_buckets": "25:00:00"}  # the retention less an hour
        _run_jobs(timescaled, "policy_refresh_continuous_aggregate")  # the policy, run now, recomputes no dropped hour
        assert _reads(timescaled) == _reads(native)
        for store in (native, timescaled):  # the next day's retention: the hours stay, again
            store.apply_retention(dt.timedelta(0), now=D0 + 4 * DAY + dt.timedelta(hours=2), rollups_for=DAY + dt.timedelta(hours=2))
        assert _reads(timescaled) == _reads(native)
        assert len(timescaled.aggregate((), bucket_s=3600)) == 18
        timescaled.apply_retention(dt.timedelta(0), now=D0 + 4 * DAY, rollups_for=dt.timedelta(hours=2))
        assert timescaled.storage_layout()["refresh_policies"] == {}  # type: ignore[attr-defined]  # too short for a policy
        assert len(timescaled.aggregate((), bucket_s=3600)) == 18
    finally:
        native.close()
        timescaled.close()


def _run_jobs(store: FleetStore, proc_name: str) -> None:
    for (job_id,) in store._query("test", "SELECT job_id FROM timescaledb_information.jobs WHERE proc_name = %s",  # type: ignore[attr-defined]
                                  (proc_name,)):  # fmt: skip
        with store._lock:  # type: ignore[attr-defined]  # a procedure that commits: outside a transaction
            store._cursor().execute(f"CALL {store.timescale_detection.schema}.run_job({job_id})")  # type: ignore[attr-defined]


def test_raw_windows_keep_one_row_per_seq_which_a_hypertable_key_would_not(new_database: Any) -> None:
    """Why raw windows are not a hypertable (docs/fleet.md): its unique key would need the window's time, and then a
    second window with a stored seq but another start (a device whose seqs started again while the first is still
    raw) would be stored beside it; every reader of raw windows (missing seqs, the rolled-seq runs) takes a seq as
    one window."""
    with open_store(new_database()) as store:
        assert store.add_windows([window(1, start=D0)]) == 1
        assert store.add_windows([window(1, start=D0 + dt.timedelta(minutes=5))]) == 0
        assert _scalar(store, "SELECT COUNT(*) FROM telemetry_windows") == 1
        assert [c for c in store._query("test", "SELECT a.attname FROM pg_index i JOIN pg_attribute a "  # type: ignore[attr-defined]
                                         "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                                         "WHERE i.indrelid = 'telemetry_windows'::regclass AND i.indisprimary")] == [
            ("fleet",), ("device",), ("seq",)]  # fmt: skip
