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
from edgekit.fleet.sim.seed import SeedSummary, seed_history
from edgekit.target import TargetProfile


def true_latency_ms(bundle: KnownBundle, target: TargetProfile, truth: Factors, measured_peak: dict[str, Any] | None = None) -> float:
    return apply_factors(roofline(bundle.cost, hardware_for(target, measured=measured_peak)), truth)[1]


def ground_truth_behaviours(target: TargetProfile, bundles: Sequence[KnownBundle], truth: Factors,
                            measured_peak: dict[str, Any] | None = None) -> dict[str, BundleBehaviour]:  # fmt: skip
    """bundle id -> behaviour whose simulated p50 is the ground-truth estimate on ``target``."""
    base = synthetic_profile(target).latency_p50_ms
    return {b.ids[0]: BundleBehaviour(latency_factor=true_latency_ms(b, target, truth, measured_peak) / base) for b in bundles}


def seed_ground_truth(store: object, target: TargetProfile, bundles: Sequence[KnownBundle], truth: Factors, *,
                      devices: int = 3, hours: float = 1.0, window_s: float = 60.0, fleet: str = "truth",
                      now: dt.datetime | None = None, measured_peak: dict[str, Any] | None = None) -> list[SeedSummary]:  # fmt: skip
    """Seed ``store`` with ``devices`` simulated devices of ``target`` per bundle, latency from ``truth``."""
    behaviours = ground_truth_behaviours(target, bundles, truth, measured_peak)
    return [seed_history(store, fleet=f"{fleet}-{index}", devices=devices, hours=hours, window_s=window_s,  # type: ignore[arg-type]
                         targets=(target.name,), bundles=(bundle.ids[0],), upgrade_at=None, behaviours=behaviours,
                         now=now, seed=index)  # fmt: skip
            for index, bundle in enumerate(bundles)]
