#!/usr/bin/env python3
"""Fleet reads and ingest at 10,000 devices (issue 27 item 3), on SQLite (24 h of history) and PostgreSQL (7 days).

    python scripts/bench_fleet_scale.py --sqlite sqlite:////var/tmp/edgekit-bench/fleet10k-24h.db \\
        --postgres postgresql://postgres@127.0.0.1:5432/bench_fleet_7d --out docs/benchmarks/fleet_scale.json

Stores are seeded beforehand through the collector's own write path (``edgekit fleet simulate --history 24h
--window-s 300 --devices 10000 --store URL``; the seeding's rate is in its log); ``--seed`` does it here. For each
store, one run times:

- ``edgekit fleet status`` (table, ``--json``, ``--csv``) and ``fleet report --since 24h`` / ``--since 7d`` (table
  and ``--json``) as a user runs them: a new process each, start-up included (``--repeat`` runs, median and max);
- every dashboard API call of a refresh and of the table's actions, and the page in headless Chromium at 1,280 px
  (``scripts/bench_dashboard.py``);
- the collector's ``/metrics`` (``scripts/bench_metrics.py``);
- SQLite: a retention pass rolling the seeded raw windows older than an hour up, while a reader keeps asking for
  the status and the report (the longest read, and any "database is locked");
- PostgreSQL: ingest of live simulated devices through a private Mosquitto into the 10,000-device store while a
  reader loops over status, report and the overview (one collector, then two over ``$share``), lost windows counted.

Every device figure is SYNTHETIC (the simulator's). The host's CPU flags and load are recorded; this 2-core host is
shared, so compare figures within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EDGEKIT = [sys.executable, "-m", "edgekit.cli.main"]
#: (label, arguments after ``edgekit fleet``) of the commands timed; {store} is the store's URL.
COMMANDS = [
    ("status (table)", ["status", "--store", "{store}"]),
    ("status --json", ["status", "--store", "{store}", "--json"]),
    ("status --csv", ["status", "--store", "{store}", "--csv"]),
    ("report --since 24h", ["report", "--store", "{store}", "--since", "24h"]),
    ("report --since 24h --json", ["report", "--store", "{store}", "--since", "24h", "--json"]),
    ("report --since 7d", ["report", "--store", "{store}", "--since", "7d"]),
    ("report --since 7d --json", ["report", "--store", "{store}", "--since", "7d", "--json"]),
]
TARGET_CLI_S = 2.0


def host_info() -> dict[str, Any]:
    flags: list[str] = []
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"cpu": model, "cores": os.cpu_count(), "cpu_flags": [f for f in wanted if f in flags], "commit": commit,
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}  # fmt: skip


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def time_command(args: list[str], store: str, repeat: int) -> dict[str, Any]:
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([*EDGEKIT, "fleet", *(a.format(store=store) for a in args)], capture_output=True,
                              env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"edgekit fleet {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-400:]}")
        size = len(done.stdout)
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3), "stdout_bytes": size}


def time_cli(store: str, repeat: int) -> dict[str, Any]:
    results = {"start_up (edgekit fleet --help)": time_command(["--help"], store, repeat)}
    for label, args in COMMANDS:
        results[label] = time_command(args, store, repeat)
        print(f"  {label:28s} median {results[label]['median_s']:.2f} s  max {results[label]['max_s']:.2f} s", flush=True)
    return results


def run_script(script: str, args: list[str]) -> dict[str, Any]:
    """A sibling benchmark script's JSON (the object it prints last on stdout), or why it failed."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith("{")]
    if done.returncode != 0 or not starts:
        return {"failed": f"{script} exited {done.returncode}: {done.stderr[-600:]}"}
    return json.loads("\n".join(lines[starts[-1]:]))  # type: ignore[no-any-return]


