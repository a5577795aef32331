"""Telemetry messages built from real runtime records, for the agent tests and the producer process."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.telemetry import BundleRef, TelemetryProblem, build_telemetry
from edgekit_runtime.sensors.base import DeviceState, PowerSample, summarize_samples
from edgekit_runtime.timing import LatencyStats

WINDOW_START = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
BUNDLE = BundleRef(id="minilm-int8-2026.01", sha256="ab" * 32)


def sample_telemetry(
    seq: int, *, device: str = "dev-1", fleet: str = "lab", spool: Spool | None = None, **overrides: Any
) -> dict[str, Any]:
    """A full ``telemetry.v1`` message: measured power, three thermal zones, one reported problem."""
    power = summarize_samples(
        [PowerSample(0.0, {"VDD_IN": 5000.0}, 5000.0), PowerSample(10.0, {"VDD_IN": 7000.0}, 7000.0)],
        source="ina3221 VDD_IN",
    )
    arguments: dict[str, Any] = {
        "seq": seq,
        "device": device,
        "fleet": fleet,
        "window_start": WINDOW_START,
        "window_end": WINDOW_START + timedelta(seconds=10),
        "latency": LatencyStats.from_samples([2.0, 2.5, 3.0, 4.0, 12.0]),
        "queue_latency": LatencyStats.from_samples([0.1, 0.2, 0.4, 0.3, 0.1]),
        "failed_inferences": 1,
        "power": power,
        "device_state": DeviceState({"cpu-thermal": 48.5, "gpu-thermal": 46.0, "soc0": 47.25}, 2048.0, 7620.0,
                                    35.5, 12.0),  # fmt: skip
        "bundle": BUNDLE,
        "rss_mb": 180.5,
        "errors": [TelemetryProblem("inference.failed", "input 'image' has shape [1, 3] but needs [1, 1, 8, 8]")],
        "spool_dropped": spool.dropped_total() if spool is not None else 0,
        "spool_backlog": spool.backlog() if spool is not None else 0,
    }
    arguments.update(overrides)
    return build_telemetry(**arguments)
