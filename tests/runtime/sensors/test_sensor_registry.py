"""The SENSORS registry, create_sensor('auto') selection order, the none sensor, import hygiene."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import AUTO_ORDER, SENSORS, NoPowerSensor, create_sensor

LOGS = Path(__file__).parent / "fixtures" / "tegrastats"


def test_registry_names_match_the_classes() -> None:
    assert list(SENSORS) == ["ina3221", "tegrastats", "nvml", "rapl", "none"]
    assert all(cls.name == name for name, cls in SENSORS.items())
    assert AUTO_ORDER == ("ina3221", "nvml", "rapl", "none")


def test_every_registered_sensor_reads_through_create_sensor(
    fixtures_dir: Path, fake_nvml, gpu_spec, clock
) -> None:
    """One real read per registry entry; fails when a sensor is registered without a case here."""
    cases = {
        "ina3221": (fixtures_dir / "jetson_orin_nano_jp6", {}),
        "tegrastats": (Path("/"), {"lines": (LOGS / "jetpack6_orin_nano.log").read_text().splitlines()}),
        "nvml": (Path("/"), {"nvml": fake_nvml([gpu_spec()])}),
        "rapl": (fixtures_dir / "x86_intel_rapl", {}),
        "none": (Path("/"), {}),
    }
    assert set(cases) == set(SENSORS)
    for name, (root, options) in cases.items():
        with create_sensor(name, root, clock=clock, **options) as sensor:
            assert isinstance(sensor, SENSORS[name])
            assert sensor.available(), f"{name}: {sensor.unavailable_reason}"
            assert sensor.read().timestamp_s == clock.now


def test_none_sensor() -> None:
    sensor = create_sensor("none")
    assert isinstance(sensor, NoPowerSensor)
    assert sensor.available() and sensor.unavailable_reason is None
    sample = sensor.read()
    assert (sample.rails_mw, sample.total_mw, sample.energy_mj) == ({}, None, None)
    assert sensor.no_power_reason == "no power sensor"
    assert sensor.read_pending()[0].total_mw is None


def test_auto_prefers_ina3221_even_with_nvml(fixtures_dir: Path, fake_nvml, gpu_spec) -> None:
    sensor = create_sensor("auto", fixtures_dir / "jetson_orin_nano_jp6", nvml=fake_nvml([gpu_spec()]))
    assert sensor.name == "ina3221"


def test_auto_takes_nvml_before_rapl(fixtures_dir: Path, fake_nvml, gpu_spec) -> None:
    nvml = fake_nvml([gpu_spec()])
    assert create_sensor("auto", fixtures_dir / "x86_intel_rapl", nvml=nvml).name == "nvml"


def test_auto_falls_to_rapl_when_nvml_power_is_not_supported(fixtures_dir: Path, fake_nvml, gpu_spec) -> None:
    nvml = fake_nvml([gpu_spec(power_mw=None, energy_mj=None)])
    sensor = create_sensor("auto", fixtures_dir / "x86_intel_rapl", nvml=nvml)
    assert sensor.name == "rapl"
    assert nvml.calls["shutdown"] == 1  # the skipped candidate was closed


def test_auto_ends_at_none_and_logs_why(
    fixtures_dir: Path, fake_nvml, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="edgekit_runtime.sensors"):
        sensor = create_sensor("auto", fixtures_dir / "bare_linux", nvml=fake_nvml([]))
    assert sensor.name == "none"
    assert "skipped ina3221: no INA3221 power monitor" in caplog.text
    assert "nvml: NVML sees no GPU" in caplog.text
    assert "rapl: no RAPL zones" in caplog.text


def test_auto_never_starts_tegrastats(tmp_path: Path, fake_nvml) -> None:
    executable = tmp_path / "usr/bin/tegrastats"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\necho started >&2\n")
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR)
    assert create_sensor("auto", tmp_path, nvml=fake_nvml([])).name == "none"


def test_auto_passes_each_candidate_only_its_options(fixtures_dir: Path, fake_nvml, clock) -> None:
    # total_rail only exists on ina3221; nvml= only on nvml; clock= on all.
    sensor = create_sensor(
        "auto", fixtures_dir / "x86_intel_rapl", total_rail="VDD_IN", nvml=fake_nvml([]), clock=clock
    )
    assert sensor.name == "rapl"
    assert sensor.read().timestamp_s == clock.now


def test_unknown_sensor_name_lists_the_known_ones() -> None:
    with pytest.raises(SensorError) as info:
        create_sensor("ina219")
    assert (
        info.value.message
        == "unknown power sensor 'ina219'; known sensors: ina3221, tegrastats, nvml, rapl, none, auto"
    )
    assert info.value.hint == "use 'auto' to pick the first available one, or 'none' to record no power"


def test_unknown_option_for_a_named_sensor() -> None:
    with pytest.raises(
        SensorError,
        match=r"power sensor 'rapl' takes no option\(s\) \['total_rail'\]; it accepts: \['clock'\]",
    ):
        create_sensor("rapl", total_rail="VDD_IN")


def test_unknown_option_for_auto() -> None:
    with pytest.raises(
        SensorError,
        match=r"no sensor tried by 'auto' \(ina3221, nvml, rapl, none\) takes option\(s\) \['lines'\]",
    ):
        create_sensor("auto", lines=["RAM 1/2MB"])


def test_importing_sensors_pulls_no_heavy_module() -> None:
    code = (
        "import sys, edgekit_runtime.sensors; "
        "print(sorted(m for m in ('torch', 'onnx', 'optimum', 'pynvml') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
