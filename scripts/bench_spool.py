#!/usr/bin/env python
"""Spool throughput: append N telemetry-sized messages, then peek + ack them in batches; one run, JSON out.

    .venv/bin/python scripts/bench_spool.py [--messages 5000] [--payload-bytes 900] [--batch 16]
                                            [--synchronous FULL|NORMAL] [--dir /path/on/the/device/disk]

Each append is its own committed transaction, as in the agent; acks go in batches of ``--batch`` (the
agent's in-flight window). Run it on the device's real storage (``--dir``) to see what its flash does. On a
file system too small for all the messages the spool drops the oldest to keep its headroom
(``dropped_for_space``), as the agent's does while its collector is away.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

from edgekit_runtime.agent.disk_reserve import RESERVE_NAME
from edgekit_runtime.agent.spool import Spool

TOPIC = "edgekit/v1/bench/dev-bench/telemetry"


def run(messages: int, payload_bytes: int, batch: int, synchronous: str, directory: Path) -> dict[str, object]:
    path = directory / "bench-spool.db"
    payload = b"x" * payload_bytes
    with Spool(path, max_messages=messages + 1, max_bytes=(messages + 1) * payload_bytes,
               synchronous=synchronous) as spool:  # type: ignore[arg-type]  # fmt: skip
        wal = Path(f"{path}-wal")
        largest_wal = 0
        start = time.perf_counter()
        for index in range(messages):
            spool.append(TOPIC, payload, qos=1)
            if index % 64 == 0 and wal.exists():
                largest_wal = max(largest_wal, wal.stat().st_size)
        append_s = time.perf_counter() - start

        start = time.perf_counter()
        acked = 0
        while True:
            entries = spool.peek(batch)
            if not entries:
                break
            acked += spool.ack_many(entry.id for entry in entries)
        ack_s = time.perf_counter() - start
        dropped = spool.dropped_total()  # on a small file system the oldest go to keep its headroom (issue 28)
        if spool.backlog() != 0 or acked + dropped != messages:
            raise SystemExit(f"spool lost track: acked {acked} and dropped {dropped} of {messages}, "
                             f"backlog {spool.backlog()}")  # fmt: skip
    for leftover in (*(Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm", ".lock")), directory / RESERVE_NAME):
        leftover.unlink(missing_ok=True)
    return {
        "benchmark": "spool",
        "messages": messages,
        "payload_bytes": payload_bytes,
        "ack_batch": batch,
        "synchronous": synchronous,
        "directory": str(directory),
        "append_per_s": messages / append_s,
        "ack_per_s": messages / ack_s,
        "append_and_ack_per_s": messages / (append_s + ack_s),
        "append_ms_mean": 1000.0 * append_s / messages,
        "dropped_for_space": dropped,
        "largest_wal_bytes": largest_wal,  # sampled every 64 appends; bounded since issue 28 (was up to ~4 MB)
        "sqlite_version": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--payload-bytes", type=int, default=900, help="about one telemetry.v1 message")
    parser.add_argument("--batch", type=int, default=16, help="acks per commit (the link's in-flight window)")
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the spool (default: a temp dir)")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        result = run(args.messages, args.payload_bytes, args.batch, args.synchronous, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="edgekit-bench-spool-") as tmp:
            result = run(args.messages, args.payload_bytes, args.batch, args.synchronous, Path(tmp))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
