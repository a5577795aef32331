"""Retention at fleet scale (issue 27): raw windows roll up in short batches, rollups are kept by time (PostgreSQL:
daily partitions dropped whole), and the aggregates every read uses do not move when raw windows go."""

from __future__ import annotations

import datetime as dt

import pytest

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store import retention
from tests.fleet.messages import T0, window

DAY = dt.timedelta(days=1)
D0 = T0.replace(hour=0)  # a UTC midnight: each test day is one PostgreSQL partition


def _days_of_windows(store: FleetStore, days: int, per_day: int = 6) -> None:
    """``per_day`` windows of dev-1 a day, ``days`` UTC days from D0 (one every 4 hours)."""
    windows = [window(day * per_day + i + 1, start=D0 + day * DAY + i * dt.timedelta(hours=4))
               for day in range(days) for i in range(per_day)]  # fmt: skip
    store.add_windows(windows)


def _rollup_rows(store: FleetStore) -> int:
    return int(store._query("test", "SELECT COUNT(*) FROM telemetry_rollups")[0][0])  # type: ignore[attr-defined]


def test_retention_in_batches_keeps_every_total(store: FleetStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "RETENTION_BATCH_ROWS", 5)  # 18 windows: four batches, one transaction each
    _days_of_windows(store, 3)
    before = [(a.windows, a.inferences, a.p99_ms) for a in store.aggregate(("bundle_id",))]
    summary = store.device_summaries()[0]
    assert store.apply_retention(dt.timedelta(0), rollup_minutes=5, now=D0 + 4 * DAY) == 18
    assert list(store.windows()) == []
    assert [(a.windows, a.inferences, a.p99_ms) for a in store.aggregate(("bundle_id",))] == before
    (device,) = store.aggregate(("device",), devices=[("lab", "dev-1")])  # per device: from the rollups
    assert (device.windows, device.inferences) == (18, before[0][1])
    after = store.device_summaries()[0]
    assert (after.windows, after.missing_seqs, after.p99_ms) == (summary.windows, 0, summary.p99_ms)


def test_rollup_retention_forgets_old_days_and_keeps_the_hourly_fleet_figures(store: FleetStore) -> None:
    _days_of_windows(store, 3)
    store.apply_retention(dt.timedelta(0), rollup_minutes=5, now=D0 + 4 * DAY)
    assert _rollup_rows(store) == 18
    hours_before = store.aggregate((), bucket_s=3600)
    # keep two days back from D0 + 3 days: day 0 goes, days 1 and 2 stay
    store.apply_retention(dt.timedelta(0), rollup_minutes=5, now=D0 + 3 * DAY, rollups_for=2 * DAY)
    assert _rollup_rows(store) == 12
    (device,) = store.aggregate(("device",), devices=[("lab", "dev-1")])
    assert device.windows == 12  # one device's history is its rollups
    assert store.aggregate((), bucket_s=3600) == hours_before  # the fleet hour tier is kept
    assert store.aggregate((), since=D0, until=D0 + DAY, bucket_s=60) == []  # minute tier forgotten with the rollups
    assert store.device_summaries()[0].windows == 18  # totals over all history
    with pytest.raises(StoreError, match=r"rollup retention time must be a non-negative timedelta, got datetime.timedelta\(days=-1\)"):
        store.apply_retention(dt.timedelta(0), rollups_for=-DAY)


def test_postgresql_rollups_live_in_daily_partitions(postgres_url: str) -> None:
    """SQLite deletes old rollups in batches (the test above); PostgreSQL drops whole days."""
    from edgekit.fleet.store import partitions

    with open_store(postgres_url) as store:
        _days_of_windows(store, 3)
        store.apply_retention(dt.timedelta(0), rollup_minutes=5, now=D0 + 4 * DAY)
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            assert [day for _, day in partitions.partitions(cursor, "telemetry_rollups")] == [D0 + n * DAY for n in range(3)]  # fmt: skip
            cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass('telemetry_rollups')")
            assert cursor.fetchone()[0] == "p"
        store.apply_retention(dt.timedelta(0), now=D0 + 3 * DAY, rollups_for=2 * DAY)
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            assert len(partitions.partitions(cursor, "telemetry_rollups")) == 2  # day 0 dropped whole
        assert _rollup_rows(store) == 12


def test_collect_refuses_a_negative_rollup_retention(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from edgekit.cli.main import main

    code = main(["fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--store", f"sqlite:///{tmp_path / 'f.db'}",
                 "--rollup-retention-days", "-2"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--rollup-retention-days must be >= 0, got -2" in err and "0 keeps rollups forever" in err


def test_a_new_sqlite_store_gives_freed_pages_back_after_retention(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "fleet.db"
    with open_store(f"sqlite:///{path}") as store:
        store.add_windows([window(seq, start=D0 + seq * dt.timedelta(seconds=10)) for seq in range(1, 3001)])
        connection = store._connection  # type: ignore[attr-defined]
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the windows into the database file
        grown = path.stat().st_size
        assert store.apply_retention(dt.timedelta(0), now=D0 + DAY) == 3000
        assert connection.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        assert connection.execute("PRAGMA freelist_count").fetchone()[0] == 0
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert path.stat().st_size < grown / 2, (grown, path.stat().st_size)


def test_a_store_opens_for_reading_while_a_writer_holds_the_lock(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A retention pass holds SQLite's write lock a few seconds a batch (longer than the busy timeout on a
    loaded host, with 10,000 devices of history): `fleet status` and the dashboard, which open the store
    meanwhile, read the schema version from a snapshot instead of waiting for the lock."""
    import sqlite3

    from edgekit.fleet.store import sqlite as sqlite_store

    path = tmp_path / "fleet.db"
    with open_store(f"sqlite:///{path}") as store:
        store.add_windows([window(seq, start=D0 + seq * dt.timedelta(minutes=5)) for seq in range(1, 13)])
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.2)  # what waiting for the writer would run into
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # the write lock, as a retention batch or the collector holds it
    try:
        with open_store(f"sqlite:///{path}") as reader:
            assert reader.device_counts()  # and it reads: the devices' states from the same snapshot
            rows = reader._query("test", "SELECT COUNT(*) FROM telemetry_windows")  # type: ignore[attr-defined]
            assert rows[0][0] == 12
        with pytest.raises(StoreError, match="is busy while"):  # a writer still waits for the lock, and says so
            with open_store(f"sqlite:///{path}") as blocked:
                blocked.add_windows([window(13, start=D0 + 13 * dt.timedelta(minutes=5))])
    finally:
        writer.execute("ROLLBACK")
        writer.close()
