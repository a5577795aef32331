#!/usr/bin/env python
"""Spool throughput: append N telemetry-sized messages, then peek + ack them in batches; one run, JSON out.

    .venv/bin/python scripts/bench_spool.py [--messages 5000] [--payload-bytes 900] [--batch 16]
                                            [--synchronous FULL|NORMAL] [--dir /path/on/the/device/disk]

Each append is its own committed transaction, as in the agent; acks go in batches of ``--batch`` (the
agent's in-flight window). Run it on the device's real storage (``--dir``) to see what its flash does.
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

from edgekit_runtime.agent.spool import Spool

TOPIC = "edgekit/v1/bench/dev-bench/telemetry"


def run(messages: int, payload_bytes: int, batch: int, synchronous: str, directory: Path) -> dict[str, object]:
    path = directory / "bench-spool.db"
    payload = b"x" * payload_bytes
    with Spool(path, max_messages=messages + 1, max_bytes=(messages + 1) * payload_bytes,
               synchronous=synchronous) as spool:  # type: ignore[arg-type]  # fmt: skip
        start = time.perf_counter()
        for _ in range(messages):
            spool.append(TOPIC, payload, qos=1)
        append_s = time.perf_counter() - start

        start = time.perf_counter()
        acked = 0
        while True:
            entries = spool.peek(batch)
            if not entries:
                break
            acked += spool.ack_many(entry.id for entry in entries)
        ack_s = time.perf_counter() - start
        if spool.backlog() != 0 or acked != messages:
            raise SystemExit(f"spool lost track: acked {acked} of {messages}, backlog {spool.backlog()}")
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
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
