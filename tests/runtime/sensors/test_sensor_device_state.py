"""DeviceStateReader against Jetson and x86 fixture trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import DeviceStateReader, parse_tegrastats_line


def _proc_stat(user: int, idle: int, *, system: int = 0, iowait: int = 0, guest: int = 0) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    fields = f"{user} 0 {system} {idle} {iowait} 0 0 0 {guest} 0"
    return f"cpu  {fields}\ncpu0 {fields}\n"


def test_orin_nano_state(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    stat = root / "proc/stat"
    stat.write_text(_proc_stat(user=1000, idle=9000))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # time passes: 300 busy and 700 idle jiffies
        sleeps.append(seconds)
        stat.write_text(_proc_stat(user=1300, idle=9700))

    reader = DeviceStateReader(root, sleep=sleep, first_read_interval_s=0.25)
    state = reader.read()
    assert sleeps == [0.25]
    assert state.cpu_load_pct == pytest.approx(30.0)
    assert state.memory_total_mb == pytest.approx(7802880 / 1024)
    assert state.memory_used_mb == pytest.approx((7802880 - 7004672) / 1024)
    assert state.gpu_load_pct == pytest.approx(14.3)  # 143 per mille
    # cv0..cv2 read -256 C on Orin Nano (no DLA): offline, left out.
    assert state.temperatures_c == {
        "cpu-thermal": 50.125,
        "gpu-thermal": 50.562,
        "soc0-thermal": 49.25,
        "soc1-thermal": 50.437,
        "soc2-thermal": 49.125,
        "tj-thermal": 50.562,
    }

    # The next read compares with the previous one and does not sleep.
    stat.write_text(_proc_stat(user=1300 + 90, idle=9700 + 10, iowait=0))
    assert reader.read().cpu_load_pct == pytest.approx(90.0)
    assert sleeps == [0.25]


def test_iowait_counts_as_idle_and_guest_is_not_double_counted(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    stat = tmp_path / "proc/stat"
    stat.write_text(_proc_stat(user=0, idle=0))
    reader = DeviceStateReader(
        tmp_path, sleep=lambda _: stat.write_text(_proc_stat(user=50, idle=25, iowait=25, guest=40))
    )
    assert reader.read_cpu_load_pct() == pytest.approx(50.0)


def test_no_elapsed_time_gives_no_cpu_load(fixtures_dir: Path) -> None:
    reader = DeviceStateReader(fixtures_dir / "bare_linux", sleep=lambda _: None)
    assert reader.read_cpu_load_pct() is None


def test_nano_jetpack4_gpu_and_thermal_zones(fixtures_dir: Path) -> None:
    reader = DeviceStateReader(fixtures_dir / "jetson_nano_jp4", sleep=lambda _: None)
    state = reader.read()
    assert state.gpu_load_pct == pytest.approx(52.3)
    assert state.temperatures_c["CPU-therm"] == 60.5
    assert state.temperatures_c["PMIC-Die"] == 100.0
    assert len(state.temperatures_c) == 6


def test_agx_orin_jetpack5_gpu_path(fixtures_dir: Path) -> None:
    reader = DeviceStateReader(fixtures_dir / "jetson_agx_orin_jp5", sleep=lambda _: None)
    assert reader.read_gpu_load_pct() == pytest.approx(14.0)
    assert reader.read_temperatures_c()["Tj-therm"] == 77.281


def test_x86_duplicate_zone_types_and_no_gpu(fixtures_dir: Path) -> None:
    reader = DeviceStateReader(fixtures_dir / "x86_intel_rapl", sleep=lambda _: None)
    temperatures = reader.read_temperatures_c()
    assert temperatures == {
        "acpitz": 27.8,
        "acpitz@thermal_zone1": 29.8,
        "x86_pkg_temp": 45.0,
        "iwlwifi_1": 0.0,
    }
    assert reader.read_gpu_load_pct() is None
    with_nvml = DeviceStateReader(fixtures_dir / "x86_intel_rapl", gpu_load_pct=lambda: 42.0)
    assert with_nvml.read_gpu_load_pct() == 42.0


def test_unreadable_thermal_zone_is_skipped(fixture_root) -> None:
    root = fixture_root("jetson_nano_jp4")
    temp = root / "sys/class/thermal/thermal_zone1/temp"
    temp.unlink()
    temp.mkdir()
    assert "CPU-therm" not in DeviceStateReader(root).read_temperatures_c()


def test_meminfo_without_memavailable_falls_back(fixture_root) -> None:
    root = fixture_root("bare_linux")
    meminfo = root / "proc/meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n")
    used_mb, total_mb = DeviceStateReader(root).read_memory_mb()
    assert (used_mb, total_mb) == pytest.approx(((1000 - 400) / 1024, 1000 / 1024))


def test_missing_proc_files_raise_with_the_path(tmp_path: Path) -> None:
    reader = DeviceStateReader(tmp_path, sleep=lambda _: None)
    with pytest.raises(
        SensorError, match=r"cannot read .*proc/meminfo: No such file or directory \(ENOENT\)"
    ):
        reader.read()
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("Active: 5 kB\n")
    with pytest.raises(SensorError, match=r"proc/meminfo has no MemTotal line") as info:
        reader.read_memory_mb()
    assert "point root at a Linux /proc" in str(info.value)
    (tmp_path / "proc/stat").write_text("intr 1 2 3\n")
    with pytest.raises(SensorError, match=r"proc/stat has no aggregate 'cpu' line"):
        reader.read_cpu_load_pct()


def test_tegrastats_line_and_sysfs_agree_on_the_shape() -> None:
    line = (Path(__file__).parent / "fixtures/tegrastats/jetpack6_orin_nano.log").read_text().splitlines()[0]
    state = parse_tegrastats_line(line).device_state()
    assert state is not None
    assert state.memory_total_mb == 7620.0 and state.cpu_load_pct == pytest.approx(1 / 6)
    assert state.gpu_load_pct == 0.0 and state.temperatures_c["tj"] == 49.156
