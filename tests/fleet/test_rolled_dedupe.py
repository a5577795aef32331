"""Deduplication survives roll-ups: a window redelivered after retention rolled it up is not stored or counted
again, on SQLite and a real PostgreSQL (the ``store`` fixture is parametrised)."""

from __future__ import annotations

import datetime as dt

import pytest

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.migrate import latest_version
from edgekit.fleet.store.sql import RolledSeqs, merge_rolled_seqs
from tests.fleet.messages import BUNDLE_B, T0, WINDOW_S, window

HOUR = dt.timedelta(hours=1)
NOW = T0 + dt.timedelta(days=1)


def _totals(store: FleetStore, device: str = "dev-1") -> tuple[int, int]:
    (found,) = store.aggregate(("device",), devices=[("lab", device)])
    return found.windows, found.inferences


def _rolled_rows(store: FleetStore) -> list[tuple[str, int, int]]:
    rows = store._query("test", "SELECT device, seq_first, seq_last FROM telemetry_rolled_seqs "  # type: ignore[attr-defined]
                        "ORDER BY device, seq_first")  # fmt: skip
    return [(device, int(first), int(last)) for device, first, last in rows]


def test_windows_redelivered_after_their_rollup_are_not_counted_again(store: FleetStore) -> None:
    batch = [window(seq) for seq in range(1, 51)]  # 5 inferences a window
    assert store.add_windows(batch) == 50
    assert store.apply_retention(HOUR, rollup_minutes=5, now=NOW) == 50
    assert list(store.windows()) == []
    assert _totals(store) == (50, 250)
    assert store.add_windows(batch) == 0  # the same windows again: QoS 1 redelivery or spool replay
    assert store.add_windows([window(7), window(51)]) == 1  # mixed with a new one: only that is stored
    assert store.apply_retention(HOUR, rollup_minutes=5, now=NOW) == 1
    assert _totals(store) == (51, 255)
    (summary,) = store.device_summaries()
    assert (summary.windows, summary.missing_seqs) == (51, 0)
    assert _rolled_rows(store) == [("dev-1", 1, 51)]  # one row for the device


def test_a_late_window_in_a_gap_is_stored_and_closes_the_gap(store: FleetStore) -> None:
    store.add_windows([window(seq) for seq in range(1, 21) if seq not in (8, 9)])
    store.apply_retention(HOUR, now=NOW)
    assert _rolled_rows(store) == [("dev-1", 1, 7), ("dev-1", 10, 20)]
    assert store.add_windows([window(8), window(9), window(10)]) == 2  # 8 and 9 never arrived; 10 did
    assert store.apply_retention(HOUR, now=NOW) == 2
    assert _rolled_rows(store) == [("dev-1", 1, 20)]
    assert _totals(store) == (20, 100)
    assert store.device_summaries()[0].missing_seqs == 0


def test_a_device_that_starts_its_seqs_again_is_not_taken_for_a_redelivery(store: FleetStore) -> None:
    store.add_windows([window(seq) for seq in range(1, 11)])
    store.apply_retention(HOUR, now=NOW)
    # Reflashed: seq 1 again, but a window that ends after every rolled-up one cannot be one of them.
    later = T0 + dt.timedelta(hours=3)
    assert store.add_windows([window(1, start=later), window(2, start=later + dt.timedelta(seconds=WINDOW_S))]) == 2
    assert store.add_windows([window(2, start=later + dt.timedelta(seconds=WINDOW_S))]) == 0  # raw: the key holds
    assert [w.seq for w in store.windows()] == [1, 2]
    store.apply_retention(HOUR, now=NOW)
    assert _totals(store) == (12, 60)
    assert store.add_windows([window(1, start=later), window(5)]) == 0  # both rolled up now


