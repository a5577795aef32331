#!/usr/bin/env python3
"""The fleet store's reads on native PostgreSQL against TimescaleDB, side by side (issue 27 item 1).

    python scripts/bench_timescale.py --devices 10000 --hours 6 --window-s 300 --out /tmp/bench_timescale.json

    # 7 days at 10,000 devices: seed once (long; nice 10, outside the quiet lock), then measure under the lock
    nice -n 10 python scripts/bench_timescale.py --phase seed --data-dir /var/tmp/ts7d --hours 168 --window-s 3600
    flock /tmp/quiet.lock nice -n -20 python scripts/bench_timescale.py --phase measure --data-dir /var/tmp/ts7d \
        --out docs/benchmarks/fleet_timescale_7d.json

Needs TimescaleDB installed into the system PostgreSQL (``scripts/install_timescaledb.sh``). One private server
(initdb on a free loopback port, ``shared_preload_libraries=timescaledb``; the shared server is not touched) holds
two databases: one store opened with ``timescaledb="off"`` (native daily partitions), one detecting the extension
(hypertables). Both are seeded with the same synthetic history through the store API (``seed_history``, same seed
and ``now``), then retention rolls every window older than ``--raw-hours`` into 5-minute rollups, as a collector
does. Reads are then timed interleaved (native, TimescaleDB, native, ...), ``--repeat`` rounds:

- ``edgekit fleet status --json`` / ``status --csv`` and ``fleet report --since 24h --json`` / ``--since 7d --json``
  as a user runs them (a new process each, start-up included), and whether both stores print the same;
- in process: the dashboard's fleet series at 1 h and 24 h, one device's 24 h series, the per-device aggregate;

and whether both layouts answer the same (JSON without its since/until; floats to a relative 1e-9). With
``--dashboard``, every dashboard API call of a refresh and of the table's actions (``scripts/bench_dashboard.py``'s
lists) is timed against a dashboard server on each store, interleaved, p95 over ``--dashboard-repeat`` calls.

``--phase seed`` keeps the server's data in ``--data-dir`` (and what was seeded in ``seed.json`` there) and ends
by refreshing the hour continuous aggregates as their policy does; ``--phase measure`` starts that server again.

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
def commands(now: dt.datetime) -> list[tuple[str, list[str]]]:
    """The CLI reads; a report's range is pinned (ISO --since/--until, the last 24 h / 7 d of the seeded history)
    so that both layouts, run seconds apart, read the same range."""
    until = ["--until", now.isoformat()]
    day, week = (["--since", (now - dt.timedelta(days=days)).isoformat(), *until] for days in (1, 7))
    return [
        ("status", ["status"]),
        ("status --json", ["status", "--json"]),
        ("status --csv", ["status", "--csv"]),
        ("report --since 24h --json", ["report", *day, "--json"]),
        ("report --since 7d --json", ["report", *week, "--json"]),
        ("report --since 24h", ["report", *day]),
        ("report --since 7d", ["report", *week]),
    ]


#: Tables print times relative to the moment they ran ("4 min ago"): timed, not compared.
UNCOMPARED = ("status", "report --since 24h", "report --since 7d")
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


class KeptPostgres(Postgres):
    """:class:`Postgres` whose data folder outlives it: initdb only when there is none yet."""

    def start(self) -> str:
        if (self.data / "PG_VERSION").is_file():
            extra = "".join(f" -c {setting}" for setting in self.settings)
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.workdir / "pg.log"), "-w", "-o",
                      f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=on{extra}", "start")  # fmt: skip
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return super().start()


SETTINGS = ("shared_preload_libraries=timescaledb", "timescaledb.telemetry_level=off", "max_worker_processes=16")


def seed_one(layout: str, url: str, devices: int, hours: float, window_s: float, raw_hours: float, now: dt.datetime) -> dict[str, Any]:
    """Seed one store through the store API (``seed_history``), roll up as a collector does, and (TimescaleDB)
    refresh the hour aggregates as their policy would; returns what it took."""
    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import timescale_aggregates
    from edgekit.fleet.store.postgres import PostgresStore

    out: dict[str, Any] = {}
    with PostgresStore(url, timescaledb="off" if layout == "native" else "auto") as store:
        assert store.layout == layout, "the private server has no TimescaleDB"
        summary = seed_history(store, devices=devices, hours=hours, window_s=window_s, now=now, seed=1)
        out["seed"] = {"windows": summary.windows, "seconds": round(summary.seconds, 1),
                       "windows_per_s": round(summary.windows / summary.seconds), "load_after": os.getloadavg()}  # fmt: skip
        print(f"seeded {layout}: {summary.windows} windows in {summary.seconds:.0f} s", flush=True)
        took, rolled = _timed(lambda: store.apply_retention(dt.timedelta(hours=raw_hours), now=now))
        out["retention_s"] = round(took, 1)
        print(f"retention {layout}: {rolled} windows rolled up in {took:.0f} s", flush=True)
        if store.hour_tier != "table":  # what the refresh policy does every 10 minutes: hours older than one
            took, _ = _timed(lambda: store._refresh_hours(None, timescale_aggregates.floor_hour(now) - timescale_aggregates.END_OFFSET))
            out["refresh_s"] = round(took, 1)
        out["layout"] = store.storage_layout()
    return out


def seed(args: argparse.Namespace, base: str, results: dict[str, Any], now: dt.datetime) -> dict[str, str]:
    """Both stores made and seeded the same way, at the same time (a process each); returns their URLs."""
    from concurrent.futures import ProcessPoolExecutor

    import psycopg

    urls = {}
    with psycopg.connect(base, autocommit=True) as admin:
        for layout in LAYOUTS:
            admin.execute(f"CREATE DATABASE fleet_{layout}")
            urls[layout] = base.rsplit("/", 1)[0] + f"/fleet_{layout}"
    with ProcessPoolExecutor(len(LAYOUTS)) as pool:
        futures = {layout: pool.submit(seed_one, layout, urls[layout], args.devices, args.hours, args.window_s, args.raw_hours, now)
                   for layout in LAYOUTS}  # fmt: skip
        for layout, future in futures.items():
            done = future.result()
            results["seed"][layout] = done["seed"]
            results["retention_s"][layout] = done["retention_s"]
            results["layout"][layout] = done["layout"]
            if "refresh_s" in done:
                results["refresh_s"] = done["refresh_s"]
    return urls


def measure(args: argparse.Namespace, urls: dict[str, str], results: dict[str, Any], now: dt.datetime) -> None:
    from edgekit.fleet.store.postgres import PostgresStore

    stores = {layout: PostgresStore(urls[layout], timescaledb="off" if layout == "native" else "auto") for layout in LAYOUTS}
    try:
        device = next(iter(stores["native"].device_targets()))
        times: dict[str, dict[str, list[float]]] = {}
        same: dict[str, bool] = {}
        for _ in range(args.repeat):
            outputs: dict[str, dict[str, Any]] = {}
            for layout in LAYOUTS:  # interleaved: both layouts see the same load
                for label, command in commands(now):
                    took, out = _cli(command, urls[layout])
                    times.setdefault(label, {}).setdefault(layout, []).append(took)
                    outputs.setdefault(label, {})[layout] = out
                for label, call in in_process_reads(stores[layout], now, device).items():
                    took, out = _timed(call)
                    times.setdefault(label, {}).setdefault(layout, []).append(took)
                    outputs.setdefault(label, {})[layout] = out
            for label, by_layout in outputs.items():
                if label not in UNCOMPARED:
                    same[label] = same.get(label, True) and same_answer(_comparable(by_layout["native"]), _comparable(by_layout["timescaledb"]))
        for label, by_layout in times.items():
            medians = {layout: statistics.median(values) for layout, values in by_layout.items()}
            results["reads"][label] = {**{f"{layout}_median_s": round(value, 3) for layout, value in medians.items()},
                                       **{f"{layout}_max_s": round(max(values), 3) for layout, values in by_layout.items()},
                                       "ratio": round(medians["timescaledb"] / medians["native"], 2),
                                       "same_output": same.get(label)}  # fmt: skip
        if args.dashboard:
            results["dashboard"] = dashboard_calls(urls, device, args.dashboard_repeat)
    finally:
        for store in stores.values():
            store.close()


def dashboard_calls(urls: dict[str, str], device: tuple[str, str], repeat: int) -> dict[str, Any]:
    """p50/p95 of every dashboard API call, a dashboard server per store, the layouts alternating call by call."""
    from edgekit.fleet.dashboard import DashboardServer
    from scripts.bench_dashboard import ACTIONS, REFRESH, _fetch

    fields = {"fleet": device[0], "device": device[1]}
    found: dict[str, dict[str, list[float]]] = {}
    sizes: dict[str, dict[str, int]] = {}
    with DashboardServer(urls["native"], port=0, cache_s=0.0) as native, DashboardServer(urls["timescaledb"], port=0, cache_s=0.0) as timescaled:
        servers = {"native": native.url, "timescaledb": timescaled.url}
        for _ in range(repeat):
            for label, path in REFRESH + ACTIONS:
                for layout in LAYOUTS:
                    took, size = _fetch(servers[layout] + path.format(**fields))
                    found.setdefault(label, {}).setdefault(layout, []).append(took)
                    sizes.setdefault(label, {})[layout] = size
    out = {}
    for label, by_layout in found.items():
        row: dict[str, Any] = {}
        for layout, values in by_layout.items():
            values.sort()
            row[f"{layout}_p50_ms"] = round(statistics.median(values))
            row[f"{layout}_p95_ms"] = round(values[min(len(values) - 1, int(0.95 * len(values)))])
            row[f"{layout}_gzip_bytes"] = sizes[label][layout]
        out[label] = row
        print(f"  {label:32s} p95 native {row['native_p95_ms']:5d} ms  TimescaleDB {row['timescaledb_p95_ms']:5d} ms", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=6.0, help="history seeded per device")
    parser.add_argument("--window-s", type=float, default=300.0, help="seeded window length")
    parser.add_argument("--raw-hours", type=float, default=1.0, help="raw windows kept; older ones are rolled up")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--phase", choices=("all", "seed", "measure"), default="all")
    parser.add_argument("--data-dir", type=Path, help="keep the server's data here (needed by --phase seed/measure)")
    parser.add_argument("--dashboard", action="store_true", help="also time every dashboard API call")
    parser.add_argument("--dashboard-repeat", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.phase != "all" and args.data_dir is None:
        parser.error(f"--phase {args.phase} needs --data-dir (where the seeded server's data is kept)")

    results: dict[str, Any] = {"host_before": host_conditions(), "phase": args.phase, "nice": os.nice(0), "seed": {},
                               "retention_s": {}, "layout": {}, "reads": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-timescale-", dir="/tmp") as tmp:
        folder = args.data_dir if args.data_dir is not None else Path(tmp)
        server = KeptPostgres(folder / "pg", settings=SETTINGS)
        seeded = folder / "seed.json"
        if args.phase == "measure":
            kept = json.loads(seeded.read_text())
            results.update({key: kept[key] for key in ("seed", "retention_s", "layout", "devices", "hours", "window_s", "now")})
            results["seed_host"] = kept["host_before"]
            now = dt.datetime.fromisoformat(kept["now"])
        else:
            now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            results.update(devices=args.devices, hours=args.hours, window_s=args.window_s, now=now.isoformat())
        base = server.start()
        try:
            if args.phase == "measure":
                urls = {layout: base.rsplit("/", 1)[0] + f"/fleet_{layout}" for layout in LAYOUTS}
            else:
                urls = seed(args, base, results, now)
                if args.phase == "seed":
                    seeded.write_text(json.dumps(results, indent=1, default=str) + "\n")
            if args.phase != "seed":
                measure(args, urls, results, now)
        finally:
            server.stop()
    results["host_after"] = host_conditions()
    if args.phase != "seed":
        rows = [(label, f"{r['native_median_s']:.3f}", f"{r['timescaledb_median_s']:.3f}", f"{r['ratio']:.2f}",
                 {True: "yes", False: "NO", None: "(not compared)"}[r["same_output"]]) for label, r in results["reads"].items()]  # fmt: skip
        print(markdown_table(["read", "native s", "TimescaleDB s", "ratio", "same output"], rows, right_aligned=(1, 2, 3)))
    print(json.dumps({k: results.get(k) for k in ("seed", "retention_s", "host_before", "host_after")}, indent=1, default=str))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
