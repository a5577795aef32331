"""The simulator's copy of the runtime's telemetry builder, without the per-message JSON Schema check.

:func:`edgekit_runtime.agent.telemetry.build_telemetry` validates every message against
``telemetry.v1``; that check is about 80% of the 0.46 ms a simulated window costs, and with 10,000
devices at 10 s windows (1,000 windows a second) it alone would take half a core of this host. A
simulated device's messages differ from one window to the next only in their numbers, so the
simulator builds a device's first window (and every ``validate_every``-th) with the runtime's
validating builder and the others here. ``tests/fleet/simulate/test_unchecked_telemetry.py`` checks
that this function returns exactly what ``build_telemetry`` returns for the same inputs (windows with
and without inferences, errors, no bundle), so the copy cannot drift from the runtime unnoticed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from edgekit_runtime.agent.telemetry import TELEMETRY_SCHEMA, BundleRef, TelemetryProblem
from edgekit_runtime.sensors.base import DeviceState, PowerStats
from edgekit_runtime.timing import LatencyStats

_LATENCY_NAMES = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def unchecked_telemetry(*, seq: int, device: str, fleet: str, window_start: datetime, window_end: datetime,
                        latency: LatencyStats | None, power: PowerStats, device_state: DeviceState,
                        failed_inferences: int, bundle: BundleRef | None, rss_mb: float | None,
                        errors: Sequence[TelemetryProblem], agent_version: str) -> dict[str, Any]:  # fmt: skip
    """What ``build_telemetry`` returns for these arguments (a simulated device's subset of them), unchecked.
    Only for ids and values a validated message of the same device already carried."""
    count = latency.count if latency is not None else 0
    duration_s = (window_end - window_start).total_seconds()
    if latency is None:
        latency_fields: dict[str, float | None] = dict.fromkeys(_LATENCY_NAMES)
    else:
        latency_fields = {name: _finite(getattr(latency, name)) for name in _LATENCY_NAMES}
    energy = power.energy_mj / count if power.energy_mj is not None and count else None
    return {
        "schema": TELEMETRY_SCHEMA,
        "seq": seq,
        "device": device,
        "fleet": fleet,
        "agent_version": agent_version,
        "bundle": bundle.to_dict() if bundle is not None else None,
        "window": {"start": _timestamp(window_start), "end": _timestamp(window_end)},
        "latency": {
            "count": count,
            "errors": failed_inferences,
            **latency_fields,
            "queue_p50_ms": None,
            "queue_p99_ms": None,
            "throughput_per_s": _finite(count / duration_s) if duration_s > 0 else None,
        },
        "power": {
            "mean_mw": _finite(power.mean_mw),
            "max_mw": _finite(power.max_mw),
            "energy_mj": _finite(power.energy_mj),
            "source": power.source or "unknown",
            "reason": power.reason,
        },
        "energy_per_inference_mj": _finite(energy),
        "temperatures_c": {zone: float(c) for zone, c in device_state.temperatures_c.items() if math.isfinite(c)},
        "memory": {
            "used_mb": _finite(device_state.memory_used_mb),
            "total_mb": _finite(device_state.memory_total_mb),
            "rss_mb": _finite(rss_mb),
        },
        "cpu_load_pct": _finite(device_state.cpu_load_pct),
        "gpu_load_pct": _finite(device_state.gpu_load_pct),
        "errors": [problem.to_dict() for problem in errors],
        "spool": {"dropped": 0, "backlog": 0},
    }
