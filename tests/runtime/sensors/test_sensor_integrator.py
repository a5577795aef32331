"""PowerIntegrator: trapezoid and counter energy, windows, and the no-sensor path."""

from __future__ import annotations

import logging
import threading

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import (
    NoPowerSensor,
    PowerIntegrator,
    PowerSample,
    energy_per_inference_mj,
)
from edgekit_runtime.sensors.base import METHOD_COUNTER, METHOD_TRAPEZOID


def _samples(powers_mw: list[float], *, step_s: float, start_s: float = 100.0) -> list[PowerSample]:
    return [PowerSample(start_s + i * step_s, {"VDD_IN": p}, p) for i, p in enumerate(powers_mw)]


def test_constant_power_gives_power_times_time() -> None:
    integrator = PowerIntegrator(source="test")
    integrator.extend(_samples([5000.0] * 21, step_s=0.5))  # 10 s at 5 W
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(50_000.0)
    assert stats.mean_mw == pytest.approx(5000.0)
    assert stats.max_mw == 5000.0
    assert stats.duration_s == pytest.approx(10.0)
    assert stats.samples == 21
    assert stats.energy_method == METHOD_TRAPEZOID
    assert stats.reason is None and stats.source == "test"


def test_trapezoid_is_exact_for_a_linear_ramp_and_uneven_steps() -> None:
    # 0 -> 1000 mW linearly over 2 s, sampled at uneven times: area = 1000 mJ.
    times = [0.0, 0.1, 0.7, 1.5, 2.0]
    samples = [PowerSample(t, {}, 500.0 * t) for t in times]
    integrator = PowerIntegrator(source="ramp")
    integrator.extend(samples)
    result = integrator.stats()
    assert result.energy_mj == pytest.approx(1000.0)
    assert result.mean_mw == pytest.approx(500.0)
    assert result.max_mw == pytest.approx(1000.0)


def test_counter_difference_wins_over_trapezoid() -> None:
    # total_mw readings disagree with the counter on purpose: the counter must be used.
    samples = [
        PowerSample(10.0, {"gpu0": 9_000.0}, 9_000.0, energy_mj=100.0),
        PowerSample(11.0, {"gpu0": 1_000.0}, 1_000.0, energy_mj=600.0),
        PowerSample(12.0, {"gpu0": 9_000.0}, 9_000.0, energy_mj=1_600.0),
    ]
    integrator = PowerIntegrator(source="nvml")
    integrator.extend(samples)
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(1_500.0)
    assert stats.mean_mw == pytest.approx(750.0)
    assert stats.max_mw == 9_000.0
    assert stats.energy_method == METHOD_COUNTER


def test_counter_only_samples_without_power_still_give_energy() -> None:
    # RAPL's first sample has a counter but no power yet.
    samples = [
        PowerSample(0.0, {}, None, energy_mj=0.0),
        PowerSample(2.0, {"package-0": 4000.0}, 4000.0, 8000.0),
    ]
    integrator = PowerIntegrator(source="rapl")
    integrator.extend(samples)
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(8000.0)
    assert stats.mean_mw == pytest.approx(4000.0)


def test_counter_going_backwards_falls_back_to_trapezoid(caplog: pytest.LogCaptureFixture) -> None:
    samples = [
        PowerSample(0.0, {}, 2000.0, energy_mj=5_000.0),
        PowerSample(1.0, {}, 2000.0, energy_mj=10.0),  # driver reloaded: counter restarted
        PowerSample(2.0, {}, 2000.0, energy_mj=2_010.0),
    ]
    integrator = PowerIntegrator(source="nvml")
    integrator.extend(samples)
    with caplog.at_level(logging.WARNING):
        stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(4000.0)
    assert stats.energy_method == METHOD_TRAPEZOID
    assert "went backwards" in caplog.text


def test_samples_missing_a_counter_use_trapezoid() -> None:
    samples = [PowerSample(0.0, {}, 1000.0, 50.0), PowerSample(1.0, {}, 3000.0, None)]
    integrator = PowerIntegrator(source="mixed")
    integrator.extend(samples)
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(2000.0)
    assert stats.energy_method == METHOD_TRAPEZOID


def test_empty_window_has_no_numbers_and_says_why() -> None:
    stats = PowerIntegrator(source="ina3221").stats()
    assert (stats.mean_mw, stats.max_mw, stats.energy_mj) == (None, None, None)
    assert stats.samples == 0
    assert stats.reason == "no samples in the window"


