"""Seed a fleet store with synthetic history (``edgekit fleet simulate --history 24h --store URL``).

``devices`` simulated devices (named as the live simulator names them) each report one window every
``window_s`` seconds over the last ``hours``; with ``upgrade_at`` set, every device switches from
``bundles[0]`` to ``bundles[1]`` at that point, so before/after views have a change to show.

Windows go into the store through the collector's own write path (:meth:`FleetStore.add_windows`,
:meth:`~FleetStore.upsert_statuses`, :meth:`~FleetStore.set_device_target`) as records (no MQTT, no
JSON Schema), time step by time step across the fleet, as a collector would receive them. Memory
stays bounded: one batch of windows (``batch_windows``) plus one small model per device, whatever the
length of the history. The figures come from the same :class:`~edgekit.fleet.sim.device.VirtualAgent`
model as the live simulator's, one random stream per device from ``seed``: the same arguments give
the same windows. Every figure is SYNTHETIC.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from edgekit.fleet.sim.device import BundleBehaviour, VirtualAgent
from edgekit.fleet.sim.profiles import DEFAULT_TARGETS, profiles_for
from edgekit.fleet.store.base import DeviceStatus, FleetStore, TelemetryWindow
from edgekit.progress import StageReporter
from edgekit_runtime.agent.telemetry import BundleRef
from edgekit_runtime.agent.topics import TelemetryError

#: Windows handed to one ``add_windows`` call (one transaction).
DEFAULT_BATCH_WINDOWS = 5000
#: Statuses handed to one ``upsert_statuses`` call.
_STATUS_BATCH = 1000
#: Seconds between two progress notes.
PROGRESS_EVERY_S = 5.0
MAX_SEED_DEVICES = 100_000
_SEEDED_PAYLOAD = {"seeded": True}
_SEEDED_PAYLOAD_JSON = '{"seeded":true}'


class SeedError(TelemetryError):
    """Synthetic history cannot be seeded as asked (a bad device count, window length or history length)."""


@dataclass(frozen=True)
class SeedSummary:
    devices: int
    windows: int
    first_window_start: dt.datetime
    last_window_end: dt.datetime
    #: wall-clock seconds the seeding took (records built and stored)
    seconds: float = 0.0

    @property
    def windows_per_s(self) -> float:
        return self.windows / self.seconds if self.seconds > 0 else 0.0


def device_names(count: int, targets: Sequence[str] = DEFAULT_TARGETS, first: int = 0) -> list[tuple[str, str]]:
    """(device id, target) as the live simulator names them: ``<target>-<index>`` for indexes from ``first``."""
    return [(f"{targets[i % len(targets)]}-{i:03d}", targets[i % len(targets)]) for i in range(first, first + count)]


def _noop(*args: object) -> None:
    return None


def check_seed_request(devices: int, hours: float, window_s: float, *, min_windows: int = 1) -> int:
    """The number of windows per device; raises :class:`SeedError` naming the bad value, or naming --history and
    --window-s when fewer than ``min_windows`` windows would be seeded (``fleet simulate --history 1m --window-s 300``
    would store every device online with no window, online for good)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_SEED_DEVICES:
        raise SeedError(f"devices must be an integer from 1 to {MAX_SEED_DEVICES}, got {devices!r}", hint="e.g. --devices 10000")
    if not 1.0 <= window_s < math.inf:
        raise SeedError(f"window length must be a finite number of seconds, at least 1, got {window_s!r}",
                        hint="e.g. --window-s 10 (the agent's default), 60 or 300")  # fmt: skip
    if not 0 <= hours < math.inf:
        raise SeedError(f"history must be a finite number of hours, zero or more, got {hours!r}", hint="e.g. --history 24h or --history 7d")
    count = math.floor(hours * 3600.0 / window_s + 1e-9)  # 115 s of 1 s windows is 115, not 114.99999999999999
    if count < min_windows:
        raise SeedError(f"--history of {hours * 3600.0:g} s is shorter than one --window-s {window_s:g} s window: no window "
                        "would be seeded", hint=f"give a --history of at least {window_s:g} s, or a shorter --window-s")  # fmt: skip
    return count


def _window(agent: VirtualAgent, seq: int, window_start: dt.datetime, window_end: dt.datetime, window_s: float) -> TelemetryWindow:
    sample = agent.sample(window_start, window_end)
    latency = sample.latency
    completed = latency.count if latency is not None else 0
    energy_mj = sample.power.energy_mj
    bundle = agent.bundle
    return TelemetryWindow(
        fleet=agent.fleet, device=agent.device, seq=seq, window_start=window_start, window_end=window_end,
        received_at=window_end, bundle_id=bundle.id if bundle else None, bundle_sha256=bundle.sha256 if bundle else None,
        count=completed, errors=sample.errors, p50_ms=latency.p50_ms if latency else None,
        p90_ms=latency.p90_ms if latency else None, p99_ms=latency.p99_ms if latency else None,
        max_ms=latency.max_ms if latency else None, mean_ms=latency.mean_ms if latency else None,
        throughput_per_s=completed / window_s, power_mean_mw=sample.power.mean_mw, power_max_mw=sample.power.max_mw,
        energy_mj=energy_mj, energy_per_inference_mj=energy_mj / completed if completed and energy_mj is not None else None,
        temperature_max_c=max(sample.state.temperatures_c.values()), memory_used_mb=sample.state.memory_used_mb,
        cpu_load_pct=sample.state.cpu_load_pct, gpu_load_pct=sample.state.gpu_load_pct,
        payload=_SEEDED_PAYLOAD, payload_json=_SEEDED_PAYLOAD_JSON,
    )  # fmt: skip


