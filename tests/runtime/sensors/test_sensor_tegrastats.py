"""tegrastats parsing (JetPack 4 and 5+ lines) and the sensor over line sources and a subprocess."""

from __future__ import annotations

import os
import stat
import time
from datetime import datetime
from pathlib import Path

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import PowerIntegrator, TegrastatsPowerSensor, parse_tegrastats_line

LOGS = Path(__file__).parent / "fixtures" / "tegrastats"


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines(keepends=True)


def test_jetpack4_nano_line() -> None:
    reading = parse_tegrastats_line(_lines("jetpack4_nano.log")[0])
    assert reading.rails_mw == {"POM_5V_IN": 4520.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 1078.0}
    assert reading.rails_average_mw == {"POM_5V_IN": 4680.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 1205.0}
    assert reading.total_rail == "POM_5V_IN" and reading.total_mw == 4520.0
    assert (reading.ram_used_mb, reading.ram_total_mb) == (1180.0, 3965.0)
    assert reading.cpu_loads_pct == [30.0, 33.0, 28.0, 26.0]
    assert reading.cpu_load_pct == pytest.approx(29.25)
    assert reading.gpu_load_pct == 0.0
    assert reading.temperatures_c == {
        "PLL": 57.0,
        "CPU": 60.5,
        "PMIC": 100.0,
        "GPU": 59.0,
        "AO": 65.0,
        "thermal": 59.75,
    }
    assert reading.logged_at is None


def test_jetpack6_orin_nano_line_with_units_and_timestamp() -> None:
    reading = parse_tegrastats_line(_lines("jetpack6_orin_nano.log")[3])
    assert reading.rails_mw == {"VDD_IN": 6626.0, "VDD_CPU_GPU_CV": 1228.0, "VDD_SOC": 2380.0}
    assert reading.rails_average_mw["VDD_IN"] == 6625.0
    assert reading.total_mw == 6626.0
    assert (reading.ram_used_mb, reading.ram_total_mb) == (779.0, 7620.0)
    assert reading.cpu_loads_pct == [0.0] * 6
    assert reading.gpu_load_pct == 0.0
    assert reading.temperatures_c["cpu"] == 50.125 and reading.temperatures_c["tj"] == 50.562
    assert set(reading.temperatures_c) == {"cpu", "soc2", "soc0", "gpu", "tj", "soc1"}
    assert reading.logged_at == datetime(2026, 4, 27, 15, 0, 54)


def test_jetpack5_agx_orin_line_sums_rails_and_reads_bracketed_gpu() -> None:
    reading = parse_tegrastats_line(_lines("jetpack5_agx_orin.log")[0])
    assert reading.rails_mw == {
        "VDD_GPU_SOC": 3150.0,
        "VDD_CPU_CV": 14312.0,
        "VIN_SYS_5V0": 4968.0,
        "VDDQ_VDD2_1V8AO": 1091.0,
    }
    assert reading.total_rail is None
    assert reading.total_mw == 3150.0 + 14312.0 + 4968.0 + 1091.0
    assert reading.gpu_load_pct == 14.0  # GR3D_FREQ 14%@[407,407]
    assert reading.temperatures_c["CPU"] == 77.281 and reading.temperatures_c["tj"] == 77.281
    assert len(reading.cpu_loads_pct) == 12


def test_unconnected_nc_rails_are_dropped() -> None:
    # Some AGX Orin releases also print the INA3221 channels labelled NC.
    line = _lines("jetpack5_agx_orin.log")[0].rstrip() + " NC 0mW/0mW"
    assert "NC" not in parse_tegrastats_line(line).rails_mw


def test_jetpack4_xavier_nx_parked_cores_and_tx2_negative_temperatures() -> None:
    nx = parse_tegrastats_line(_lines("jetpack4_xavier_nx.log")[0])
    assert nx.cpu_loads_pct == [12.0, 8.0, 4.0, None, None, None]
    assert nx.cpu_load_pct == pytest.approx(8.0)
    assert nx.gpu_load_pct == 33.0
    assert nx.total_mw == 3902.0
    tx2 = parse_tegrastats_line(_lines("jetpack4_tx2.log")[0])
    assert tx2.temperatures_c["BCPU"] == -45.0 and tx2.temperatures_c["GPU"] == -51.0
    # RAM/SWAP "used/total MB" and engine clocks ("NVENC 716") are not rails.
    assert set(tx2.rails_mw) == {"VDD_IN", "VDD_CPU", "VDD_GPU", "VDD_SOC", "VDD_WIFI", "VDD_DDR"}
    assert tx2.total_mw == 14025.0


def test_reading_as_device_state() -> None:
    state = parse_tegrastats_line(_lines("jetpack4_xavier_nx.log")[0]).device_state()
    assert state is not None
    assert (state.memory_used_mb, state.memory_total_mb) == (2673.0, 7765.0)
    assert state.cpu_load_pct == pytest.approx(8.0) and state.gpu_load_pct == 33.0
    assert state.temperatures_c["CPU"] == 35.0
    assert parse_tegrastats_line("GR3D_FREQ 5%").device_state() is None


