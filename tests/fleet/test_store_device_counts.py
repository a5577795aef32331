"""The fleet aggregates' ``windows`` and ``devices`` on SQLite and a real PostgreSQL: a bucket whose windows arrived
out of order (spool replay) is still read, and a store upgraded from before the aggregates (schema version 7)
counts its devices in the history it summed in, rollups and raw windows alike. PostgreSQL inserts a batch's windows
in key order, so collectors writing the same windows in different orders cannot deadlock. Retention rolls up
windows from a device clock set ahead by when they were received."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Sequence

from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.migrate import AGGREGATES_VERSION, latest_version
from tests.fleet.messages import T0, WINDOW_S, window

UTC = dt.timezone.utc
SECOND = dt.timedelta(seconds=1)
MINUTE = dt.timedelta(minutes=1)
AGGREGATE_TABLES = ("device_latest", "fleet_buckets", "fleet_model_buckets", "device_bundles")


def _per_bucket(store: FleetStore, bucket_s: int) -> list[tuple[dt.datetime | None, int, int]]:
    return [(a.bucket_start, a.devices, a.windows) for a in store.aggregate(("fleet",), bucket_s=bucket_s)]


def test_a_bucket_of_windows_that_arrived_out_of_order_is_read(store: FleetStore) -> None:
    # minute 5 first, then the spool replays minute 1: its bucket counts no new device, but holds a window
    assert store.add_windows([window(5, start=T0 + 5 * MINUTE)]) == 1
    assert store.add_windows([window(1, start=T0 + MINUTE)]) == 1
    assert [(start, windows) for start, _, windows in _per_bucket(store, 60)] == [(T0 + MINUTE, 1), (T0 + 5 * MINUTE, 1)]
    assert [(a.windows, a.inferences) for a in store.aggregate(("fleet",))] == [(2, 10)]
    per_device = store.aggregate(("fleet",), devices=[("lab", "dev-1")], bucket_s=60)
    assert [(a.bucket_start, a.windows) for a in per_device] == [(T0 + MINUTE, 1), (T0 + 5 * MINUTE, 1)]


def test_a_store_upgraded_from_before_the_aggregates_counts_its_devices_in_rolled_up_history(store_url: str) -> None:
    devices = ("dev-1", "dev-2")
    with open_store(store_url) as store:
        store.add_windows([window(seq, device=d) for d in devices for seq in range(1, 61)])  # 10 minutes of each
        # the first 6 minutes rolled up, the rest raw
        store.apply_retention(dt.timedelta(minutes=4), rollup_minutes=1, now=T0 + 10 * MINUTE)
        expected = _per_bucket(store, 300)
        assert [devices_ for _, devices_, _ in expected] == [2, 2]
        with store._transaction("taking the store back to version 6") as cursor:  # type: ignore[attr-defined]
            for table in AGGREGATE_TABLES:
                cursor.execute(f"DROP TABLE {table}")
            cursor.execute(f"DELETE FROM schema_version WHERE version >= {AGGREGATES_VERSION}")
    with open_store(store_url) as store:
        assert store.schema_version == latest_version(store.dialect)  # type: ignore[attr-defined]
        assert _per_bucket(store, 300) == expected
        assert [(a.devices, a.windows) for a in store.aggregate(("fleet",), bucket_s=60)] == [(2, 12)] * 10
        assert [(s.device, s.windows) for s in store.device_summaries()] == [(d, 60) for d in devices]
        assert WINDOW_S == 10  # 6 windows a minute, as the counts above assume


def test_postgres_inserts_a_batch_in_key_order(postgres_url: str) -> None:
    """Two collectors inserting overlapping windows each take the keys' locks in one order: no deadlock."""
    with open_store(postgres_url) as store:
        inserts: list[list[tuple[str, str, int]]] = []
        execute_rows = store.execute_rows  # type: ignore[attr-defined]

        def recording(cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str = "", **options: Any) -> Any:
            if "INTO telemetry_windows" in head:
                inserts.append([(row[0], row[1], row[2]) for row in rows])
            return execute_rows(cursor, head, rows, tail, **options)

        store.execute_rows = recording  # type: ignore[attr-defined]
        batch = [window(seq, device=d) for seq in range(1, 6) for d in ("dev-2", "dev-1", "dev-3")]
        assert store.add_windows(list(reversed(batch))) == 15
        assert inserts == [sorted((w.fleet, w.device, w.seq) for w in batch)]



def test_retention_rolls_up_windows_from_a_device_clock_set_ahead_once_received_long_enough_ago(store: FleetStore) -> None:
    now = dt.datetime.now(UTC).replace(microsecond=0)
    ahead = now.replace(year=now.year + 70)  # the device's clock; the collector received the windows 3 days ago
    received = now - dt.timedelta(days=3)
    late = [dataclasses.replace(window(seq, device="ahead", start=ahead + seq * WINDOW_S * SECOND), received_at=received)
            for seq in range(1, 7)]  # fmt: skip
    fresh = [dataclasses.replace(window(7, device="ahead", start=ahead + 7 * WINDOW_S * SECOND), received_at=now)]
    assert store.add_windows(late + fresh) == 7
    assert store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=now) == 6
    assert [w.seq for w in store.windows()] == [7]  # received within the raw retention: still raw
    (rolled,) = store.aggregate(("device",), devices=[("lab", "ahead")])
    assert (rolled.windows, rolled.inferences) == (7, 35)
    assert [(m.windows, m.inferences) for m in store.model_aggregate(("model",), devices=[("lab", "ahead")])] == [(7, 35)]
    assert store.add_windows(late) == 0  # redeliveries of what was rolled up stay out
    with store._transaction("counting model windows", write=False) as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT seq FROM telemetry_model_windows")
        assert [int(seq) for (seq,) in cursor.fetchall()] == [7]
