"""A simulated fleet whose latency follows KNOWN ground-truth efficiency factors, to test calibration.

The fleet simulator's latency is synthetic (:mod:`edgekit.fleet.sim.profiles`); here each bundle's
:class:`~edgekit.fleet.sim.device.BundleBehaviour` ``latency_factor`` is set so that a simulated
device's median latency is the estimate under the ground-truth factors (times the simulator's own
per-unit speed spread and load slowdown, which calibration absorbs like a real fleet's).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from edgekit.estimate.fleet_fit import KnownBundle
from edgekit.estimate.hardware import hardware_for
from edgekit.estimate.roofline import Factors, apply_factors, roofline
from edgekit.fleet.sim.device import BundleBehaviour
from edgekit.fleet.sim.profiles import synthetic_profile
from edgekit.fleet.sim.seed import SeedSummary, device_names, seed_history
from edgekit.fleet.store.base import DeviceIdentityRecord, DeviceStatus
from edgekit.target import TargetProfile


def true_latency_ms(bundle: KnownBundle, target: TargetProfile, truth: Factors, measured_peak: dict[str, Any] | None = None,
                    power_mode: str | None = None) -> float:  # fmt: skip
    return apply_factors(roofline(bundle.cost, hardware_for(target, power_mode, measured=measured_peak)), truth)[1]


def ground_truth_behaviours(target: TargetProfile, bundles: Sequence[KnownBundle], truth: Factors,
                            measured_peak: dict[str, Any] | None = None, power_mode: str | None = None) -> dict[str, BundleBehaviour]:  # fmt: skip
    """bundle id -> behaviour whose simulated p50 is the ground-truth estimate on ``target`` (at ``power_mode``)."""
    base = synthetic_profile(target).latency_p50_ms
    return {b.ids[0]: BundleBehaviour(latency_factor=true_latency_ms(b, target, truth, measured_peak, power_mode) / base) for b in bundles}


def seed_ground_truth(store: object, target: TargetProfile, bundles: Sequence[KnownBundle], truth: Factors, *,
                      devices: int = 3, hours: float = 1.0, window_s: float = 60.0, fleet: str = "truth",
                      now: dt.datetime | None = None, measured_peak: dict[str, Any] | None = None,
                      power_mode: str | None = None) -> list[SeedSummary]:  # fmt: skip
    """Seed ``store`` with ``devices`` simulated devices of ``target`` per bundle, latency from ``truth`` at
    ``power_mode``; with a mode, each device reports it in its identity (as an agent on nvpmodel does)."""
    behaviours = ground_truth_behaviours(target, bundles, truth, measured_peak, power_mode)
    now = now or dt.datetime.now(dt.timezone.utc)
    summaries = []
    for index, bundle in enumerate(bundles):
        name = f"{fleet}-{index}"
        if power_mode is not None:  # first: the fleet aggregates take a window's mode from what its device reported
            for device, _ in device_names(devices, (target.name,)):
                identity = DeviceIdentityRecord(fleet=name, device=device, board=None, soc=None, os=None, l4t=None, jetpack=None,
                                                cuda=None, tensorrt=None, onnxruntime=None, power_mode=power_mode,
                                                clocks_locked=None, updated_at=now)  # fmt: skip
                store.upsert_status(DeviceStatus(fleet=name, device=device, state="online", bundle_id=bundle.ids[0],  # type: ignore[attr-defined]
                                                 target=target.name, agent_version="sim-1", updated_at=now, identity=identity))  # fmt: skip
        summaries.append(seed_history(store, fleet=name, devices=devices, hours=hours, window_s=window_s,  # type: ignore[arg-type]
                                      targets=(target.name,), bundles=(bundle.ids[0],), upgrade_at=None, behaviours=behaviours,
                                      now=now, seed=index))  # fmt: skip
    return summaries