def test_jetpack7_thor_vin_is_the_total_and_a_negative_rail_is_kept() -> None:
    # before: VIN was summed with the rails it feeds (23992 mW) and "VDD_GPU -392mW/-392mW" was dropped
    reading = parse_tegrastats_line(_lines("jetpack7_thor.log")[0])
    assert reading.rails_mw == {"VDD_GPU": -392.0, "VDD_CPU_SOC_MSS": 3924.0, "VIN_SYS_5V0": 5064.0, "VIN": 15004.0}
    assert reading.rails_average_mw["VDD_GPU"] == -392.0
    assert reading.total_rail == "VIN" and reading.total_mw == 15004.0
    sensor = TegrastatsPowerSensor(lines=_lines("jetpack7_thor.log"))
    assert sensor.read().total_mw == 15004.0
    assert sensor.source == "tegrastats (line source): total_mw = VIN rail"


def test_jetpack7_thor_current_average_max_triples() -> None:
    # before: "VDD_GPU 37939mW/8660mW/37939mW" (r39 and later) matched no rail at all
    reading = parse_tegrastats_line(_lines("jetpack7_thor.log")[1])
    assert reading.rails_mw == {"VDD_GPU": 37939.0, "VDD_CPU_SOC_MSS": 30059.0, "VIN_SYS_5V0": 15486.0, "VIN": 124486.0}
    assert reading.rails_average_mw == {
        "VDD_GPU": 8660.0,
        "VDD_CPU_SOC_MSS": 12281.0,
        "VIN_SYS_5V0": 7424.0,
        "VIN": 36487.0,
    }
    assert reading.total_rail == "VIN" and reading.total_mw == 124486.0
    assert reading.gpu_load_pct == 87.0 and reading.temperatures_c == {"cpu": 58.25, "tj": 66.625}


def test_input_rail_is_preferred_to_vin_and_the_sum_names_every_input_rail() -> None:
    both = parse_tegrastats_line("VIN 9000mW/9000mW VDD_IN 7000mW/7000mW VDD_SOC 1000mW/1000mW")
    assert both.total_rail == "VDD_IN" and both.total_mw == 7000.0
    sensor = TegrastatsPowerSensor(lines=_lines("jetpack5_agx_orin.log"))
    sensor.read()
    assert sensor.source == "tegrastats (line source): total_mw = sum of rails (no VDD_IN/POM_5V_IN/VIN rail)"


def test_offline_thermal_zones_are_left_out_of_the_device_state() -> None:
    # Orin prints power-gated zones as -256C; before, device_state() reported them as temperatures.
    reading = parse_tegrastats_line(_lines("jetpack6_agx_orin_offline_zones.log")[0])
    assert reading.temperatures_c["CV0"] == -256.0 and reading.temperatures_c["GPU"] == -256.0  # the line as printed
    state = reading.device_state()
    assert state is not None
    assert state.temperatures_c == {"CPU": 44.562, "Tboard": 32.0, "SOC2": 40.093, "tj": 44.343}


def test_line_source_replays_a_log_and_integrates(clock) -> None:
    sensor = TegrastatsPowerSensor(lines=_lines("jetpack4_nano.log"), clock=clock)
    assert sensor.available()
    integrator = PowerIntegrator.for_sensor(sensor)
    first = sensor.read()
    clock.advance(1.0)
    second = sensor.read()
    integrator.extend([first, second])
    assert (first.total_mw, second.total_mw) == (4520.0, 2545.0)
    assert second.rails_mw["POM_5V_CPU"] == 549.0
    assert integrator.stats().energy_mj == pytest.approx((4520.0 + 2545.0) / 2)
    assert integrator.stats().source == "tegrastats (line source): total_mw = POM_5V_IN rail"
    assert sensor.last_reading is not None and sensor.last_reading.ram_used_mb == 1766.0
    assert sensor.source == "tegrastats (line source): total_mw = POM_5V_IN rail"
    with pytest.raises(SensorError, match="the tegrastats line source has no more lines"):
        sensor.read()


def test_line_timestamps_replay_a_recorded_log_in_its_own_time() -> None:
    sensor = TegrastatsPowerSensor(lines=_lines("jetpack6_orin_nano.log")[:3], line_timestamps=True)
    integrator = PowerIntegrator.for_sensor(sensor)
    for _ in range(3):
        integrator.extend(sensor.read_pending())
    stats = integrator.stats()
    assert stats.duration_s == pytest.approx(2.0)  # 14:59:41 .. 14:59:43
    assert stats.energy_mj == pytest.approx(2 * 4761.0)
    assert stats.mean_mw == pytest.approx(4761.0)
    with pytest.raises(SensorError, match="no more lines"):
        sensor.read_pending()


