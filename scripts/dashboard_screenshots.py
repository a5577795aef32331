#!/usr/bin/env python3
"""Screenshots of the fleet dashboard for review, each at 1,280 and 1,920 px wide (whole page):

* ``quickstart``: ``edgekit fleet up --simulate 20`` (broker, collector, dashboard and 20 simulated devices
  sending one 10 s window each), 30 s after it started;
* ``fleet-200x24h``: a store seeded with 200 devices x 24 h of 1-minute windows, everything older than
  1 h rolled up into 5-minute buckets by the store's retention (the collector's defaults), at the 24 h range;
* ``spike``: one device whose p99 tripled for 20 s, at the 1 h range;
* ``empty``: an empty store;
* ``operator``: the operator's day (issue 32): a rollout in progress (wave 2/3 watching, the gate so far), six
  rollouts in 15 minutes on the charts, cameras serving models (the widest device table), an idle device, one
  without a power sensor, and the device page of a camera that reports its identity and events, at 15 min.

PNGs go to ``--out`` (default ``docs/screenshots/``), reduced to 128-colour palettes when Pillow is
installed so they stay small. Needs Debian's ``chromium`` and ``chromium-driver``; the quick start runs the
embedded broker on a free port, as ``fleet up`` does (``--broker`` for another one). Every device figure is
SYNTHETIC. Prints one line per PNG and the page's horizontal overflow (there should be none).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WIDTHS = (1280, 1920)
SCENES = ("quickstart", "fleet-200x24h", "spike", "empty", "operator")


def shoot(browser: Any, url: str, out: Path, name: str) -> None:
    """Load ``url`` at each width and save the whole page as ``<name>-<width>.png``."""
    driver = browser.driver
    for width in WIDTHS:
        driver.set_window_size(width, 1000)
        browser.load(url)
        time.sleep(0.5)  # let a resize settle the charts
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(height + 16, 4000))
        time.sleep(0.3)
        scroll_width, client_width = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")  # fmt: skip
        path = out / f"{name}-{width}.png"
        driver.save_screenshot(str(path))
        _shrink(path)
        overflow = "no horizontal overflow" if scroll_width <= client_width else f"OVERFLOW {scroll_width} > {client_width} px"
        print(f"{path} ({path.stat().st_size // 1024} KiB, {overflow})", flush=True)


def _shrink(path: Path) -> None:
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def quickstart(browser: Any, out: Path, work: Path, broker: str | None) -> None:
    from edgekit.fleet.local_stack import LocalStack, LocalStackConfig

    config = LocalStackConfig(broker_url=broker, broker_port=0, store_url=f"sqlite:///{work}/quickstart.db",
                              dashboard_port=0, simulate=20)  # fmt: skip
    with LocalStack(config) as stack:
        time.sleep(30)
        shoot(browser, stack.dashboard_url + "#range=0.25", out, "quickstart")  # type: ignore[operator]


def fleet_day(browser: Any, out: Path, work: Path) -> None:
    import datetime as dt

    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import open_store

    from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log
    from edgekit.fleet.sim.seed import device_names

    store_url = f"sqlite:///{work}/fleet.db"
    started = time.monotonic()
    with open_store(store_url) as store:
        summary = seed_history(store, devices=200, hours=24, window_s=60.0, upgrade_at=0.7)
        rolled = store.apply_retention(dt.timedelta(hours=1), rollup_minutes=5)
    switched = summary.first_window_start + 0.7 * (summary.last_window_end - summary.first_window_start)
    names = tuple(name for name, _ in device_names(200))
    with open_rollout_log(store_url) as log:  # the upgrade the seeded history shows, as `fleet deploy` records it
        log.save(RolloutRecord("demo-v2-rollout", "sim", "demo-v2", "file:///bundles/demo-v2.tar", "0" * 64, "completed",
                               names[:10], names, switched, switched + dt.timedelta(minutes=4),
                               outcomes={name: "succeeded" for name in names},
                               health={"error_rate": 0.0, "p99_before_ms": 9.9, "p99_after_ms": 9.4}))  # fmt: skip
    print(f"seeded {summary.windows} windows of 200 devices, rolled {rolled} older than 1 h up, "
          f"in {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    with DashboardServer(store_url, port=0) as server:
        shoot(browser, server.url + "#range=24", out, "fleet-200x24h")


def spike(browser: Any, out: Path, work: Path) -> None:
    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.dashboard.scenes import seed_spike
    from edgekit.fleet.store import open_store

    store_url = f"sqlite:///{work}/spike.db"
    with open_store(store_url) as store:
        found = seed_spike(store, hours=1.0, window_s=10.0, spike_s=20.0)
    print(f"spike: {found.device} p99 {found.p99_ms} ms from {found.start:%H:%M:%S} to {found.end:%H:%M:%S} "
          f"(otherwise at most {found.baseline_p99_max_ms} ms)", flush=True)  # fmt: skip
    with DashboardServer(store_url, port=0) as server:
        shoot(browser, server.url + "#range=1", out, "spike")


def empty(browser: Any, out: Path, work: Path) -> None:
    from edgekit.fleet.dashboard import DashboardServer

    with DashboardServer(f"sqlite:///{work}/empty.db", port=0) as server:
        shoot(browser, server.url, out, "empty")


def operator(browser: Any, out: Path, work: Path) -> None:
    from edgekit.fleet.dashboard import DashboardServer
    from tests.fleet.dashboard.operator_store import CAMERAS, seed_operator_store  # the browser tests' store

    store_url = seed_operator_store(str(work / "operator.db"))
    with DashboardServer(store_url, port=0) as server:
        shoot(browser, server.url + f"#range=0.25&device=lab/{CAMERAS[0]}", out, "operator")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="folder for the PNGs")
    parser.add_argument("--broker", metavar="URL", help="broker for the quick start (default: the embedded one on a free port)")
    parser.add_argument("--only", choices=SCENES, action="append", help="just these scenes (repeatable)")
    args = parser.parse_args(argv)

    from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing

    missing = chromium_missing()
    if missing:
        print(f"cannot take screenshots: {missing}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    scenes = args.only or list(SCENES)
    with tempfile.TemporaryDirectory(prefix="edgekit-screens-") as folder, HeadlessChromium() as browser:
        work = Path(folder)
        for scene in scenes:
            if scene == "quickstart":
                quickstart(browser, args.out, work, args.broker)
            elif scene == "fleet-200x24h":
                fleet_day(browser, args.out, work)
            elif scene == "spike":
                spike(browser, args.out, work)
            elif scene == "operator":
                operator(browser, args.out, work)
            else:
                empty(browser, args.out, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