def test_a_device_that_starts_its_seqs_again_while_its_windows_are_raw_is_stored(store: FleetStore) -> None:
    # A new spool (a damaged one moved away, a reflashed device) starts at seq 1 within the raw retention: its
    # windows start after the held ones with those seqs ended, so they are new, and were once acked unstored.
    store.add_windows([window(seq) for seq in range(1, 11)] + [window(seq, device="dev-2") for seq in range(1, 4)])
    later = T0 + dt.timedelta(seconds=WINDOW_S * 12)
    again = [window(1, start=later, bundle=BUNDLE_B), window(2, start=later + dt.timedelta(seconds=WINDOW_S), bundle=BUNDLE_B)]
    assert store.add_windows(again) == 2
    summary = next(s for s in store.device_summaries() if s.device == "dev-1")
    assert summary.bundle_id == BUNDLE_B.id  # the newest window's figures, though its seq is lower than the old ones
    # The old windows from the first new seq on were rolled up early, to make room: counted once, still deduplicated.
    assert [(w.device, w.seq, w.window_start) for w in store.windows()] == [
        ("dev-1", 1, later), ("dev-1", 2, later + dt.timedelta(seconds=WINDOW_S)),
        ("dev-2", 1, T0), ("dev-2", 2, T0 + dt.timedelta(seconds=WINDOW_S)),
        ("dev-2", 3, T0 + dt.timedelta(seconds=2 * WINDOW_S))]  # fmt: skip
    assert _rolled_rows(store) == [("dev-1", 1, 10)]
    assert _totals(store) == (12, 60)
    model_rows = store._query("test", "SELECT seq FROM telemetry_model_windows WHERE device = 'dev-1' "  # type: ignore[attr-defined]
                              "ORDER BY seq")  # fmt: skip
    assert [int(seq) for (seq,) in model_rows] == [1, 2]  # the new windows' model rows, not the old ones'
    assert store.add_windows([window(5), window(1), again[1]]) == 0  # redeliveries of either spool's windows
    assert store.add_windows([window(3, start=later + dt.timedelta(seconds=2 * WINDOW_S))]) == 1
    assert _totals(store) == (13, 65)
    store.apply_retention(HOUR, now=NOW)
    assert _totals(store) == (13, 65) and _totals(store, "dev-2") == (3, 15)
    assert _rolled_rows(store) == [("dev-1", 1, 10), ("dev-2", 1, 3)]
    assert store.add_windows([window(3, start=later + dt.timedelta(seconds=2 * WINDOW_S)), window(9)]) == 0


def test_a_reflashed_device_whose_clock_is_behind_its_raw_windows_is_stored(store: FleetStore) -> None:
    # Reflashed, seqs from 1 again, the clock not set yet (a board without RTC): its windows start before the held
    # ones with those seqs ended, but they are not those windows (a redelivery has the held window's times).
    store.add_windows([window(seq) for seq in range(1, 11)])
    behind = T0 - dt.timedelta(days=10)
    again = [window(seq, start=behind + (seq - 1) * dt.timedelta(seconds=WINDOW_S), bundle=BUNDLE_B) for seq in (1, 2, 3)]
    assert store.add_windows(again) == 3
    assert store.add_windows(again + [window(2), window(7)]) == 0  # redeliveries of either spool's windows
    # the old windows they replaced were rolled up (counted once, remembered); the others stay raw
    assert [(w.seq, w.bundle_id) for w in store.windows()] == [(1, BUNDLE_B.id), (2, BUNDLE_B.id), (3, BUNDLE_B.id)] + [
        (seq, "minilm-int8-a") for seq in range(4, 11)]  # fmt: skip
    assert _rolled_rows(store) == [("dev-1", 1, 3)]
    assert _totals(store) == (13, 65)


def test_gaps_older_than_the_horizon_close_and_other_devices_are_kept_apart(store: FleetStore) -> None:
    store.add_windows([window(seq) for seq in (1, 2, 3, 6, 7)] + [window(seq, device="dev-2") for seq in (1, 5)])
    store.apply_retention(HOUR, now=NOW, gaps_open_for=dt.timedelta(days=7))
    assert _rolled_rows(store) == [("dev-1", 1, 3), ("dev-1", 6, 7), ("dev-2", 1, 1), ("dev-2", 5, 5)]
    store.add_windows([window(8)])  # dev-1 only: its gap is looked at again, eight days on
    store.apply_retention(HOUR, now=NOW + dt.timedelta(days=8), gaps_open_for=dt.timedelta(days=7))
    assert _rolled_rows(store) == [("dev-1", 1, 8), ("dev-2", 1, 1), ("dev-2", 5, 5)]
    assert store.add_windows([window(4)]) == 0  # too late: taken for a redelivery
    assert store.add_windows([window(3, device="dev-2")]) == 1  # dev-2's gap is still open
    with pytest.raises(StoreError, match="gaps_open_for must be a non-negative timedelta, got 7"):
        store.apply_retention(HOUR, gaps_open_for=7)  # type: ignore[arg-type]


def test_merging_runs_touching_overlapping_and_across_old_gaps() -> None:
    old, new, cutoff = 1.0, 10.0, 5.0
    runs = [RolledSeqs(10, 12, 3.0, new), RolledSeqs(1, 4, 1.0, old), RolledSeqs(5, 6, 2.0, new),
            RolledSeqs(3, 5, 1.5, old), RolledSeqs(20, 25, 4.0, new)]  # fmt: skip
    assert merge_rolled_seqs(runs, cutoff) == [RolledSeqs(1, 6, 2.0, new), RolledSeqs(10, 12, 3.0, new),
                                               RolledSeqs(20, 25, 4.0, new)]  # fmt: skip
    assert merge_rolled_seqs(runs, 11.0) == [RolledSeqs(1, 25, 4.0, new)]  # every gap is old: one run
    assert merge_rolled_seqs([], cutoff) == []


