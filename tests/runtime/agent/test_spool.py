"""The on-disk spool: order, acknowledgement, bound, persistent counters, threads, SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgekit_runtime.agent.spool import Spool, SpoolError
from tests.runtime.agent.mosquitto import REPO

TOPIC = "edgekit/v1/lab/dev-1/telemetry"


def test_entries_come_back_in_order_and_leave_on_ack(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        ids = [spool.append(TOPIC, f"m{i}".encode(), qos=1) for i in range(5)]
        assert ids == sorted(ids) and len(set(ids)) == 5
        entries = spool.peek(3)
        assert [e.payload for e in entries] == [b"m0", b"m1", b"m2"]
        assert entries[0].topic == TOPIC and entries[0].qos == 1 and entries[0].created_at > 0
        assert [e.payload for e in spool.peek(10, after_id=ids[2])] == [b"m3", b"m4"]
        assert spool.ack(ids[1]) is True
        assert spool.ack(ids[1]) is False  # already gone
        assert spool.ack_many([ids[0], ids[3], 999]) == 2
        assert [e.payload for e in spool.peek(10)] == [b"m2", b"m4"]
        assert spool.backlog() == 2 and spool.backlog_bytes() == 4


def test_count_bound_drops_the_oldest_and_counts_persistently(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with Spool(path, max_messages=3) as spool:
        for i in range(5):
            spool.append(TOPIC, f"m{i}".encode())
        assert [e.payload for e in spool.peek(10)] == [b"m2", b"m3", b"m4"]
        assert spool.dropped_total() == 2
    with Spool(path, max_messages=3) as spool:  # reopened: counter and queue survive
        assert spool.dropped_total() == 2 and spool.backlog() == 3
        spool.append(TOPIC, b"m5")
        assert spool.dropped_total() == 3
        assert [e.payload for e in spool.peek(10)] == [b"m3", b"m4", b"m5"]


def test_byte_bound_drops_the_oldest_until_the_new_message_fits(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", max_bytes=100) as spool:
        for i in range(4):
            spool.append(TOPIC, bytes([i]) * 30)
        assert spool.backlog() == 3 and spool.backlog_bytes() == 90 and spool.dropped_total() == 1
        spool.append(TOPIC, b"x" * 70)  # needs two of the old ones gone
        assert [len(e.payload) for e in spool.peek(10)] == [30, 70]
        assert spool.dropped_total() == 3
        with pytest.raises(SpoolError, match=r"is 101 bytes, more than the spool's max_bytes=100") as info:
            spool.append(TOPIC, b"y" * 101)
        assert "raise the spool's max_bytes" in str(info.value)


def test_sequence_numbers_persist_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with Spool(path) as spool:
        assert [spool.next_seq() for _ in range(3)] == [1, 2, 3]
        assert spool.next_seq("events") == 1
        assert spool.last_seq() == 3
    with Spool(path) as spool:
        assert spool.next_seq() == 4
        assert spool.last_seq("events") == 1


def test_threads_share_one_spool(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", synchronous="NORMAL") as spool:
        seqs: list[int] = []
        lock = threading.Lock()

        def produce(worker: int) -> None:
            for i in range(100):
                seq = spool.next_seq()
                spool.append(TOPIC, json.dumps({"w": worker, "i": i}).encode())
                with lock:
                    seqs.append(seq)

        def consume(stop: threading.Event) -> None:
            while not stop.is_set():
                spool.ack_many(e.id for e in spool.peek(7))

        stop = threading.Event()
        consumer = threading.Thread(target=consume, args=(stop,))
        consumer.start()
        producers = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        stop.set()
        consumer.join()
        assert sorted(seqs) == list(range(1, 401))
        remaining = spool.peek(1000)
        assert spool.backlog() == len(remaining)
        per_worker: dict[int, list[int]] = {}
        for entry in remaining:  # each producer's messages stay in its own order
            data = json.loads(entry.payload)
            per_worker.setdefault(data["w"], []).append(data["i"])
        assert all(items == sorted(items) for items in per_worker.values())


def test_one_process_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with Spool(path):
        with pytest.raises(SpoolError, match=r"is already open in another agent process") as info:
            Spool(path)
        assert "run one agent per spool file" in str(info.value)
    with Spool(path) as spool:  # released on close
        assert spool.backlog() == 0


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpoolError, match=r"Spool max_messages must be an int >= 1, got 0"):
        Spool(tmp_path / "a.db", max_messages=0)
    with Spool(tmp_path / "b.db") as spool:
        with pytest.raises(SpoolError, match=r"payload for 'topic' must be bytes, got str"):
            spool.append("topic", "text")  # type: ignore[arg-type]
        with pytest.raises(SpoolError, match=r"qos for 'topic' must be 0, 1 or 2, got 3"):
            spool.append("topic", b"x", qos=3)
    spool_closed = Spool(tmp_path / "c.db")
    spool_closed.close()
    with pytest.raises(SpoolError, match=r"spool .*c\.db is closed"):
        spool_closed.append("topic", b"x")


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SpoolError, match=r"cannot open the spool database .*spool\.db: file is not a database") as info:
        Spool(path)
    assert "move it away" in str(info.value)
    path.unlink()
    with Spool(path) as spool:  # the lock was released by the failed open
        assert spool.backlog() == 0


def test_unwritable_directory_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError, match=r"cannot create the spool at .*file/spool\.db"):
        Spool(blocker / "spool.db")


def test_survives_sigkill_mid_append(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.agent.producer_process", "spool", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    printed: list[int] = []
    deadline = time.monotonic() + 30
    assert child.stdout is not None
    while len(printed) < 300 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        printed.append(int(line))
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    assert len(printed) >= 300, child.stderr.read() if child.stderr else ""
    printed += [int(line) for line in child.stdout.read().split()]  # what it wrote before dying

    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with Spool(path) as spool:
        seqs = [json.loads(e.payload)["seq"] for e in spool.peek(1_000_000)]
        assert seqs == list(range(1, len(seqs) + 1))  # nothing lost, nothing torn, in order
        assert set(printed) <= set(seqs)
        assert spool.last_seq() in (seqs[-1], seqs[-1] + 1)  # killed between next_seq and append at worst
        assert spool.next_seq() > max(seqs)
