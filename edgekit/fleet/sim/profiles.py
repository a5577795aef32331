"""Synthetic latency and power profiles for simulated devices, derived from target profiles.

Every number here is SYNTHETIC: a plausible figure for demos and load tests, never a measurement.
A profile is derived from a :class:`~edgekit.target.TargetProfile` like this:

* **latency**: a reference workload of :data:`REFERENCE_WORK_GOP` (about one ResNet-50 inference)
  on :data:`PEAK_UTILISATION` of the target's best dense accelerator peak throughput (a sparse figure
  counts half); CPU-only targets (CPU peaks are not used) get :data:`CPU_GOPS_PER_CORE` per core. p50 is
  clamped to at least :data:`MIN_LATENCY_MS`; the spread is log-normal (``latency_sigma``).
* **rate**: at full load a device runs inferences :data:`BUSY_SHARE` of the time (at most
  :data:`MAX_INFERENCES_PER_S` a second); load follows a daily cycle per device.
* **power**: busy power is :data:`ACTIVE_FRACTION` of the power mode the peak figure is quoted at
  (else the lowest mode); idle is :data:`IDLE_FRACTION` of busy. Targets without power modes get
  :data:`CPU_WATTS_PER_CORE` per core plus :data:`BOARD_WATTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.target import TargetProfile, get_target

REFERENCE_WORK_GOP = 4.0
PEAK_UTILISATION = 0.05
CPU_GOPS_PER_CORE = {"arm64": 25.0, "x86_64": 60.0}
MIN_LATENCY_MS = 0.3
ACTIVE_FRACTION = 0.7
IDLE_FRACTION = 0.3
CPU_WATTS_PER_CORE = {"arm64": 1.6, "x86_64": 6.0}
BOARD_WATTS = 1.0
BUSY_SHARE = 0.3  # at full load, the accelerator is busy with inferences 30% of the time
MAX_INFERENCES_PER_S = 200.0
DEFAULT_TARGETS = ("jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "raspberry-pi-5")


@dataclass(frozen=True)
class SyntheticProfile:
    """How a simulated device of one target behaves (synthetic numbers, see the module docstring)."""

    target: str
    latency_p50_ms: float
    latency_sigma: float
    idle_power_mw: float
    active_power_mw: float
    memory_total_mb: float
    has_gpu: bool
    inferences_per_s: float = 20.0
    ambient_c: float = 32.0
    hot_rise_c: float = 38.0  # temperature rise at full utilisation


def _effective_gops(target: TargetProfile) -> tuple[float, str | None]:
    """(usable GOPS, the power mode the peak figure is quoted at)."""
    best, mode = 0.0, None
    for peak in target.peak_throughput:
        if peak.engine == "cpu":  # PEAK_UTILISATION is an accelerator's share; CPUs use CPU_GOPS_PER_CORE
            continue
        dense = peak.value * (0.5 if peak.sparse else 1.0) * 1000.0
        if dense > best:
            best, mode = dense, peak.power_mode
    if best > 0:
        return best * PEAK_UTILISATION, mode
    return target.cpu.cores * CPU_GOPS_PER_CORE[target.cpu.arch], None


def synthetic_profile(target: TargetProfile) -> SyntheticProfile:
    """The synthetic profile of ``target`` (see the module docstring for the rules)."""
    gops, mode = _effective_gops(target)
    latency_ms = max(MIN_LATENCY_MS, REFERENCE_WORK_GOP / gops * 1000.0)
    if target.power_modes:
        watts = target.power_modes[mode] if mode in target.power_modes else min(target.power_modes.values())
        active_w = watts * ACTIVE_FRACTION
    else:
        active_w = BOARD_WATTS + target.cpu.cores * CPU_WATTS_PER_CORE[target.cpu.arch]
    return SyntheticProfile(
        target=target.name,
        latency_p50_ms=round(latency_ms, 3),
        latency_sigma=0.25,
        idle_power_mw=round(active_w * IDLE_FRACTION * 1000.0, 1),
        active_power_mw=round(active_w * 1000.0, 1),
        memory_total_mb=target.memory.gb * 1024.0,
        has_gpu=target.gpu is not None or target.npu is not None,
        inferences_per_s=round(min(MAX_INFERENCES_PER_S, BUSY_SHARE * 1000.0 / latency_ms), 2),
    )


def profiles_for(names: tuple[str, ...] | list[str]) -> list[SyntheticProfile]:
    """Synthetic profiles of the named targets (unknown names raise TargetError with the known ones)."""
    return [synthetic_profile(get_target(name)) for name in names]