def test_line_without_rails_has_no_power() -> None:
    # A board without INA3221 monitors (Jetson Nano 2GB) prints no rail fields.
    line = (
        "RAM 1012/1977MB (lfb 4x1MB) SWAP 0/988MB (cached 0MB) "
        "CPU [5%@921,2%@921,0%@921,1%@921] GR3D_FREQ 0%@76"
    )
    sensor = TegrastatsPowerSensor(lines=[line, line])
    integrator = PowerIntegrator.for_sensor(sensor)
    integrator.extend([sensor.read(), sensor.read()])
    stats = integrator.stats()
    assert stats.energy_mj is None and stats.mean_mw is None
    assert stats.reason == "no sample in the window carried a power reading"


def test_blank_lines_are_skipped() -> None:
    sensor = TegrastatsPowerSensor(lines=["\n", "   \n", _lines("jetpack4_tx2.log")[0]])
    assert sensor.read().total_mw == 14025.0


@pytest.mark.parametrize("bad", [0, -100, 1.5, True])
def test_interval_must_be_positive_milliseconds(bad: object) -> None:
    with pytest.raises(SensorError, match=r"interval_ms must be a positive int of milliseconds, got") as info:
        TegrastatsPowerSensor(lines=[], interval_ms=bad)  # type: ignore[arg-type]
    assert "tegrastats --interval takes milliseconds" in str(info.value)


def test_missing_tegrastats_is_unavailable(tmp_path: Path) -> None:
    sensor = TegrastatsPowerSensor(tmp_path)
    assert not sensor.available()
    assert sensor.unavailable_reason == (
        f"tegrastats not found at {tmp_path / 'usr/bin/tegrastats'} (it ships with JetPack on Jetson devices)"
    )


def test_tegrastats_that_is_not_executable(tmp_path: Path) -> None:
    executable = tmp_path / "usr/bin/tegrastats"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o644)
    if os.access(executable, os.X_OK):
        pytest.skip("this user may execute any file (root on some filesystems)")
    assert TegrastatsPowerSensor(tmp_path).unavailable_reason == f"{executable} is not executable"


def _install_fake_tegrastats(root: Path, body: str) -> Path:
    executable = root / "usr/bin/tegrastats"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n" + body)
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return executable


def test_subprocess_source_streams_lines(tmp_path: Path) -> None:
    # A stand-in for /usr/bin/tegrastats that checks its arguments and prints recorded JetPack 6 lines.
    log = LOGS / "jetpack6_orin_nano.log"
    _install_fake_tegrastats(
        tmp_path,
        f'[ "$1" = "--interval" ] && [ "$2" = "50" ] || {{ echo "bad args: $*" >&2; exit 2; }}\n'
        f'while true; do while IFS= read -r line; do echo "$line"; sleep 0.05; done < "{log}"; done\n',
    )
    with TegrastatsPowerSensor(tmp_path, interval_ms=50) as sensor:
        first = sensor.read()
        assert first.total_mw == 4761.0
        assert first.rails_mw == {"VDD_IN": 4761.0, "VDD_CPU_GPU_CV": 515.0, "VDD_SOC": 1428.0}
        time.sleep(0.4)
        pending = sensor.read_pending()
        assert len(pending) >= 2
        assert [s.timestamp_s for s in pending] == sorted(s.timestamp_s for s in pending)
        assert all(s.total_mw in (4761.0, 6626.0) for s in pending)
        assert (
            sensor.source
            == f"tegrastats ({tmp_path / 'usr/bin/tegrastats'} --interval 50): total_mw = VDD_IN rail"
        )
        process = sensor._process
        assert process is not None
    assert process.poll() is not None


def test_subprocess_that_exits_reports_its_status_and_stderr(tmp_path: Path) -> None:
    _install_fake_tegrastats(tmp_path, 'echo "tegrastats: must be run as root" >&2\nexit 1\n')
    sensor = TegrastatsPowerSensor(tmp_path, interval_ms=100)
    with sensor, pytest.raises(SensorError, match=r"exited: exit status 1: tegrastats: must be run as root"):
        sensor.read()
    again = TegrastatsPowerSensor(tmp_path, interval_ms=100)
    with again:
        deadline = time.monotonic() + 5
        with pytest.raises(SensorError, match=r"exited: exit status 1: tegrastats: must be run as root"):
            while time.monotonic() < deadline:  # read_pending() never waits: poll until the exit shows
                assert again.read_pending() == []
                time.sleep(0.02)


def test_subprocess_silent_past_the_timeout(tmp_path: Path) -> None:
    _install_fake_tegrastats(tmp_path, "sleep 5\n")
    sensor = TegrastatsPowerSensor(tmp_path, interval_ms=100, read_timeout_s=0.3)
    with sensor, pytest.raises(SensorError, match=r"no line from .*tegrastats within 0\.3 s") as info:
        sensor.read()
    assert "sudo tegrastats --interval 1000" in str(info.value)
