"""NVML sensor with a fake pynvml module passed through the ``nvml`` constructor argument."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import NvmlPowerSensor, PowerIntegrator, create_sensor
from edgekit_runtime.sensors.base import METHOD_COUNTER, METHOD_TRAPEZOID


def test_power_and_energy_counter(fake_nvml, gpu_spec, clock) -> None:
    # The first value of each list answers the probe in available(); reads get the rest.
    nvml = fake_nvml(
        [gpu_spec(power_mw=[0, 70_000, 90_000, 80_000], energy_mj=[0, 1_000_000, 1_070_000, 1_160_000])]
    )
    sensor = NvmlPowerSensor(nvml=nvml, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    integrator = PowerIntegrator.for_sensor(sensor)
    for _ in range(3):
        integrator.add(sensor.read())
        clock.advance(1.0)
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(160_000.0)  # counter difference, not the trapezoid
    assert stats.energy_method == METHOD_COUNTER
    assert stats.mean_mw == pytest.approx(80_000.0)
    assert stats.max_mw == 90_000.0
    assert stats.source == "nvml: total_mw = sum of gpu0 NVIDIA H100 80GB HBM3 board power (energy counter)"


def test_sample_fields(fake_nvml, gpu_spec, clock) -> None:
    sensor = NvmlPowerSensor(nvml=fake_nvml([gpu_spec(power_mw=[65_432], energy_mj=[123_456])]), clock=clock)
    sample = sensor.read()
    assert sample.rails_mw == {"gpu0": 65_432.0}
    assert sample.total_mw == 65_432.0
    assert sample.energy_mj == 123_456.0
    assert sample.timestamp_s == clock.now


def test_jetson_not_supported_is_unavailable_with_the_reason(fake_nvml, gpu_spec) -> None:
    nvml = fake_nvml([gpu_spec(name="Orin (nvgpu)", power_mw=None, energy_mj=None)])
    sensor = NvmlPowerSensor(nvml=nvml)
    assert not sensor.available()
    assert sensor.unavailable_reason == (
        "NVML reports power readings as not supported on GPU 0 (Orin (nvgpu)) "
        "(as on Jetson, whose NVML has no power counters: use the ina3221 sensor)"
    )
    assert nvml.calls["shutdown"] == 1  # NVML released once found useless
    with pytest.raises(SensorError, match="power sensor 'nvml' under root / is not available: NVML reports"):
        sensor.read()


def test_pre_volta_without_energy_counter_integrates_power(fake_nvml, gpu_spec, clock) -> None:
    gpu = gpu_spec(name="Tesla P4", power_mw=[0, 30_000, 50_000], energy_mj=None)  # [0] answers the probe
    sensor = NvmlPowerSensor(nvml=fake_nvml([gpu]), clock=clock)
    integrator = PowerIntegrator.for_sensor(sensor)
    integrator.add(sensor.read())
    clock.advance(2.0)
    integrator.add(sensor.read())
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(80_000.0)
    assert stats.energy_method == METHOD_TRAPEZOID
    assert "(no energy counter)" in stats.source


def test_several_gpus_are_summed_and_can_be_selected(fake_nvml, gpu_spec) -> None:
    gpus = [gpu_spec(power_mw=[100_000], energy_mj=[10]), gpu_spec(power_mw=[200_000], energy_mj=[20])]
    sample = NvmlPowerSensor(nvml=fake_nvml(gpus)).read()
    assert sample.rails_mw == {"gpu0": 100_000.0, "gpu1": 200_000.0}
    assert sample.total_mw == 300_000.0 and sample.energy_mj == 30.0
    only_second = NvmlPowerSensor(nvml=fake_nvml(gpus), device_indices=[1]).read()
    assert only_second.rails_mw == {"gpu1": 200_000.0}


def test_gpu_without_power_support_is_left_out(fake_nvml, gpu_spec) -> None:
    gpus = [gpu_spec(power_mw=[100_000], energy_mj=[10]), gpu_spec(name="old", power_mw=None, energy_mj=None)]
    sample = NvmlPowerSensor(nvml=fake_nvml(gpus)).read()
    assert sample.rails_mw == {"gpu0": 100_000.0}


def test_binding_without_the_energy_call_integrates_power(fake_nvml, gpu_spec, fixtures_dir, clock) -> None:
    # nvidia-ml-py3 7.352.0's pynvml has no nvmlDeviceGetTotalEnergyConsumption; before, the probe raised
    # AttributeError out of create_sensor('auto') and left NVML initialized
    nvml = fake_nvml([gpu_spec(power_mw=[0, 30_000, 50_000])])
    del nvml.nvmlDeviceGetTotalEnergyConsumption
    sensor = create_sensor("auto", fixtures_dir / "x86_intel_rapl", nvml=nvml, clock=clock)
    assert sensor.name == "nvml"
    integrator = PowerIntegrator.for_sensor(sensor)
    integrator.add(sensor.read())
    clock.advance(2.0)
    integrator.add(sensor.read())
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(80_000.0) and stats.energy_method == METHOD_TRAPEZOID
    assert stats.source == "nvml: total_mw = sum of gpu0 NVIDIA H100 80GB HBM3 board power (no energy counter)"


def test_binding_failing_the_probe_shuts_nvml_down_and_auto_moves_on(fake_nvml, gpu_spec, fixtures_dir) -> None:
    nvml = fake_nvml([gpu_spec()])
    del nvml.nvmlDeviceGetHandleByIndex  # a binding without a call the probe needs
    sensor = NvmlPowerSensor(nvml=nvml)
    assert sensor.unavailable_reason == (
        "NVML could not list GPUs: the binding failed: AttributeError: "
        "module 'fake_pynvml' has no attribute 'nvmlDeviceGetHandleByIndex'"
    )
    assert nvml.calls["shutdown"] == nvml.calls["init"] == 1
    assert create_sensor("auto", fixtures_dir / "x86_intel_rapl", nvml=nvml).name == "rapl"
    assert nvml.calls["shutdown"] == nvml.calls["init"] == 2


def test_library_missing(fake_nvml) -> None:
    nvml = fake_nvml([], init_error=12)
    sensor = NvmlPowerSensor(nvml=nvml)
    assert sensor.unavailable_reason == "NVML could not start: NVML Shared Library Not Found"
    assert nvml.calls["shutdown"] == 0  # never started


def test_no_gpu_and_bad_index(fake_nvml, gpu_spec) -> None:
    assert NvmlPowerSensor(nvml=fake_nvml([])).unavailable_reason == "NVML sees no GPU"
    sensor = NvmlPowerSensor(nvml=fake_nvml([gpu_spec()]), device_indices=[0, 3])
    assert sensor.unavailable_reason == "device_indices [3] out of range: NVML sees 1 GPU(s), indices 0..0"


def test_read_failure_names_the_gpu(fake_nvml, gpu_spec) -> None:
    # Probing reads power and energy once each; the third read fails.
    sensor = NvmlPowerSensor(nvml=fake_nvml([gpu_spec(fail_reads_after=2)]))
    with pytest.raises(
        SensorError, match=r"NVML read of GPU 0 \(NVIDIA H100 80GB HBM3\) failed: GPU is lost"
    ):
        sensor.read()


def test_close_shuts_nvml_down_once(fake_nvml, gpu_spec) -> None:
    nvml = fake_nvml([gpu_spec()])
    sensor = NvmlPowerSensor(nvml=nvml)
    sensor.read()
    sensor.close()
    sensor.close()
    assert nvml.calls == {"init": 1, "shutdown": 1, "reads": nvml.calls["reads"]}
    with pytest.raises(SensorError, match="power sensor 'nvml' is closed"):
        sensor.read()


def test_gpu_load(fake_nvml, gpu_spec) -> None:
    assert NvmlPowerSensor(nvml=fake_nvml([gpu_spec(utilization_gpu_pct=37)])).gpu_load_pct() == 37.0
    assert NvmlPowerSensor(nvml=fake_nvml([gpu_spec(utilization_gpu_pct=None)])).gpu_load_pct() is None
    assert NvmlPowerSensor(nvml=fake_nvml([])).gpu_load_pct() is None


def test_missing_bindings_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sensor = NvmlPowerSensor()
    assert (
        sensor.unavailable_reason == "the NVML Python bindings are not installed (pip install nvidia-ml-py)"
    )


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py is not installed")
def test_fake_module_matches_the_real_pynvml_names(fake_nvml_names) -> None:
    pynvml = importlib.import_module("pynvml")
    missing = [name for name in fake_nvml_names if not hasattr(pynvml, name)]
    assert missing == []
    assert pynvml.NVML_ERROR_NOT_SUPPORTED == 3
    assert pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED).value == 3
