"""Per-model telemetry in the fleet store (issue 20), on SQLite and a real PostgreSQL: windows of agents serving
several models go in through the collector's parser, per-model aggregates group by model and bundle, retention
keeps the model, redeliveries count once, and a store migrated from version 5 keeps its windows under model ''."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest
from edgekit_runtime.agent.telemetry import encode_message

from edgekit.fleet.errors import StoreError
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import FleetStore, TelemetryWindow, open_store
from edgekit.fleet.store.migrate import latest_version, migrations
from tests.fleet.messages import T0, WINDOW_S, window
from tests.fleet.model_messages import model_entry, model_telemetry

DETECTOR = ("detector", "yolo-int8-1", (8.0, 9.0, 10.0, 11.0))  # 4 inferences a window, p50 ~9.5
CLASSIFIER = ("classifier", "mobilenet-fp16-2", (2.0, 2.0))  # 2 inferences a window


def _parsed(message: dict) -> TelemetryWindow:
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"]))  # fmt: skip
    assert isinstance(record, TelemetryWindow), record
    return record


def _repository_windows(device: str, seqs: range) -> list[TelemetryWindow]:
    entries = [model_entry(name, bundle, latencies) for name, bundle, latencies in (DETECTOR, CLASSIFIER)]
    return [_parsed(model_telemetry(seq, entries, device=device)) for seq in seqs]


def _fill(store: FleetStore) -> None:
    store.add_windows(_repository_windows("cam-1", range(1, 31)) + _repository_windows("cam-2", range(1, 31)))
    store.add_windows([window(seq, device="old-1") for seq in range(1, 31)])  # an agent naming no model


def test_windows_carry_their_model_and_models(store: FleetStore) -> None:
    _fill(store)
    (first,) = list(store.windows(device="cam-1", limit=1))
    assert first.model == "detector" and first.bundle_id == "yolo-int8-1"
    assert [w.model for w in store.windows(device="old-1", limit=2)] == [None, None]


def test_model_aggregate_groups_by_model_and_bundle(store: FleetStore) -> None:
    _fill(store)
    groups = {(g.model, g.bundle_id): g for g in store.model_aggregate()}
    assert sorted(groups, key=str) == [("classifier", "mobilenet-fp16-2"), ("detector", "yolo-int8-1"),
                                       (None, "minilm-int8-a")]  # fmt: skip
    detector = groups[("detector", "yolo-int8-1")]
    assert (detector.devices, detector.windows, detector.inferences, detector.errors) == (2, 60, 240, 0)
    assert detector.p50_ms == pytest.approx(9.5, abs=0.6)
    assert detector.throughput_per_s == pytest.approx(4 / WINDOW_S)
    assert detector.memory_mb_max == 40.0
    classifier = groups[("classifier", "mobilenet-fp16-2")]
    assert (classifier.devices, classifier.inferences, classifier.p50_ms) == (2, 120, pytest.approx(2.0))
    unnamed = groups[(None, "minilm-int8-a")]
    assert (unnamed.devices, unnamed.inferences) == (1, 150)  # 5 latencies a window
    # per device, one model, in buckets
    per_device = store.model_aggregate(("device", "model"), model="classifier")
    assert [(g.device, g.model, g.windows) for g in per_device] == [("cam-1", "classifier", 30), ("cam-2", "classifier", 30)]
    buckets = store.model_aggregate(("model",), model="detector", devices=[("lab", "cam-1")], bucket_s=60)
    assert [b.windows for b in buckets] == [6] * 5
    assert buckets[0].bucket_start == T0
    with pytest.raises(StoreError, match="cannot aggregate models by"):
        store.model_aggregate(("power_mode",))


def test_retention_keeps_the_model_and_redeliveries_count_once(store: FleetStore) -> None:
    _fill(store)

    def figures() -> dict:
        return {(g.device, g.model): (g.windows, g.inferences, round(g.p50_ms or 0, 6), g.p99_max_ms)
                for g in store.model_aggregate(("device", "model"))}  # fmt: skip

    before = figures()
    now = T0 + dt.timedelta(minutes=3, hours=1)
    assert store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=now) == 3 * 17
    assert figures() == before
    store.add_windows(_repository_windows("cam-1", range(1, 11)))  # redelivered after their rollup
    assert figures() == before
    store.apply_retention(dt.timedelta(0), rollup_minutes=1, now=now)
    assert figures() == before
    assert [b.windows for b in store.model_aggregate(("model",), model="detector", bucket_s=60)] == [12] * 5


def test_a_version_5_store_migrates_with_its_windows_under_no_model(tmp_path: Path) -> None:
    """Windows stored (and rolled up) before version 6 count under model '' (shown as None)."""
    path = tmp_path / "v5.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for migration in migrations("sqlite")[:5]:
        connection.executescript(migration.sql)
        connection.execute("INSERT INTO schema_version VALUES (?, ?, 'then')", (migration.version, migration.name))
    for seq in range(1, 13):
        w = window(seq, device="old-1")
        connection.execute(
            "INSERT INTO telemetry_windows (fleet, device, seq, window_start, window_end, received_at, bundle_id, "
            "inferences, errors, p50_ms, p99_ms, throughput_per_s, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '{}')",
            (w.fleet, w.device, w.seq, w.window_start.timestamp(), w.window_end.timestamp(), w.received_at.timestamp(),
             w.bundle_id, w.count, w.errors, w.p50_ms, w.p99_ms, w.throughput_per_s))  # fmt: skip
    connection.commit()
    connection.close()
    with open_store(f"sqlite:///{path}") as store:
        assert store.schema_version == latest_version("sqlite") >= 6
        (before,) = store.model_aggregate()
        assert (before.model, before.bundle_id, before.windows, before.inferences) == (None, "minilm-int8-a", 12, 60)
        store.apply_retention(dt.timedelta(0), rollup_minutes=1, now=T0 + dt.timedelta(hours=1))
        (after,) = store.model_aggregate()
        assert (after.windows, after.inferences, after.p50_ms) == (12, 60, pytest.approx(before.p50_ms))


def test_migration_6_runs_again_without_counting_twice(store_url: str) -> None:
    """A store taken back below version 6 re-applies it: windows already per model are not added again under ''."""
    with open_store(store_url) as store:
        _fill(store)
        store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=T0 + dt.timedelta(minutes=3, hours=1))
        before = [(g.model, g.windows, g.inferences) for g in store.model_aggregate(("model",))]
        with store._transaction("test") as cursor:  # type: ignore[attr-defined]
            cursor.execute("DELETE FROM schema_version WHERE version >= 6")
    with open_store(store_url) as store:
        assert [(g.model, g.windows, g.inferences) for g in store.model_aggregate(("model",))] == before
