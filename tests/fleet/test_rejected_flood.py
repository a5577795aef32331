"""A flood of malformed messages does not grow the store (issue 28, item 9): the collector counts every
rejection per reason, but keeps a row for only a bounded sample (rows per reason, the first of each topic, and bytes
per window) and one summary row per reason for the rest. Real Mosquitto, real SQLite and PostgreSQL stores."""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.ingest import Rejection
from edgekit.fleet.rejected_samples import (LOG_EVERY, LOG_FIRST, LOG_LINES_PER_MINUTE, LOG_TOPICS, ROW_OVERHEAD_BYTES,
                                            SUMMARY_TOPIC, RejectedSampling, RejectionLog)
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker

MALFORMED, NO_SCHEMA, WINDOWS = 3000, 1000, 20


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _rows(store_url: str) -> list[tuple[str, str, str, int]]:
    """(topic, reason, detail, size_bytes) of every row of the rejected table."""
    if store_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as connection:
            return list(connection.execute("SELECT topic, reason, detail, size_bytes FROM rejected_messages"))
    import psycopg

    with psycopg.connect(store_url) as connection:
        return [tuple(row) for row in connection.execute("SELECT topic, reason, detail, size_bytes FROM rejected_messages")]  # type: ignore[misc]


def test_a_malformed_flood_keeps_counts_and_a_bounded_sample(fleet_broker: MosquittoBroker, store_url: str) -> None:
    sampling = RejectedSampling(rows_per_reason=5, max_bytes=4096, window_s=600.0)  # the whole flood in one window
    messages = [(topic("telemetry", device=f"d{i % 7}"), b"{not json " + b"x" * 900) for i in range(MALFORMED)]
    messages += [(topic("telemetry", device=f"d{i % 7}"), b'{"hello": "world"}') for i in range(NO_SCHEMA)]
    messages += [(topic("telemetry"), encode_message(telemetry(seq))) for seq in range(1, WINDOWS + 1)]
    with open_store(store_url) as store:
        collector = Collector(fleet_broker.url, store, client_id=f"flood-{time.monotonic_ns()}", flush_interval_s=0.05,
                              rejected_sampling=sampling).start()  # fmt: skip
        try:
            with Publisher(fleet_broker) as device:
                device.publish_many(messages)
            assert _wait_until(lambda: sum(collector.metrics.snapshot()["received"].values()) == len(messages))
            assert collector.flush()
        finally:
            collector.stop()  # writes the summaries of the open window
        # every rejection counted per reason, every valid window stored
        assert collector.metrics.snapshot()["rejected"] == {"malformed_json": MALFORMED, "unknown_schema": NO_SCHEMA}
        assert [w.seq for w in store.windows()] == list(range(1, WINDOWS + 1))
        rows = _rows(store_url)
        # the store's totals count every rejection too: a summary row stands for the messages kept without a row
        assert store.rejected_counts() == {"malformed_json": MALFORMED, "unknown_schema": NO_SCHEMA}
    kept = [row for row in rows if row[0] != SUMMARY_TOPIC]
    summaries = {row[1]: row for row in rows if row[0] == SUMMARY_TOPIC}
    # the first 5 of each reason, and the first of each other device's topic for that reason (7 devices)
    assert len(rows) == 16 and len(kept) == 14 and set(summaries) == {"malformed_json", "unknown_schema"}
    assert {(t, r) for t, r, _, _ in kept} == {(topic("telemetry", device=f"d{i}"), reason) for i in range(7)
                                                 for reason in ("malformed_json", "unknown_schema")}  # fmt: skip
    assert sum(len(t.encode()) + len(d.encode()) + ROW_OVERHEAD_BYTES for t, _, d, _ in kept) <= sampling.max_bytes
    for reason, total in (("malformed_json", MALFORMED), ("unknown_schema", NO_SCHEMA)):
        _, _, detail, size_bytes = summaries[reason]
        more = int(re.match(r"(\d+) more ", detail).group(1))  # type: ignore[union-attr]
        assert more + sum(1 for row in kept if row[1] == reason) == total, detail
        assert "every one is counted in the collector's rejected{reason} metric" in detail and size_bytes > 0


