#!/usr/bin/env python3
"""The fleet store's reads on native PostgreSQL against TimescaleDB, side by side (issue 27 item 1).

    python scripts/bench_timescale.py --devices 10000 --hours 6 --window-s 300 --out /tmp/bench_timescale.json

Needs TimescaleDB installed into the system PostgreSQL (``scripts/install_timescaledb.sh``). One private server
(initdb on a free loopback port, ``shared_preload_libraries=timescaledb``; the shared server is not touched) holds
two databases: one store opened with ``timescaledb="off"`` (native daily partitions), one detecting the extension
(hypertables). Both are seeded with the same synthetic history through the store API (``seed_history``, same seed
and ``now``), then retention rolls every window older than ``--raw-hours`` into 5-minute rollups, as a collector
does. Reads are then timed interleaved (native, TimescaleDB, native, ...), ``--repeat`` rounds:

- ``edgekit fleet status --json`` / ``status --csv`` and ``fleet report --since 24h --json`` / ``--since 7d --json``
  as a user runs them (a new process each, start-up included), and whether both stores print the same;
- in process: the dashboard's fleet series at 1 h and 24 h, one device's 24 h series, the per-device aggregate;

and whether both layouts answer the same (JSON without its since/until; floats to a relative 1e-9).

Reports medians and the TimescaleDB / native ratio, the seeding rate, and the host's CPU flags and load (a shared
2-core host: compare within one run). Every device figure is SYNTHETIC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.bench_fleet import Postgres  # noqa: E402
from scripts.shared_setup import host_conditions, markdown_table  # noqa: E402

EDGEKIT = [sys.executable, "-m", "edgekit.cli.main"]
COMMANDS = [
    ("status --json", ["status", "--json"]),
    ("status --csv", ["status", "--csv"]),
    ("report --since 24h --json", ["report", "--since", "24h", "--json"]),
    ("report --since 7d --json", ["report", "--since", "7d", "--json"]),
]
LAYOUTS = ("native", "timescaledb")


def _cli(args: list[str], url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    done = subprocess.run([*EDGEKIT, "fleet", *args, "--store", url], capture_output=True, env={**os.environ, "COLUMNS": "200"})
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"edgekit fleet {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-400:]}")
    return took, done.stdout


def _comparable(output: Any) -> Any:
    """``output`` as compared between the layouts: JSON parsed without its ``since``/``until`` (the moment each
    command ran), dataclasses as lists."""
    import dataclasses

    if isinstance(output, bytes):
        try:
            output = json.loads(output)
        except ValueError:
            return output
        if isinstance(output, dict):
            output = {key: value for key, value in output.items() if key not in ("since", "until")}
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [_comparable(getattr(output, f.name)) for f in dataclasses.fields(output)]
    if isinstance(output, (list, tuple)):
        return [_comparable(item) for item in output]
    if isinstance(output, dict):
        return {key: _comparable(value) for key, value in output.items()}
    return output


def same_answer(a: Any, b: Any) -> bool:
    """Whether two :func:`_comparable` outputs agree: exactly, except floats to a relative 1e-9 (sums over 10,000
    devices' rollups add in the order the scan returns them, chunks or partitions: the 12th digit moves)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_answer(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_answer(a[key], b[key]) for key in a)
    return bool(a == b)


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def in_process_reads(store: Any, now: dt.datetime, device: tuple[str, str]) -> dict[str, Callable[[], Any]]:
    from edgekit.fleet.dashboard.api import device_series, fleet_series

    return {
        "fleet series 1 h": lambda: fleet_series(store, hours=1, now=now),
        "fleet series 24 h": lambda: fleet_series(store, hours=24, now=now),
        "device series 24 h": lambda: device_series(store, device[0], device[1], hours=24, now=now),
        "per-device aggregate 24 h": lambda: store.aggregate(("fleet", "device"), since=now - dt.timedelta(hours=24)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=6.0, help="history seeded per device")
    parser.add_argument("--window-s", type=float, default=300.0, help="seeded window length")
    parser.add_argument("--raw-hours", type=float, default=1.0, help="raw windows kept; older ones are rolled up")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store.postgres import PostgresStore

    results: dict[str, Any] = {"host_before": host_conditions(), "devices": args.devices, "hours": args.hours,
                               "window_s": args.window_s, "seed": {}, "retention_s": {}, "reads": {}}  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="bench-timescale-", dir="/tmp") as tmp:
        server = Postgres(Path(tmp) / "pg", settings=("shared_preload_libraries=timescaledb", "timescaledb.telemetry_level=off"))
        base = server.start()
        try:
            import psycopg

            urls = {}
            with psycopg.connect(base, autocommit=True) as admin:
                for layout in LAYOUTS:
                    admin.execute(f"CREATE DATABASE fleet_{layout}")
                    urls[layout] = base.rsplit("/", 1)[0] + f"/fleet_{layout}"
            stores = {layout: PostgresStore(urls[layout], timescaledb="off" if layout == "native" else "auto") for layout in LAYOUTS}
            assert [stores[layout].layout for layout in LAYOUTS] == list(LAYOUTS), "the private server has no TimescaleDB"
            for layout, store in stores.items():
                summary = seed_history(store, devices=args.devices, hours=args.hours, window_s=args.window_s, now=now, seed=1)
                results["seed"][layout] = {"windows": summary.windows, "seconds": round(summary.seconds, 1),
                                           "windows_per_s": round(summary.windows / summary.seconds)}  # fmt: skip
                print(f"seeded {layout}: {summary.windows} windows in {summary.seconds:.0f} s", flush=True)
                took, rolled = _timed(lambda: store.apply_retention(dt.timedelta(hours=args.raw_hours), now=now))
                results["retention_s"][layout] = round(took, 1)
                print(f"retention {layout}: {rolled} windows rolled up in {took:.0f} s", flush=True)
            device = next(iter(stores["native"].device_targets()))
            times: dict[str, dict[str, list[float]]] = {}
            same: dict[str, bool] = {}
            for _ in range(args.repeat):
                outputs: dict[str, dict[str, Any]] = {}
                for layout in LAYOUTS:  # interleaved: both layouts see the same load
                    for label, command in COMMANDS:
                        took, out = _cli(command, urls[layout])
                        times.setdefault(label, {}).setdefault(layout, []).append(took)
                        outputs.setdefault(label, {})[layout] = out
                    for label, call in in_process_reads(stores[layout], now, device).items():
                        took, out = _timed(call)
                        times.setdefault(label, {}).setdefault(layout, []).append(took)
                        outputs.setdefault(label, {})[layout] = out
                for label, by_layout in outputs.items():
                    same[label] = same.get(label, True) and same_answer(_comparable(by_layout["native"]), _comparable(by_layout["timescaledb"]))
            for label, by_layout in times.items():
                medians = {layout: statistics.median(values) for layout, values in by_layout.items()}
                results["reads"][label] = {**{f"{layout}_median_s": round(value, 3) for layout, value in medians.items()},
                                           "ratio": round(medians["timescaledb"] / medians["native"], 2),
                                           "same_output": same[label]}  # fmt: skip
            for store in stores.values():
                store.close()
        finally:
            server.stop()
    results["host_after"] = host_conditions()
    rows = [(label, f"{r['native_median_s']:.3f}", f"{r['timescaledb_median_s']:.3f}", f"{r['ratio']:.2f}",
             "yes" if r["same_output"] else "NO") for label, r in results["reads"].items()]  # fmt: skip
    print(markdown_table(["read", "native s", "TimescaleDB s", "ratio", "same output"], rows, right_aligned=(1, 2, 3)))
    print(json.dumps({k: results[k] for k in ("seed", "retention_s", "host_before", "host_after")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