def history_batches(agents: Sequence[VirtualAgent], *, count: int, start: dt.datetime, window_s: float,
                    switch_index: int, upgrade: BundleRef | None,
                    batch_windows: int = DEFAULT_BATCH_WINDOWS) -> Iterator[list[TelemetryWindow]]:  # fmt: skip
    """Windows of every agent, time step by time step (window ``i`` of every device before window ``i + 1``
    of any), in lists of at most ``batch_windows``. Window ``i`` of a device has seq ``i + 1``."""
    batch: list[TelemetryWindow] = []
    step = dt.timedelta(seconds=window_s)
    for i in range(count):
        if i == switch_index and upgrade is not None:
            for agent in agents:
                agent.bundle = upgrade
        window_start = start + step * i
        window_end = window_start + step
        for agent in agents:
            batch.append(_window(agent, i + 1, window_start, window_end, window_s))
            if len(batch) >= batch_windows:
                yield batch
                batch = []
    if batch:
        yield batch


class _ProgressNotes:
    """A note every ``PROGRESS_EVERY_S``: windows stored, share done, rate, time left."""

    def __init__(self, progress: StageReporter | None, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.progress, self.total, self.clock = progress, total, clock
        self.started = self.last = clock()

    def update(self, written: int) -> None:
        now = self.clock()
        if self.progress is None or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = written / max(now - self.started, 1e-9)
        left_s = (self.total - written) / rate if rate > 0 else float("inf")
        self.progress.note(f"{written:,} of {self.total:,} windows ({100.0 * written / max(self.total, 1):.1f}%), "
                           f"{rate:,.0f} windows/s, about {left_s / 60.0:.1f} min left")  # fmt: skip


def _store_statuses(store: FleetStore, agents: Sequence[VirtualAgent], bundle: BundleRef | None, now: dt.datetime) -> None:
    """Each device ``online`` with its last bundle and its target (:meth:`FleetStore.upsert_statuses` records the target too)."""
    statuses = [DeviceStatus(fleet=agent.fleet, device=agent.device, state="online", bundle_id=bundle.id if bundle else None,
                             target=agent.profile.target, agent_version="sim-1", updated_at=now, payload=_SEEDED_PAYLOAD)
                for agent in agents]  # fmt: skip
    for first in range(0, len(statuses), _STATUS_BATCH):
        store.upsert_statuses(statuses[first:first + _STATUS_BATCH])


def seed_history(store: FleetStore, *, fleet: str = "sim", devices: int = 20, hours: float = 24.0, window_s: float = 60.0,
                 targets: Sequence[str] = DEFAULT_TARGETS, bundles: Sequence[str] = ("demo-v1", "demo-v2"),
                 upgrade_at: float | None = 0.7, behaviours: Mapping[str, BundleBehaviour] | None = None,
                 now: dt.datetime | None = None, seed: int = 0, progress: StageReporter | None = None,
                 batch_windows: int = DEFAULT_BATCH_WINDOWS) -> SeedSummary:  # fmt: skip
    """Write ``hours`` of windows (one every ``window_s``) for ``devices`` devices; returns what was written.
    ``progress`` (e.g. :class:`~edgekit.progress.RichStageReporter`) gets a note every few seconds. A history shorter
    than one window writes only the devices' statuses and targets (the dashboard's scenes add their own windows);
    ``fleet simulate --history`` refuses it (:func:`check_seed_request`)."""
    count = check_seed_request(devices, hours, window_s, min_windows=0)
    if not targets:
        raise SeedError("no targets given: the devices need at least one target profile", hint=f"e.g. {', '.join(DEFAULT_TARGETS)}")
    started = time.monotonic()
    now = now or dt.datetime.now(dt.timezone.utc)
    start = now - dt.timedelta(seconds=count * window_s)
    switch_index = int(count * upgrade_at) if upgrade_at is not None and len(bundles) > 1 else count
    refs = [BundleRef(b, hashlib.sha256(b.encode()).hexdigest()) for b in bundles]
    profiles = {p.target: p for p in profiles_for(list(dict.fromkeys(targets)))}
    names = device_names(devices, targets)
    agents = [VirtualAgent(fleet, device, profiles[target], send=_noop, schedule=_noop, bundle=refs[0] if refs else None,
                           behaviours=behaviours, interval_s=window_s, seed=seed * 100_003 + index)
              for index, (device, target) in enumerate(names)]  # fmt: skip
    upgrade = refs[1] if len(refs) > 1 and switch_index < count else None
    _store_statuses(store, agents, upgrade or (refs[0] if refs else None), now)  # first, so readers see every device (and its target) while windows arrive
    notes = _ProgressNotes(progress, count * devices)
    written = 0
    for batch in history_batches(agents, count=count, start=start, window_s=window_s, switch_index=switch_index,
                                 upgrade=upgrade, batch_windows=batch_windows):  # fmt: skip
        written += store.add_windows(batch)
        notes.update(written)
    return SeedSummary(devices=devices, windows=written, first_window_start=start, last_window_end=now,
                       seconds=time.monotonic() - started)  # fmt: skip