def test_none_sensor_windows_carry_the_reason_not_a_number(clock) -> None:
    sensor = NoPowerSensor(clock=clock)
    integrator = PowerIntegrator.for_sensor(sensor)
    for _ in range(3):
        integrator.add(sensor.read())
        clock.advance(1.0)
    stats = integrator.take_window()
    assert (stats.mean_mw, stats.max_mw, stats.energy_mj) == (None, None, None)
    assert stats.reason == "no power sensor"
    assert stats.samples == 3 and stats.duration_s == pytest.approx(2.0)
    assert stats.source == "none (no power sensor)"


def test_one_power_reading_gives_power_but_no_energy() -> None:
    integrator = PowerIntegrator(source="tegrastats")
    integrator.add(PowerSample(5.0, {"VDD_IN": 4200.0}, 4200.0))
    stats = integrator.stats()
    assert stats.mean_mw == 4200.0 and stats.max_mw == 4200.0
    assert stats.energy_mj is None
    assert stats.reason == "one power reading in the window; energy needs at least two"


def test_consecutive_windows_cover_time_without_gaps() -> None:
    integrator = PowerIntegrator(source="test")
    integrator.extend(_samples([1000.0] * 5, step_s=0.5, start_s=0.0))  # 0.0 .. 2.0 s
    first = integrator.take_window()
    integrator.extend(_samples([3000.0] * 4, step_s=0.5, start_s=2.5))  # 2.5 .. 4.0 s
    second = integrator.take_window()
    assert first.energy_mj == pytest.approx(2000.0)
    # The second window starts at the first's last sample (2.0 s, 1000 mW): 0.5 s ramp + 1.5 s flat.
    assert second.duration_s == pytest.approx(2.0)
    assert second.energy_mj == pytest.approx(0.5 * (1000 + 3000) / 2 + 1.5 * 3000)
    assert integrator.sample_count == 1


def test_stats_selects_a_time_range() -> None:
    integrator = PowerIntegrator(source="test")
    integrator.extend(_samples([1000.0, 1000.0, 5000.0, 5000.0, 5000.0], step_s=1.0, start_s=0.0))
    stats = integrator.stats(start_s=2.0, end_s=4.0)
    assert stats.samples == 3
    assert stats.energy_mj == pytest.approx(10_000.0)


def test_out_of_order_sample_is_rejected_with_both_times() -> None:
    integrator = PowerIntegrator(source="test")
    integrator.add(PowerSample(10.0, {}, 1.0))
    with pytest.raises(
        SensorError, match=r"sample at 9\.500000 s is older than the previous one at 10\.000000 s"
    ):
        integrator.add(PowerSample(9.5, {}, 1.0))


def test_max_samples_bounds_memory_and_is_validated() -> None:
    integrator = PowerIntegrator(source="test", max_samples=3)
    integrator.extend(_samples([1.0] * 10, step_s=1.0))
    assert integrator.sample_count == 3
    with pytest.raises(SensorError, match="max_samples must be at least 2, got 1"):
        PowerIntegrator(source="test", max_samples=1)


def test_energy_per_inference() -> None:
    integrator = PowerIntegrator(source="test")
    integrator.extend(_samples([3000.0] * 3, step_s=0.5))  # 3000 mJ
    stats = integrator.stats()
    assert energy_per_inference_mj(stats, 6) == pytest.approx(500.0)
    assert energy_per_inference_mj(stats, 0) is None
    assert energy_per_inference_mj(PowerIntegrator(source="x").stats(), 10) is None


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3"])
def test_energy_per_inference_rejects_bad_counts(bad: object) -> None:
    stats = PowerIntegrator(source="x").stats()
    with pytest.raises(SensorError, match=r"inferences must be a non-negative int, got") as info:
        energy_per_inference_mj(stats, bad)  # type: ignore[arg-type]
    assert "inferences completed inside the window" in str(info.value)


def test_feeding_thread_and_window_taker_lose_no_energy() -> None:
    integrator = PowerIntegrator(source="test")
    samples = _samples([2000.0] * 5001, step_s=0.001, start_s=0.0)  # 5 s at 2 W = 10 J
    feeder = threading.Thread(target=lambda: [integrator.add(s) for s in samples])
    windows = []
    feeder.start()
    while feeder.is_alive():
        windows.append(integrator.take_window())
    feeder.join()
    windows.append(integrator.take_window())
    total_mj = sum(w.energy_mj for w in windows if w.energy_mj is not None)
    assert total_mj == pytest.approx(10_000.0)
