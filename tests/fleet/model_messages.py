"""Telemetry of agents serving several models (issue 20), built with the runtime's own builder."""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from edgekit_runtime.agent.telemetry import build_telemetry
from edgekit_runtime.sensors.base import DeviceState, PowerSample, summarize_samples
from edgekit_runtime.timing import LatencyStats

from tests.fleet.messages import T0, WINDOW_S


def model_entry(model: str, bundle_id: str | None, latencies_ms: Sequence[float], *, errors: int = 0,
                memory_mb: float | None = 40.0) -> dict[str, Any]:  # fmt: skip
    """One ``models[]`` entry: the model's inferences over a WINDOW_S window."""
    stats = LatencyStats.from_samples(list(latencies_ms)) if latencies_ms else None
    return {
        "model": model, "count": len(latencies_ms), "errors": errors,
        "bundle": None if bundle_id is None else {"id": bundle_id, "sha256": "c" * 64},
        "p50_ms": None if stats is None else round(stats.p50_ms, 4),
        "p99_ms": None if stats is None else round(stats.p99_ms, 4),
        "throughput_per_s": len(latencies_ms) / WINDOW_S, "memory_mb": memory_mb,
    }  # fmt: skip


def model_telemetry(seq: int, models: Sequence[dict[str, Any]], *, device: str = "dev-1", fleet: str = "lab",
                    start: dt.datetime | None = None, power_mw: float = 5000.0) -> dict[str, Any]:  # fmt: skip
    """A telemetry.v1 window of a repository agent: ``model`` and ``bundle`` the first (default) model's,
    ``models`` all of them."""
    start = start or T0 + dt.timedelta(seconds=WINDOW_S * (seq - 1))
    power = summarize_samples([PowerSample(0.0, {"VDD_IN": power_mw}, power_mw),
                               PowerSample(float(WINDOW_S), {"VDD_IN": power_mw}, power_mw)], source="ina3221 VDD_IN")  # fmt: skip
    from edgekit_runtime.agent.telemetry import BundleRef

    default = models[0]
    count = default["count"]
    latencies = [default["p50_ms"]] * count if count else []
    return build_telemetry(
        seq=seq, device=device, fleet=fleet, window_start=start, window_end=start + dt.timedelta(seconds=WINDOW_S),
        latency=LatencyStats.from_samples(latencies) if latencies else None, power=power,
        device_state=DeviceState({"soc": 50.0}, 2048.0, 7620.0, 30.0, 10.0),
        bundle=BundleRef(default["bundle"]["id"], default["bundle"]["sha256"]) if default["bundle"] else None,
        model=default["model"], models=list(models),
    )  # fmt: skip
