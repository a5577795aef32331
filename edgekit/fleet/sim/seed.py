"""Fill a fleet store directly with a simulated history (synthetic numbers), for dashboards, demos and
benchmarks that need hours of data at once: status, target and telemetry windows of ``devices``
devices over the last ``hours``. With ``upgrade_at`` (a share of the period, e.g. 0.7) every device
switches from ``bundles[0]`` to ``bundles[1]`` at that point, so before/after views have a change to show.

Windows go straight into the store as records (no MQTT, no JSON Schema), so a day of 200 devices
takes seconds; the figures come from the same :class:`~edgekit.fleet.sim.device.VirtualAgent` model
as the live simulator's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgekit.fleet.sim.device import BundleBehaviour, VirtualAgent
from edgekit.fleet.sim.profiles import DEFAULT_TARGETS, profiles_for
from edgekit.fleet.store.base import DeviceStatus, FleetStore, TelemetryWindow
from edgekit_runtime.agent.telemetry import BundleRef

_BATCH = 5000


@dataclass(frozen=True)
class SeedSummary:
    devices: int
    windows: int
    first_window_start: dt.datetime
    last_window_end: dt.datetime


def device_names(count: int, targets: Sequence[str] = DEFAULT_TARGETS) -> list[tuple[str, str]]:
    """(device id, target) as the live simulator names them: ``<target>-<index>``."""
    return [(f"{targets[i % len(targets)]}-{i:03d}", targets[i % len(targets)]) for i in range(count)]


def _noop(*args: object) -> None:
    return None


def seed_history(store: FleetStore, *, fleet: str = "sim", devices: int = 20, hours: float = 24.0, window_s: float = 60.0,
                 targets: Sequence[str] = DEFAULT_TARGETS, bundles: Sequence[str] = ("demo-v1", "demo-v2"),
                 upgrade_at: float | None = 0.7, behaviours: Mapping[str, BundleBehaviour] | None = None,
                 now: dt.datetime | None = None, seed: int = 0) -> SeedSummary:  # fmt: skip
    """Write ``hours`` of windows (one every ``window_s``) for ``devices`` devices; returns what was written."""
    now = now or dt.datetime.now(dt.timezone.utc)
    count = int(hours * 3600.0 / window_s)
    start = now - dt.timedelta(seconds=count * window_s)
    switch_index = int(count * upgrade_at) if upgrade_at is not None and len(bundles) > 1 else count
    refs = [BundleRef(b, hashlib.sha256(b.encode()).hexdigest()) for b in bundles]
    profiles = {p.target: p for p in profiles_for(list(dict.fromkeys(targets)))}
    written = 0
    batch: list[TelemetryWindow] = []
    for index, (device, target) in enumerate(device_names(devices, targets)):
        agent = VirtualAgent(fleet, device, profiles[target], send=_noop, schedule=_noop, bundle=refs[0],
                             behaviours=behaviours, seed=seed * 100_003 + index)  # fmt: skip
        for i in range(count):
            if i == switch_index:
                agent.bundle = refs[1]
            window_start = start + dt.timedelta(seconds=i * window_s)
            window_end = window_start + dt.timedelta(seconds=window_s)
            sample = agent.sample(window_start, window_end)
            latency = sample.latency
            completed = latency.count if latency is not None else 0
            energy_mj = sample.power.energy_mj
            batch.append(TelemetryWindow(
                fleet=fleet, device=device, seq=i + 1, window_start=window_start, window_end=window_end,
                received_at=window_end, bundle_id=agent.bundle.id if agent.bundle else None,
                bundle_sha256=agent.bundle.sha256 if agent.bundle else None, count=completed, errors=sample.errors,
                p50_ms=latency.p50_ms if latency else None, p90_ms=latency.p90_ms if latency else None,
                p99_ms=latency.p99_ms if latency else None, max_ms=latency.max_ms if latency else None,
                mean_ms=latency.mean_ms if latency else None, throughput_per_s=completed / window_s,
                power_mean_mw=sample.power.mean_mw, power_max_mw=sample.power.max_mw, energy_mj=energy_mj,
                energy_per_inference_mj=energy_mj / completed if completed and energy_mj is not None else None,
                temperature_max_c=max(sample.state.temperatures_c.values()), memory_used_mb=sample.state.memory_used_mb,
                cpu_load_pct=sample.state.cpu_load_pct, gpu_load_pct=sample.state.gpu_load_pct,
                payload={"seeded": True},
            ))  # fmt: skip
            if len(batch) >= _BATCH:
                written += store.add_windows(batch)
                batch.clear()
        store.set_device_target(fleet, device, target)
        store.upsert_status(DeviceStatus(fleet=fleet, device=device, state="online", bundle_id=agent.bundle.id if agent.bundle else None,
                                         target=target, agent_version="sim-1", updated_at=now,
                                         payload={"seeded": True}))  # fmt: skip
    if batch:
        written += store.add_windows(batch)
    return SeedSummary(devices=devices, windows=written, first_window_start=start, last_window_end=now)
