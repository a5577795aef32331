"""Time the dashboard against a large store: each API call of a refresh and of the table's actions (p50/p95 over
``--repeat`` requests, uncached, and the gzip size sent), and the page-ready time in headless Chromium at
1,280 px (issue 27 item 3: every API call <= 500 ms at p95, <= 200 KB a refresh, page ready <= 2 s).

    python scripts/bench_dashboard.py --store sqlite:///tmp/fleet10k.db
    python scripts/bench_dashboard.py --seed 10000 --hours 2 --window-s 300 --store sqlite:///tmp/fleet10k.db

``--seed N`` first fills the store with N simulated devices (SYNTHETIC figures, :mod:`edgekit.fleet.sim.seed`).
Prints one JSON object (also written to ``--json`` when given) with the host's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: (label, path) of one refresh of the page (overview, the table's first page, the fleet chart, one device).
REFRESH = [("overview", "api/overview"), ("devices", "api/devices"),
           ("fleet-series 1h", "api/fleet-series?by=bundle_id&hours=1"), ("series 1h", "api/series?fleet={fleet}&device={device}&hours=1")]  # fmt: skip
#: What a user does to the table: sort, filter, a state, a deep page, a big page, and the longer fleet chart.
ACTIONS = [("devices sort p99 desc", "api/devices?sort=p99_ms&order=desc"), ("devices q=orin-nx", "api/devices?q=orin-nx"),
           ("devices state=offline,stale", "api/devices?state=offline,stale"), ("devices page 50", "api/devices?offset=5000"),
           ("devices limit 500", "api/devices?limit=500"), ("devices sort power_mode", "api/devices?sort=power_mode"),
           ("fleet-series 24h", "api/fleet-series?by=bundle_id&hours=24")]  # fmt: skip


def _fetch(url: str) -> tuple[float, int]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return (time.perf_counter() - started) * 1000.0, len(body)


def time_calls(base: str, calls: list[tuple[str, str]], repeat: int, fields: dict[str, str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, path in calls:
        url = base + path.format(**fields)
        times, size = [], 0
        for _ in range(repeat):
            elapsed, size = _fetch(url)
            times.append(elapsed)
        times.sort()
        results[label] = {"p50_ms": round(statistics.median(times)), "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))]),
                          "max_ms": round(times[-1]), "gzip_bytes": size}  # fmt: skip
        print(f"  {label:32s} p50 {results[label]['p50_ms']:5d} ms  p95 {results[label]['p95_ms']:5d} ms  {size:7d} B", file=sys.stderr)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--seed", type=int, default=0, help="seed this many devices first")
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--loads", type=int, default=3, help="page loads in headless Chromium")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing
    from edgekit.fleet.store import open_store

    out: dict[str, Any] = {"store": args.store.split("://")[0], "load_before": os.getloadavg()}
    if args.seed:
        from edgekit.fleet.sim.seed import seed_history

        with open_store(args.store) as store:
            started = time.monotonic()
            seeded = seed_history(store, devices=args.seed, hours=args.hours, window_s=args.window_s)
            out["seed"] = {"devices": seeded.devices, "windows": seeded.windows, "seconds": round(time.monotonic() - started, 1)}
    with open_store(args.store) as store:
        started = time.perf_counter()
        summaries = store.device_summaries()
        out["device_summaries_ms"] = round((time.perf_counter() - started) * 1000.0)
    out["devices"] = len(summaries)
    first = next((s for s in summaries if s.windows), summaries[0])
    fields = {"fleet": first.fleet, "device": first.device}
    with DashboardServer(args.store, port=0, cache_s=0.0) as server:
        print(f"{len(summaries)} devices; uncached API calls ({args.repeat} each):", file=sys.stderr)
        out["refresh"] = time_calls(server.url, REFRESH, args.repeat, fields)
        out["refresh_gzip_bytes"] = sum(r["gzip_bytes"] for r in out["refresh"].values())
        out["actions"] = time_calls(server.url, ACTIONS, max(3, args.repeat // 4), fields)
    missing = chromium_missing()
    if missing:
        out["page"] = {"skipped": missing}
    else:
        loads = []
        with DashboardServer(args.store, port=0, cache_s=2.0) as server, HeadlessChromium(page_load_timeout_s=120) as browser:
            browser.driver.set_window_size(1280, 1000)
            for _ in range(args.loads):
                browser.driver.get("about:blank")  # else a second get of the same URL (but its hash) is no reload
                timing = browser.load(server.url + "#range=1", ready_timeout_s=120)
                transfers = browser.driver.execute_script(
                    "return performance.getEntriesByType('resource').filter((e) => e.name.includes('/api/'))"
                    ".reduce((n, e) => n + e.transferSize, 0)")  # fmt: skip
                loads.append({"ready_ms": round(timing.ready_ms or -1), "api_transfer_bytes": transfers})
                print(f"  page ready {loads[-1]['ready_ms']} ms, /api/ transfers {transfers} B", file=sys.stderr)
        out["page"] = loads
    out["load_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