def test_rows_are_bounded_by_bytes_and_per_window(fleet_broker: MosquittoBroker, tmp_path: Path) -> None:
    """Fewer rows than rows_per_reason when the byte cap is reached first; a new window samples afresh."""
    sampling = RejectedSampling(rows_per_reason=50, max_bytes=3 * (ROW_OVERHEAD_BYTES + 700), window_s=2.0)
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    burst = [(topic("telemetry"), b"[" * 5 + b"{not json") for _ in range(200)]
    with open_store(store_url) as store:
        collector = Collector(fleet_broker.url, store, client_id=f"bytes-{time.monotonic_ns()}", flush_interval_s=0.05,
                              rejected_sampling=sampling, retention=None, retention_interval_s=0.5).start()  # fmt: skip
        try:
            with Publisher(fleet_broker) as device:
                device.publish_many(burst)
                assert _wait_until(lambda: collector.metrics.snapshot()["rejected"].get("malformed_json") == 200)
                time.sleep(2.2)  # the window ends: its summary is written even with nothing arriving
                assert _wait_until(lambda: any(row[0] == SUMMARY_TOPIC for row in _rows(store_url)), timeout_s=90)
                device.publish_many(burst)
                assert _wait_until(lambda: collector.metrics.snapshot()["rejected"].get("malformed_json") == 400)
            assert collector.flush()
        finally:
            collector.stop()
    rows = _rows(store_url)
    kept = [row for row in rows if row[0] != SUMMARY_TOPIC]
    summaries = [row for row in rows if row[0] == SUMMARY_TOPIC]
    per_row = len(kept[0][0].encode()) + len(kept[0][2].encode()) + ROW_OVERHEAD_BYTES
    # a burst on a loaded host may spill into one more window, which may end without a summary
    assert len(summaries) >= 2 and len(kept) <= (len(summaries) + 1) * (sampling.max_bytes // per_row) < 400 // 10
    assert len(kept) + sum(int(re.match(r"(\d+) more ", row[2]).group(1)) for row in summaries) == 400  # type: ignore[union-attr]



def test_a_device_flooding_a_reason_hides_no_other_device(fleet_broker: MosquittoBroker, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The log and the sampled rows are limited per reason and topic: after a noisy device's flood of a reason,
    another device's first rejection for it is still logged and kept as a row, naming that device."""
    noisy, victim = topic("telemetry", device="noisy", fleet="fl"), topic("telemetry", device="victim", fleet="fl")
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        collector = Collector(fleet_broker.url, store, client_id=f"per-topic-{time.monotonic_ns()}", fleet="fl",
                              flush_interval_s=0.05).start()  # fmt: skip
        try:
            with caplog.at_level(logging.WARNING, logger="edgekit.fleet.collector"), Publisher(fleet_broker) as device:
                device.publish_many([(noisy, b"{not json")] * 30)
                device.publish(victim, b"{also not json")
                assert _wait_until(lambda: collector.metrics.snapshot()["rejected"].get("malformed_json") == 31)
                assert collector.flush()
        finally:
            collector.stop()
        rows = _rows(f"sqlite:///{tmp_path / 'fleet.db'}")
    lines = [record.getMessage() for record in caplog.records if "rejected a message on" in record.getMessage()]
    assert (sum(noisy in line for line in lines), sum(victim in line for line in lines)) == (LOG_FIRST, 1)
    assert [row[1] for row in rows if row[0] == victim] == ["malformed_json"]


def test_the_rejection_log_stays_bounded_on_ever_new_topics() -> None:
    now = [0.0]
    log = RejectionLog(clock=lambda: now[0])
    at = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)

    def rejected(device: str) -> Rejection:
        return Rejection(topic("telemetry", device=device), "malformed_json", "not JSON", 10, at)

    flood = LOG_TOPICS + 1000
    logged = [log.note(rejected(f"d{i}")) for i in range(flood)]
    # the first lines of a minute, then every LOG_EVERY-th of the reason; topics remembered stay bounded
    assert sum(seen is not None for seen in logged) == LOG_LINES_PER_MINUTE + flood // LOG_EVERY
    assert len(log._on_topic) == LOG_TOPICS  # noqa: SLF001
    assert log.note(rejected("new")) is None
    now[0] = 61.0  # a new minute
    assert log.note(rejected("newer")) == flood + 2
