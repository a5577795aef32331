#!/usr/bin/env python3
"""Bytes per device-day at each retention tier of the fleet store, on PostgreSQL and SQLite.

For each store (a scratch PostgreSQL database made with ``createdb`` and dropped afterwards, and a
SQLite file in a temp directory):

1. ``edgekit fleet simulate --history 2h --window-s 10 --devices 500 --store URL`` seeds a known
   number of windows through the store's write path (the aggregates are kept as they arrive);
2. the size of each table with its indexes is read (PostgreSQL ``pg_total_relation_size`` after
   ``VACUUM ANALYZE``; SQLite the ``dbstat`` table, pages per table and its indexes);
3. retention rolls every raw window up into 5-minute buckets (``apply_retention(raw_for=0)``), and the
   sizes are read again (rollups, rolled seqs);
4. seeded windows carry a one-field payload, so the raw tier is measured a second time with real
   ``telemetry.v1`` messages: ``--real-windows`` windows built by the simulator's device model, parsed by
   the collector's parser (:func:`edgekit.fleet.ingest.parse_message`) and stored with ``add_windows``.

Writes JSON (``--out``) with bytes per row and per device-day of every tier; docs/fleet.md "Capacity"
projects them to 100,000 devices. Every device figure is SYNTHETIC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekit.fleet.store import open_store  # noqa: E402
from scripts.bench_collectors import ScratchDatabase, host_facts  # noqa: E402

#: table -> tier, for the report (tables not named here are listed under "other")
TIERS = {
    "telemetry_windows": "raw windows", "telemetry_model_windows": "raw windows",
    "telemetry_rollups": "per-device 5-minute rollups", "telemetry_model_rollups": "per-device 5-minute rollups",
    "telemetry_rolled_seqs": "per-device 5-minute rollups",
    "fleet_buckets": "fleet 1-minute and 1-hour buckets", "fleet_model_buckets": "fleet 1-minute and 1-hour buckets",
    "device_latest": "device_latest (one row per device)", "device_bundles": "device_latest (one row per device)",
}  # fmt: skip


def postgres_sizes(url: str) -> dict[str, dict[str, int]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
        rows = connection.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema()").fetchall()  # fmt: skip
        result = {}
        for name, size in rows:
            count = connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            result[name] = {"bytes": int(size), "rows": int(count)}
        for name in ("fleet_buckets", "fleet_model_buckets"):
            if name in result:
                tiers = connection.execute(f"SELECT bucket_s, count(*) FROM {name} GROUP BY bucket_s").fetchall()
                result[name]["rows_by_bucket_s"] = {str(s): int(n) for s, n in tiers}
    return result


def sqlite_sizes(path: Path) -> dict[str, dict[str, int]]:
    connection = sqlite3.connect(path)
    try:
        owner = dict(connection.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
        result: dict[str, dict[str, int]] = {}
        for name, size in connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = owner.get(name, name)
            result.setdefault(table, {"bytes": 0, "rows": 0})["bytes"] += int(size)
        for table in list(result):
            if table.startswith("sqlite_"):
                continue
            result[table]["rows"] = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        for name in ("fleet_buckets", "fleet_model_buckets"):
            if name in result:
                tiers = connection.execute(f"SELECT bucket_s, count(*) FROM {name} GROUP BY bucket_s").fetchall()
                result[name]["rows_by_bucket_s"] = {str(s): int(n) for s, n in tiers}
    finally:
        connection.close()
    return result


def seed(store_url: str, devices: int, history: str, window_s: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "edgekit.cli.main", "fleet", "simulate", "--history", history, "--window-s",
               str(window_s), "--devices", str(devices), "--store", store_url, "--json"]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    last = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return {"command": " ".join(command[1:]).replace(store_url, "URL"), "seconds": round(time.monotonic() - t0, 1),
            "summary": json.loads(last[-1]) if last else None}  # fmt: skip


def real_windows(count: int, devices: int = 50) -> list[Any]:
    """``count`` real telemetry.v1 windows of ``devices`` simulated devices, through the collector's parser."""
    from edgekit.fleet.ingest import parse_message
    from edgekit.fleet.sim.profiles import DEFAULT_TARGETS, profiles_for
    from edgekit.fleet.sim.device import VirtualAgent
    from edgekit.fleet.simulate import synthetic_bundle
    from edgekit_runtime.agent.telemetry import encode_message

    profiles = profiles_for(list(DEFAULT_TARGETS))
    agents = [VirtualAgent("sizes", f"{profiles[i % len(profiles)].target}-{i:03d}", profiles[i % len(profiles)],
                           send=lambda *a: None, schedule=lambda *a: None, bundle=synthetic_bundle("demo-v1"),
                           interval_s=10.0, seed=i, load=0.5)  # fmt: skip
              for i in range(devices)]
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=10 * (count // devices + 1))
    records = []
    for step in range(count // devices):
        for agent in agents:
            begin = start + dt.timedelta(seconds=10 * step)
            message = agent.telemetry(begin, begin + dt.timedelta(seconds=10))
            record = parse_message(agent.topics.telemetry, encode_message(message), received_at=begin + dt.timedelta(seconds=10))
            records.append(record)
    return records


def measure(store_url: str, sizes: Any, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"seed": seed(store_url, args.devices, args.history, args.window_s)}
    result["after_seeding"] = sizes()
    with open_store(store_url) as store:
        t0 = time.monotonic()
        rolled = store.apply_retention(dt.timedelta(0), rollup_minutes=5)
        result["retention"] = {"rolled_up_windows": rolled, "seconds": round(time.monotonic() - t0, 1)}
    result["after_rolling_everything_up"] = sizes()
    return result


def measure_real_raw(store_url: str, sizes: Any, count: int) -> dict[str, Any]:
    records = real_windows(count)
    with open_store(store_url) as store:
        for start in range(0, len(records), 2000):
            store.add_windows(records[start:start + 2000])
    return {"windows": len(records), "sizes": sizes()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--history", default="2h")
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--real-windows", type=int, default=20_000)
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "store_sizes.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"host": host_facts(), "synthetic": True, "devices": args.devices, "history": args.history,
                               "window_s": args.window_s, "tiers": TIERS, "stores": {}}  # fmt: skip
    with ScratchDatabase("127.0.0.1", "postgres") as url:
        print("PostgreSQL: seeding", flush=True)
        results["stores"]["postgresql"] = measure(url, lambda: postgres_sizes(url), args)
    with ScratchDatabase("127.0.0.1", "postgres") as url:
        print("PostgreSQL: real telemetry.v1 windows", flush=True)
        results["stores"]["postgresql"]["real_windows"] = measure_real_raw(url, lambda: postgres_sizes(url), args.real_windows)
    if not args.skip_sqlite:
        with tempfile.TemporaryDirectory(prefix="edgekit-store-sizes-") as tmp:
            path = Path(tmp) / "fleet.db"
            print("SQLite: seeding", flush=True)
            results["stores"]["sqlite"] = measure(f"sqlite:///{path}", lambda: sqlite_sizes(path), args)
            real = Path(tmp) / "real.db"
            print("SQLite: real telemetry.v1 windows", flush=True)
            results["stores"]["sqlite"]["real_windows"] = measure_real_raw(f"sqlite:///{real}", lambda: sqlite_sizes(real),
                                                                           args.real_windows)  # fmt: skip
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, store in results["stores"].items():
        for phase in ("after_seeding", "after_rolling_everything_up"):
            print(name, phase, {t: (s["bytes"], s["rows"]) for t, s in store[phase].items() if s["rows"]})
        print(name, "real windows", {t: (s["bytes"], s["rows"]) for t, s in store["real_windows"]["sizes"].items() if s["rows"]})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
