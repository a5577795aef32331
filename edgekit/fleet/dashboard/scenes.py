"""Stores in known states for the dashboard's browser tests and its screenshot review
(``scripts/dashboard_screenshots.py``): a seeded fleet, one device with a short latency spike, and long
names and reasons that must not widen the page. Every figure is SYNTHETIC (:mod:`edgekit.fleet.sim.seed`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from edgekit.fleet.sim.seed import device_names, seed_history
from edgekit.fleet.store.base import DeviceEvent, FleetStore

#: Bundle ids that share a long prefix: a legend cutting names at a fixed length shows them as one.
LONG_BUNDLES = ("digits-cnn-x86-64-onnxruntime-fp32-2026-11-01", "digits-cnn-x86-64-onnxruntime-int8-2026-11-20")
LONG_REASON = ("canary health check failed: p99 latency rose from 8.1 ms to 24.6 ms on jetson-orin-nano-8gb-000 "
               "(budget 1.5x) and the error rate reached 2.4% (budget 1%) during the 600 s observation window; "
               "rolled back every device that had installed the bundle, see the events of each device for details. " * 2)  # fmt: skip


@dataclass(frozen=True)
class Spike:
    """Where :func:`seed_spike` put the spike: device, when, and its p99."""

    fleet: str
    device: str
    start: dt.datetime
    end: dt.datetime
    p99_ms: float
    baseline_p99_max_ms: float  # the highest p99 of the device's other windows


def seed_spike(store: FleetStore, *, fleet: str = "sim", hours: float = 1.0, window_s: float = 10.0,
               spike_s: float = 20.0, spike_at: float = 0.6, factor: float = 3.0, now: dt.datetime | None = None) -> Spike:  # fmt: skip
    """One simulated device over ``hours`` whose p99 is ``factor`` times its worst for ``spike_s`` seconds at
    ``spike_at`` of the period (a canary whose latency tripled for 20 s). The history is made by
    :func:`~edgekit.fleet.sim.seed.seed_history` in a scratch store, then the spike's windows are raised."""
    from edgekit.fleet.store import open_store

    now = now or dt.datetime.now(dt.timezone.utc)
    device = device_names(1)[0][0]
    with open_store("sqlite:///:memory:") as scratch:
        seed_history(scratch, fleet=fleet, devices=1, hours=hours, window_s=window_s, upgrade_at=None, now=now)
        windows = list(scratch.windows(fleet=fleet, device=device))
    start = windows[int(len(windows) * spike_at)].window_start
    end = start + dt.timedelta(seconds=spike_s)
    baseline = max(w.p99_ms or 0.0 for w in windows)
    p99 = round(baseline * factor, 3)
    raised = [dataclasses.replace(w, p99_ms=p99, max_ms=max(p99, w.max_ms or 0.0), payload_json=None)
              if start <= w.window_start < end else w for w in windows]  # fmt: skip
    store.add_windows(raised)
    seed_history(store, fleet=fleet, devices=1, hours=0.0, window_s=window_s, upgrade_at=None, now=now)  # status and target
    return Spike(fleet, device, start, end, p99, baseline)


def seed_long_names(store: FleetStore, *, fleet: str = "sim", devices: int = 6, hours: float = 2.0,
                    now: dt.datetime | None = None) -> None:
    """A fleet on two bundles whose ids share a long prefix, an event with a long message and a rolled-back
    rollout with a long reason (in the store's rollout table)."""
    from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log

    now = now or dt.datetime.now(dt.timezone.utc)
    seed_history(store, fleet=fleet, devices=devices, hours=hours, window_s=60.0, bundles=LONG_BUNDLES, upgrade_at=0.5, now=now)
    device = device_names(1)[0][0]
    store.add_events([DeviceEvent(fleet=fleet, device=device, event_id="long-message-1", kind="self_check_failed",
                                  level="error", message=LONG_REASON, at=now, payload={})])  # fmt: skip
    names = [name for name, _ in device_names(devices)]
    with open_rollout_log(store.url) as log:
        log.save(RolloutRecord("long-reason", fleet, LONG_BUNDLES[1], "file:///bundles/" + LONG_BUNDLES[1] + ".tar", "0" * 64,
                               "rolled_back", (names[0],), tuple(names), now - dt.timedelta(minutes=30), now,
                               reason=LONG_REASON, outcomes={name: "rolled_back" for name in names},
                               health={"error_rate": 0.024, "p99_before_ms": 8.1, "p99_after_ms": 24.6}))  # fmt: skip
