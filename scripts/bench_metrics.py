"""Time and size the fleet collector's Prometheus endpoints at fleet scale (issue 27 item 6).

Seeds a SQLite store through the store API (``edgekit.fleet.sim.seed``; or reads ``--store URL``), serves it the
way ``edgekit fleet collect`` does (a ``MetricsServer`` with a store connection of its own, the collector's
in-memory view holding every device's newest window), and scrapes ``/metrics`` (uncached: every scrape reads the
store), ``/metrics`` as ``fleet collect`` serves it (the store read in the background every 5 s) and
``/metrics/devices`` over HTTP. With ``--prometheus``, a real Prometheus (``/usr/bin/prometheus``)
scrapes ``/metrics`` every second for a while and reports its own ``scrape_duration_seconds``.

    python scripts/bench_metrics.py --devices 10000 --hours 2 --window-s 300 --prometheus
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekit.fleet.metrics import IngestMetrics, MetricsServer  # noqa: E402
from edgekit.fleet.sim.seed import seed_history  # noqa: E402
from edgekit.fleet.store import open_store  # noqa: E402


def _scrape(url: str, times: int) -> dict[str, float]:
    seconds, size, lines = [], 0, 0
    for _ in range(times):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as response:
            body = response.read()
        seconds.append(time.perf_counter() - started)
        size, lines = len(body), body.count(b"\n")
    return {"bytes": size, "lines": lines, "seconds_median": round(statistics.median(seconds), 3),
            "seconds_max": round(max(seconds), 3), "scrapes": times}  # fmt: skip


def _prometheus(metrics_url: str, seconds: float, workdir: Path) -> dict[str, float]:
    """A real Prometheus scraping ``metrics_url`` every second for ``seconds``: its own view of the scrapes."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    target = urllib.parse.urlsplit(metrics_url).netloc
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                                  "scrape_configs": [{"job_name": "edgekit-collector", "static_configs": [{"targets": [target]}]}]}))  # fmt: skip
    port = 19090 + os.getpid() % 1000
    process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(seconds)
        found = {}
        for name, promql in (("scrape_duration_seconds_max", "max_over_time(scrape_duration_seconds[1h])"),
                             ("scrape_duration_seconds_avg", "avg_over_time(scrape_duration_seconds[1h])"),
                             ("scrapes", "count_over_time(up[1h])"), ("up_min", "min_over_time(up[1h])"),
                             ("samples_scraped", "scrape_samples_scraped")):  # fmt: skip
            query = urllib.parse.urlencode({"query": promql})
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=10) as response:
                result = json.loads(response.read())["data"]["result"]
            found[name] = round(float(result[0]["value"][1]), 3) if result else None
        return found
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=300.0)
    parser.add_argument("--store", metavar="URL", help="a store to read, seeded first if it holds no device (default: a new SQLite one)")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--prometheus", type=float, nargs="?", const=20.0, metavar="S",
                        help="also let a real Prometheus scrape /metrics every second for S seconds (default 20)")  # fmt: skip
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="edgekit-bench-metrics-"))
    result: dict[str, object] = {"load_before": os.getloadavg()}
    url = args.store or f"sqlite:///{workdir / 'fleet.db'}"
    with open_store(url) as store:
        summaries = store.device_summaries()
        if not summaries:  # a new store: seed it (a --store URL that already holds devices is read as it is)
            started = time.perf_counter()
            seeded = seed_history(store, fleet="big", devices=args.devices, hours=args.hours, window_s=args.window_s)
            result["seed"] = {"devices": seeded.devices, "windows": seeded.windows, "seconds": round(time.perf_counter() - started, 1)}
            summaries = store.device_summaries()
        result["devices"] = len(summaries)
        metrics = IngestMetrics()  # the collector's view: each device's newest window, as after one window from each
        newest = max((s.last_seen for s in summaries if s.last_seen is not None), default=dt.datetime.now(dt.timezone.utc))
        metrics.observe_windows(store.windows(since=newest - dt.timedelta(seconds=1.5 * args.window_s)))
    with open_store(url) as metrics_store:
        uncached = MetricsServer(metrics, 0, store=metrics_store, cache_s=0.0).start()  # a store read per scrape
        try:
            result["metrics_uncached"] = _scrape(uncached.url, args.scrapes)
            result["metrics_devices"] = _scrape(uncached.url + "/devices", max(args.scrapes // 2, 1))
        finally:
            uncached.stop()
    with open_store(url) as metrics_store:
        served = MetricsServer(metrics, 0, store=metrics_store).start()  # as fleet collect serves it: reads in the background
        try:
            result["metrics"] = _scrape(served.url, args.scrapes)
            if args.prometheus:
                result["prometheus"] = _prometheus(served.url, args.prometheus, workdir)
            text = urllib.request.urlopen(served.url, timeout=60).read().decode()
            result["store_read_seconds"] = float(text.split("\nedgekit_fleet_store_read_seconds ")[1].split()[0])
        finally:
            served.stop()
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
