"""The simulator's unchecked telemetry builder returns exactly what the runtime's validating builder does."""

from __future__ import annotations

import datetime as dt

from edgekit.fleet.sim.device import BundleBehaviour, VirtualAgent
from edgekit.fleet.sim.profiles import profiles_for
from edgekit.fleet.sim.unchecked_telemetry import unchecked_telemetry
from edgekit_runtime.agent.telemetry import BundleRef, TelemetryProblem, build_telemetry, encode_message
from edgekit_runtime.schemas import schema_problems
from edgekit_runtime.sensors.base import DeviceState, PowerStats
from edgekit_runtime.timing import LatencyStats

START = dt.datetime(2026, 11, 27, 23, 0, tzinfo=dt.timezone.utc)
BUNDLE = BundleRef("demo-v1", "ab" * 32)


def _both(**kwargs: object) -> tuple[dict, dict]:
    return build_telemetry(**kwargs), unchecked_telemetry(**kwargs)  # type: ignore[arg-type]


def test_identical_to_build_telemetry_with_and_without_inferences_errors_and_bundle() -> None:
    latency = LatencyStats(count=57, mean_ms=4.2, min_ms=2.0, p50_ms=4.0, p90_ms=5.5, p99_ms=7.9, max_ms=9.1, std_ms=1.0)
    power = PowerStats(mean_mw=5000.0, max_mw=5750.0, energy_mj=50_000.0, duration_s=10.0, samples=100, source="synthetic")
    no_energy = PowerStats(mean_mw=None, max_mw=None, energy_mj=None, duration_s=10.0, samples=0, source=None, reason="no sensor")
    state = DeviceState(temperatures_c={"soc": 55.25, "gpu": float("nan")}, memory_used_mb=2048.0, memory_total_mb=8192.0,
                        cpu_load_pct=40.0, gpu_load_pct=None)  # fmt: skip
    cases = [
        dict(latency=latency, power=power, failed_inferences=0, bundle=BUNDLE, errors=()),
        dict(latency=None, power=no_energy, failed_inferences=3, bundle=None,
             errors=(TelemetryProblem("inference.failed", "3 inference(s) failed in the window"),)),
        dict(latency=latency, power=no_energy, failed_inferences=1, bundle=BUNDLE, errors=()),
    ]  # fmt: skip
    for case in cases:
        built, unchecked = _both(seq=7, device="nano-001", fleet="sim", window_start=START,
                                 window_end=START + dt.timedelta(seconds=10), device_state=state, rss_mb=180.0,
                                 agent_version="sim-1", **case)  # fmt: skip
        assert unchecked == built
        assert encode_message(unchecked) == encode_message(built)


def test_a_device_validating_every_tenth_window_sends_the_same_windows() -> None:
    profile = profiles_for(["raspberry-pi-5"])[0]
    flaky = {"demo-v1": BundleBehaviour(error_rate=0.2)}

    def windows(validate_every: int) -> list[dict]:
        agent = VirtualAgent("sim", "pi-001", profile, send=print, schedule=print, bundle=BUNDLE, behaviours=flaky, seed=3,
                             validate_every=validate_every)  # fmt: skip
        return [agent.telemetry(START + dt.timedelta(seconds=10 * i), START + dt.timedelta(seconds=10 * (i + 1))) for i in range(30)]

    checked, mostly_unchecked = windows(1), windows(10)
    assert checked == mostly_unchecked
    assert any(w["errors"] for w in checked) and all(schema_problems(w, "telemetry.v1") == [] for w in mostly_unchecked)
