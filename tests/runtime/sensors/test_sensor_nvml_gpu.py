"""The NVML sensor on a real NVIDIA GPU (marked ``gpu``; skipped with the reason anywhere else).

The fakes in test_sensor_nvml.py pin the sensor's logic; these tests check it against the real driver:
board power and the energy counter read sensible values, the GPU load it reports rises while a matrix
product loop runs (through torch or CuPy, whichever is importable with a CUDA device), ``auto`` picks
NVML on such a host, and one read is cheap enough for the agent's sampling interval.

Measured numbers go to the JUnit report through ``record_property`` (scripts/check_gpu.sh collects them).
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from edgekit_runtime.agent.config import PowerConfig
from edgekit_runtime.sensors import Ina3221PowerSensor, NvmlPowerSensor, create_sensor

pytestmark = pytest.mark.gpu

LOAD_SECONDS = 2.0
MATRIX_SIZE = 4096  # fp16: 137 GFLOP a product, ~0.2 ms on an H100, ~10 ms on a small laptop GPU
PRODUCTS_PER_POLL = 20


@pytest.fixture
def nvml_sensor() -> Iterator[NvmlPowerSensor]:
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py (pynvml) is not installed")
    sensor = NvmlPowerSensor()
    if not sensor.available():
        pytest.skip(f"NVML has no GPU power reading here: {sensor.unavailable_reason}")
    yield sensor
    sensor.close()


def test_reads_board_power_and_the_energy_counter(nvml_sensor: NvmlPowerSensor, record_property: Callable[[str, object], None]) -> None:
    first = nvml_sensor.read()
    time.sleep(0.5)
    second = nvml_sensor.read()
    assert first.total_mw is not None and first.total_mw > 0, first
    assert first.rails_mw and all(re.fullmatch(r"gpu\d+", rail) for rail in first.rails_mw), first.rails_mw
    record_property("nvml_source", nvml_sensor.source)
    record_property("idle_power_w", round(first.total_mw / 1000, 1))
    if first.energy_mj is None:
        assert "(no energy counter)" in nvml_sensor.source
        return
    assert second.energy_mj is not None and second.energy_mj > first.energy_mj
    counter_power_w = (second.energy_mj - first.energy_mj) / (second.timestamp_s - first.timestamp_s) / 1000
    record_property("idle_power_from_counter_w", round(counter_power_w, 1))
    assert 0 < counter_power_w < 5000, f"{counter_power_w:.1f} W from the energy counter is not a board's power"


def test_gpu_load_and_power_rise_under_a_matrix_product_loop(
    nvml_sensor: NvmlPowerSensor, record_property: Callable[[str, object], None]
) -> None:
    load = _matmul_load()
    idle_load_pct = nvml_sensor.gpu_load_pct()
    assert idle_load_pct is not None, "nvmlDeviceGetUtilizationRates is not supported on this GPU"
    before = nvml_sensor.read()
    loaded_pct: list[float] = []
    deadline = time.monotonic() + LOAD_SECONDS
    while time.monotonic() < deadline:
        load.run(PRODUCTS_PER_POLL)
        reading = nvml_sensor.gpu_load_pct()
        if reading is not None:
            loaded_pct.append(reading)
    after = nvml_sensor.read()
    peak_pct = max(loaded_pct, default=0.0)
    record_property("load_generator", load.name)
    record_property("gpu_load_idle_pct", idle_load_pct)
    record_property("gpu_load_peak_pct", peak_pct)
    record_property("power_before_load_w", round((before.total_mw or 0) / 1000, 1))
    record_property("power_after_load_w", round((after.total_mw or 0) / 1000, 1))
    assert peak_pct >= 50 and peak_pct > idle_load_pct, (
        f"NVML GPU load stayed at {peak_pct}% (idle {idle_load_pct}%) during {LOAD_SECONDS} s of {load.name} products"
    )
    if before.energy_mj is not None and after.energy_mj is not None:
        loaded_w = (after.energy_mj - before.energy_mj) / (after.timestamp_s - before.timestamp_s) / 1000
        record_property("power_under_load_from_counter_w", round(loaded_w, 1))
        assert before.total_mw is not None and loaded_w > before.total_mw / 1000, (
            f"mean power under load {loaded_w:.1f} W is not above the {before.total_mw / 1000:.1f} W read before it"
        )


def test_auto_picks_nvml_on_this_host(nvml_sensor: NvmlPowerSensor) -> None:
    if Ina3221PowerSensor().available():
        pytest.skip("this host has an INA3221 power monitor, which 'auto' tries before NVML")
    with create_sensor("auto") as sensor:
        assert sensor.name == "nvml", sensor.source
        assert sensor.read().total_mw is not None


def test_a_read_costs_far_less_than_the_agent_sampling_interval(
    nvml_sensor: NvmlPowerSensor, record_property: Callable[[str, object], None]
) -> None:
    nvml_sensor.read()  # warm
    reads, started = 0, time.perf_counter()
    while time.perf_counter() - started < 1.0:
        nvml_sensor.read()
        reads += 1
    elapsed = time.perf_counter() - started
    reads_per_s = reads / elapsed
    read_ms = 1000 * elapsed / reads
    record_property("nvml_reads_per_s", round(reads_per_s, 1))
    record_property("nvml_read_ms", round(read_ms, 3))
    interval_s = PowerConfig().sample_interval_s
    # Sampling at the agent's default interval should keep the sampling thread busy under 10% of its time.
    assert read_ms < 100 * interval_s, f"one NVML read takes {read_ms:.2f} ms; the agent samples every {interval_s} s"


# -- helpers -------------------------------------------------------------------------------------------


@dataclass
class _MatmulLoad:
    """Queues ``count`` fp16 matrix products on GPU 0 and waits for them."""

    name: str
    run: Callable[[int], None]


def _matmul_load() -> _MatmulLoad:
    for make in (_torch_load, _cupy_load):
        load = make()
        if load is not None:
            return load
    pytest.skip("neither torch with CUDA nor CuPy with a CUDA device is importable: no way to load the GPU")


def _torch_load() -> _MatmulLoad | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    generator = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(MATRIX_SIZE, MATRIX_SIZE, device="cuda", dtype=torch.float16, generator=generator) for _ in range(2))

    def run(count: int) -> None:
        for _ in range(count):
            torch.matmul(a, b)
        torch.cuda.synchronize()

    return _MatmulLoad(f"torch {torch.__version__}", run)


def _cupy_load() -> _MatmulLoad | None:
    if importlib.util.find_spec("cupy") is None:
        return None
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    rng = cupy.random.default_rng(0)
    a, b = (rng.standard_normal((MATRIX_SIZE, MATRIX_SIZE), dtype=cupy.float32).astype(cupy.float16) for _ in range(2))

    def run(count: int) -> None:
        for _ in range(count):
            cupy.matmul(a, b)
        cupy.cuda.get_current_stream().synchronize()

    return _MatmulLoad(f"cupy {cupy.__version__}", run)