class Beside:
    """Work that ``_run`` does in a thread of its own while the ``with`` block runs; ``_stop`` says when to end."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        raise NotImplementedError


class Reader(Beside):
    """Reads a store in a loop from another thread (status as its table and as --json, report, overview), recording
    each read's seconds and its errors; the loads that ingest and retention must not starve."""

    def __init__(self, store_url: str) -> None:
        super().__init__("bench-reader")
        self.store_url = store_url
        self.times: dict[str, list[float]] = {}
        self.errors: list[str] = []

    def _run(self) -> None:
        from edgekit.fleet.dashboard.api import overview
        from edgekit.fleet.errors import StoreError
        from edgekit.fleet.report import build_report
        from edgekit.fleet.store import open_store

        try:
            store = open_store(self.store_url)
        except Exception as exc:  # noqa: BLE001 (recorded: a reader that cannot even open the store is the worst read)
            self.errors.append(f"opening the store: {type(exc).__name__}: {exc}")
            return
        with store:
            reads: list[tuple[str, Callable[[], Any]]] = [
                ("status", lambda: (store.device_counts(), store.device_page(limit=100))),  # the table: counts, a page
                ("status --json", lambda: list(store.device_rows())),  # every device, as --json reads it
                ("report 24h", lambda: build_report(store, since=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24))),
                ("overview", lambda: overview(store, None)),
            ]  # fmt: skip
            while not self._stop.is_set():
                for label, read in reads:
                    started = time.perf_counter()
                    try:
                        read()
                    except StoreError as exc:
                        self.errors.append(f"{label}: {exc.message}")
                    except Exception as exc:  # noqa: BLE001 (a benchmark records what broke and goes on)
                        self.errors.append(f"{label}: {type(exc).__name__}: {exc}")
                    self.times.setdefault(label, []).append(time.perf_counter() - started)
                    if self._stop.wait(0.2):
                        return

    def summary(self) -> dict[str, Any]:
        return {label: {"reads": len(times), "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}
                for label, times in self.times.items() if times} | {"errors": self.errors[:5], "error_count": len(self.errors)}  # fmt: skip


class WriteProbe(Beside):
    """Takes SQLite's write lock and lets it go again (``BEGIN IMMEDIATE``, ``ROLLBACK``) twice a second from its own
    connection, recording how long each wait was: what a collector's write meets while retention runs."""

    def __init__(self, path: str) -> None:
        super().__init__("bench-write-probe")
        self.path = path
        self.waits: list[float] = []

    def _run(self) -> None:
        import sqlite3

        connection = sqlite3.connect(self.path, timeout=120, isolation_level=None)
        try:
            while not self._stop.wait(0.5):
                started = time.perf_counter()
                connection.execute("BEGIN IMMEDIATE")
                self.waits.append(time.perf_counter() - started)
                connection.execute("ROLLBACK")
        finally:
            connection.close()

    def summary(self) -> dict[str, Any]:
        waits = sorted(self.waits) or [0.0]
        return {"probes": len(self.waits), "median_s": round(statistics.median(waits), 3),
                "p95_s": round(waits[int(0.95 * (len(waits) - 1))], 3), "max_s": round(waits[-1], 3)}  # fmt: skip


def bench_retention(store_url: str) -> dict[str, Any]:
    """Roll every raw window older than an hour up, while a reader reads and (SQLite) a probe waits for the write
    lock now and then; how long each took."""
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store, Reader(store_url) as reader, WriteProbe(store_url.split("://", 1)[1][1:]) as probe:
        raw = int(store._query("counting", "SELECT COUNT(*) FROM telemetry_windows")[0][0])  # type: ignore[attr-defined]
        started = time.perf_counter()
        rolled = store.apply_retention(dt.timedelta(hours=1))
        seconds = time.perf_counter() - started
    return {"raw_windows_before": raw, "rolled": rolled, "seconds": round(seconds, 1), "reads_meanwhile": reader.summary(),
            "write_lock_waits": probe.summary()}  # fmt: skip


def bench_ingest_while_reading(store_url: str, devices: int, windows: int, workers: int) -> dict[str, Any]:
    import bench_fleet

    bench_fleet.FLEET = f"ingest{workers}"  # beside the seeded fleet, on the same 10,000-device store
    bench_fleet.STALL_S = 60.0  # a reconnect under a loaded host is not the end of the ingest
    with tempfile.TemporaryDirectory() as scratch, Reader(store_url) as reader:
        if workers == 1:
            result = bench_fleet.bench_ingest(store_url, Path(scratch), devices, windows)
            result.pop("drain", None)
        else:
            result = bench_fleet.bench_ingest_workers(store_url, Path(scratch), devices, windows, "5", workers)
    result["reads_meanwhile"] = reader.summary()
    return result


def store_info(store_url: str) -> dict[str, Any]:
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store:
        summaries = store.device_summaries()
        (total,) = store.aggregate(()) or [None]
    return {"devices": len(summaries), "windows": sum(s.windows for s in summaries),
            "first_window": total.first_window_start.isoformat() if total and total.first_window_start else None,
            "last_window": total.last_window_end.isoformat() if total and total.last_window_end else None}  # fmt: skip


def bench_store(store_url: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    print(f"{kind}: {store_url}", flush=True)
    result: dict[str, Any] = {"url": store_url, "load_before": _load(), **store_info(store_url)}
    if not args.skip_reads:
        result["cli"] = time_cli(store_url, args.repeat)
        result["dashboard"] = run_script("bench_dashboard.py", ["--store", store_url, "--repeat", str(args.api_repeat)])
        result["metrics"] = run_script("bench_metrics.py", ["--store", store_url, "--scrapes", "5"])
    if kind == "sqlite" and not args.skip_retention:
        result["retention"] = bench_retention(store_url)
    if kind == "postgres" and not args.skip_ingest:
        result["ingest"] = {f"{n} collector(s)": bench_ingest_while_reading(store_url, args.ingest_devices, args.ingest_windows, n)
                            for n in (1, 2)}  # fmt: skip
    result["load_after"] = _load()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sqlite", metavar="URL", help="a seeded SQLite store (24 h of 10,000 devices)")
    parser.add_argument("--postgres", metavar="URL", help="a seeded PostgreSQL store (7 days of 10,000 devices)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each CLI command (default 3)")
    parser.add_argument("--api-repeat", type=int, default=20, help="requests of each dashboard API call (default 20)")
    parser.add_argument("--ingest-devices", type=int, default=1000)
    parser.add_argument("--ingest-windows", type=int, default=30)
    parser.add_argument("--skip-retention", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-reads", action="store_true", help="time no CLI, dashboard or /metrics read (ingest only)")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    results: dict[str, Any] = {"host": host_info(), "synthetic": True}
    for kind, url in (("sqlite", args.sqlite), ("postgres", args.postgres)):
        if url:
            results[kind] = bench_store(url, kind, args)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