def test_an_older_database_learns_its_rolled_seqs_from_its_rollups(store_url: str) -> None:
    with open_store(store_url) as store:
        store.add_windows([window(seq) for seq in range(1, 31)])
        store.apply_retention(HOUR, rollup_minutes=1, now=NOW)
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            # Back to schema version 2: rollups, but no record of the seqs they hold.
            cursor.execute("DROP TABLE telemetry_rolled_seqs")
            cursor.execute("DELETE FROM schema_version WHERE version >= 3")  # later migrations run again too
    with open_store(store_url) as store:
        assert store.schema_version == latest_version(store.dialect)  # type: ignore[attr-defined]
        assert _rolled_rows(store) == [("dev-1", 1, 6), ("dev-1", 7, 12), ("dev-1", 13, 18), ("dev-1", 19, 24),
                                       ("dev-1", 25, 30)]  # one per one-minute bucket  # fmt: skip
        assert store.add_windows([window(seq) for seq in range(1, 31)]) == 0
        store.add_windows([window(31)])
        store.apply_retention(HOUR, rollup_minutes=1, now=NOW)
        assert _rolled_rows(store) == [("dev-1", 1, 31)]
        assert _totals(store) == (31, 155)


def test_writers_and_retention_at_once_count_each_window_once(store_url: str) -> None:
    """A collector storing redelivered windows while another runs retention (two connections, two threads)."""
    import threading

    batch = [window(seq, device=f"dev-{seq % 3}") for seq in range(1, 301)]
    with open_store(store_url) as writer, open_store(store_url) as roller:
        writer.add_windows(batch[:150])
        stop = threading.Event()
        errors: list[BaseException] = []

        def roll() -> None:
            try:
                while not stop.is_set():
                    roller.apply_retention(dt.timedelta(0), now=NOW)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=roll)
        thread.start()
        try:
            for _ in range(4):  # everything again and again, in batches, while windows move to rollups
                for start in range(0, 300, 50):
                    writer.add_windows(batch[start:start + 50])
        finally:
            stop.set()
            thread.join(60)
        assert errors == []
        roller.apply_retention(dt.timedelta(0), now=NOW)
        found = {a.device: (a.windows, a.inferences) for a in roller.aggregate(("device",))}
    assert found == {f"dev-{d}": (100, 500) for d in range(3)}


def test_a_collector_does_not_count_windows_redelivered_after_its_rollup(fleet_broker, store: FleetStore) -> None:  # type: ignore[no-untyped-def]
    """The issue's case end to end: 50 windows (250 inferences) rolled up by the collector's own retention, then
    published again: still 50 / 250, and the collector counts 50 duplicates."""
    import time

    from edgekit.fleet.collector import Collector
    from edgekit_runtime.agent.telemetry import encode_message
    from tests.fleet.messages import Publisher, telemetry, topic

    messages = [(topic("telemetry", fleet="rolled"), encode_message(telemetry(seq, fleet="rolled")))
                for seq in range(1, 51)]  # fmt: skip
    collector = Collector(fleet_broker.url, store, client_id="rolled-dedupe", fleet="rolled", flush_interval_s=0.05,
                          retention=dt.timedelta(hours=1), retention_interval_s=0.2).start()  # fmt: skip
    try:
        with Publisher(fleet_broker) as device:
            device.publish_many(messages)
            deadline = time.monotonic() + 60  # a retention pass every 0.2 s; generous for a loaded CI host
            while (list(store.windows(fleet="rolled")) or not store.aggregate((), fleet="rolled")) \
                    and time.monotonic() < deadline:  # fmt: skip
                time.sleep(0.1)
            assert list(store.windows(fleet="rolled")) == [], "the collector's retention did not roll the windows up"
            device.publish_many(messages)  # the same 50 again, as a spool replay sends them
            deadline = time.monotonic() + 20
            while collector.metrics.snapshot()["received"].get("telemetry", 0) < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert collector.flush()
    finally:
        collector.stop()
    (totals,) = store.aggregate((), fleet="rolled")
    assert (totals.windows, totals.inferences) == (50, 250)
    assert collector.metrics.snapshot()["duplicates"]["telemetry"] == 50
