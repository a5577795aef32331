"""RAPL powercap sensor: power from counter differences, wraparound, permissions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import PowerIntegrator, RaplPowerSensor
from edgekit_runtime.sensors.base import METHOD_COUNTER
from edgekit_runtime.sensors.rapl import MAX_ZONE_POWER_MW, unreadable_energy_reason

PACKAGE = "sys/class/powercap/intel-rapl:0/energy_uj"
CORE = "sys/class/powercap/intel-rapl:0:0/energy_uj"
MAX_RANGE_UJ = 262143328850


def _set_uj(root: Path, relative: str, value: int) -> None:
    (root / relative).write_text(f"{value}\n")


def test_first_read_has_counter_but_no_power_then_power_from_difference(fixture_root, clock) -> None:
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    first = sensor.read()
    assert first.total_mw is None and first.rails_mw == {}
    assert first.energy_mj == pytest.approx(23514201843 / 1000)

    _set_uj(root, PACKAGE, 23514201843 + 5_000_000)  # +5 J in 1 s on the package
    _set_uj(root, "sys/class/powercap/intel-rapl:0:0/energy_uj", 11833990129 + 3_000_000)
    _set_uj(root, "sys/class/powercap/intel-rapl:1/energy_uj", 44120338811 + 9_000_000)
    clock.advance(1.0)
    second = sensor.read()
    assert second.total_mw == pytest.approx(5000.0)
    assert second.rails_mw == pytest.approx(
        {"package-0": 5000.0, "package-0/core": 3000.0, "package-0/uncore": 0.0, "psys": 9000.0}
    )
    assert second.energy_mj == pytest.approx(first.energy_mj + 5000.0)
    # intel-rapl-mmio:0 duplicates package-0 and is not read; psys is a rail but not in the total.
    assert sensor.source == "rapl powercap: total_mw = package-0 (CPU packages only, not the whole machine)"


def test_wraparound_uses_max_energy_range(fixture_root, clock) -> None:
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    integrator = PowerIntegrator.for_sensor(sensor)
    _set_uj(root, PACKAGE, MAX_RANGE_UJ - 1_000_000)
    integrator.add(sensor.read())
    _set_uj(root, PACKAGE, 2_000_000)  # passed the top: 1 J before the wrap + 2 J after
    clock.advance(1.0)
    sample = sensor.read()
    integrator.add(sample)
    assert sample.total_mw == pytest.approx(3000.0)
    stats = integrator.stats()
    assert stats.energy_mj == pytest.approx(3000.0)
    assert stats.energy_method == METHOD_COUNTER
    _set_uj(root, PACKAGE, 4_000_000)
    clock.advance(1.0)
    assert sensor.read().energy_mj == pytest.approx(sample.energy_mj + 2000.0)  # keeps growing


def test_amd_zen_wraps_at_its_own_range(fixture_root, clock) -> None:
    root = fixture_root("x86_amd_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    _set_uj(root, PACKAGE, 65532610987 - 500_000)
    sensor.read()
    _set_uj(root, PACKAGE, 1_500_000)
    clock.advance(0.5)
    assert sensor.read().total_mw == pytest.approx(2_000_000 / 1000 / 0.5)


def test_two_sockets_sum_packages_and_name_subzones_by_package(fixture_root, clock) -> None:
    root = fixture_root("x86_intel_rapl_2socket")
    sensor = RaplPowerSensor(root, clock=clock)
    sensor.read()
    for relative, value in [
        ("intel-rapl:0", 100_000_000 + 60_000_000),
        ("intel-rapl:0:0", 20_000_000 + 10_000_000),
        ("intel-rapl:1", 200_000_000 + 40_000_000),
        ("intel-rapl:1:0", 30_000_000 + 8_000_000),
    ]:
        _set_uj(root, f"sys/class/powercap/{relative}/energy_uj", value)
    clock.advance(2.0)
    sample = sensor.read()
    assert sample.rails_mw == pytest.approx(
        {"package-0": 30_000.0, "package-1": 20_000.0, "package-0/dram": 5_000.0, "package-1/dram": 4_000.0}
    )
    assert sample.total_mw == pytest.approx(50_000.0)
    assert "package-0 + package-1" in sensor.source


def test_no_rapl_zones(fixtures_dir: Path) -> None:
    sensor = RaplPowerSensor(fixtures_dir / "bare_linux")
    assert not sensor.available()
    reason = sensor.unavailable_reason or ""
    assert reason.startswith(
        f"no RAPL zones (intel-rapl:N) under {fixtures_dir / 'bare_linux/sys/class/powercap'}"
    )
    assert "intel_rapl_msr" in reason


def test_zones_without_a_package(fixture_root) -> None:
    root = fixture_root("x86_intel_rapl")
    (root / "sys/class/powercap/intel-rapl:0/name").write_text("psys-like\n")
    reason = RaplPowerSensor(root).unavailable_reason or ""
    assert reason.startswith("RAPL zones under ") and "include no package zone" in reason


def test_clock_that_did_not_move_gives_no_power(fixture_root, clock) -> None:
    sensor = RaplPowerSensor(fixture_root("x86_intel_rapl"), clock=clock)
    sensor.read()
    assert sensor.read().total_mw is None


def test_unreadable_energy_reason_names_the_kernel_change() -> None:
    path = Path("/sys/class/powercap/intel-rapl:0/energy_uj")
    reason = unreadable_energy_reason(path, SensorError(f"cannot read {path}: permission denied"))
    assert reason.startswith(f"cannot read {path}: permission denied; since the PLATYPUS fix (CVE-2020-8694)")
    assert "run the agent as root" in reason
    other = unreadable_energy_reason(path, SensorError(f"{path} should hold a number, found 'x'"))
    assert other == f"{path} should hold a number, found 'x'"


def test_garbage_counter_is_unavailable_with_the_file(fixture_root) -> None:
    root = fixture_root("x86_intel_rapl")
    _set_uj(root, PACKAGE, 0)
    (root / PACKAGE).write_text("garbage\n")
    assert (
        RaplPowerSensor(root).unavailable_reason == f"{root / PACKAGE} should hold a number, found 'garbage'"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_energy_readable_by_root_only_as_on_recent_kernels(fixture_root) -> None:
    root = fixture_root("x86_intel_rapl")
    (root / PACKAGE).chmod(0o000)  # what mode 0400 root:root means to the agent's user
    sensor = RaplPowerSensor(root)
    assert not sensor.available()
    assert sensor.unavailable_reason.startswith(
        f"cannot read {root / PACKAGE}: permission denied; since the PLATYPUS fix (CVE-2020-8694)"
    )


def test_a_counter_reset_is_not_read_as_a_wrap_and_a_read_past_the_range_is_refused(fixture_root, clock) -> None:
    # before: a reset (a driver reload) was taken for a wrap, 238 kW for a 1 W load; an all-ones read 1.8e16 mW
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    sensor.read()
    _set_uj(root, PACKAGE, 1_000_000)  # the counter starts again near 0
    clock.advance(1.0)
    assert sensor.read().total_mw == pytest.approx(0.0)
    _set_uj(root, PACKAGE, 2_000_000)
    clock.advance(1.0)
    assert sensor.read().total_mw == pytest.approx(1000.0)  # then 1 W, as it is
    _set_uj(root, PACKAGE, 2**64 - 1)
    clock.advance(1.0)
    with pytest.raises(SensorError, match="past its max_energy_range_uj"):
        sensor.read()
    _set_uj(root, PACKAGE, MAX_RANGE_UJ - 1_000)  # a real wrap still counts
    clock.advance(1.0)
    sensor.read()
    _set_uj(root, PACKAGE, 4_000)
    clock.advance(1.0)
    assert sensor.read().total_mw == pytest.approx(5.0)


@pytest.mark.parametrize("text", ["nan", "inf", "1e999", "9" * 400])
def test_a_reading_that_is_no_finite_number_is_refused(fixture_root, clock, text: str) -> None:
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    sensor.read()
    (root / PACKAGE).write_text(text + "\n")
    clock.advance(1.0)
    with pytest.raises(SensorError, match="should hold a"):  # before: nan poisoned every later window's energy
        sensor.read()


def test_an_unreadable_subzone_is_left_out_and_the_packages_still_measured(fixture_root, clock) -> None:
    """A subzone the kernel will not give (a dram counter at 0 range on some AMD parts, a subzone with another
    mode) used to make the whole sensor unavailable; now it is left out, named in the source."""
    root = fixture_root("x86_intel_rapl_2socket")
    (root / "sys/class/powercap/intel-rapl:1:0/energy_uj").write_text("garbage\n")
    (root / "sys/class/powercap/intel-rapl:0:0/max_energy_range_uj").write_text("0\n")
    sensor = RaplPowerSensor(root, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    sensor.read()
    for relative, value in [("intel-rapl:0", 100_000_000 + 60_000_000), ("intel-rapl:1", 200_000_000 + 40_000_000)]:
        _set_uj(root, f"sys/class/powercap/{relative}/energy_uj", value)
    clock.advance(2.0)
    sample = sensor.read()
    assert sample.rails_mw == pytest.approx({"package-0": 30_000.0, "package-1": 20_000.0})
    assert sample.total_mw == pytest.approx(50_000.0)
    assert "left out, unreadable: intel-rapl:0:0 (" in sensor.source and "the counter's wrap cannot be followed" in sensor.source
    assert "intel-rapl:1:0 (" in sensor.source and "should hold a number, found 'garbage'" in sensor.source


def test_a_reset_from_above_half_the_range_is_not_a_phantom_wrap(fixture_root, clock, caplog) -> None:
    # before: a reset while the counter stood past half its range was read as a wrap: 1.05e8 mW, 1.05e8 mJ
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    integrator = PowerIntegrator.for_sensor(sensor)
    start = int(MAX_RANGE_UJ * 0.6)
    _set_uj(root, PACKAGE, start)
    integrator.add(sensor.read())
    _set_uj(root, PACKAGE, start + 20_000_000)  # 20 J in 1 s
    clock.advance(1.0)
    integrator.add(sensor.read())
    _set_uj(root, PACKAGE, 5_000_000)  # the counter started again from 0
    clock.advance(1.0)
    with caplog.at_level("WARNING", logger="edgekit_runtime.sensors.rapl"):
        after_reset = sensor.read()
    integrator.add(after_reset)
    assert after_reset.total_mw == pytest.approx(0.0)
    stats = integrator.take_window()
    assert stats.energy_mj == pytest.approx(20_000.0) and stats.energy_method == METHOD_COUNTER
    assert f"{root / PACKAGE} went back from {start + 20_000_000} to 5000000 uJ in 1 s: a counter reset" in caplog.text
    assert "no energy counted" in caplog.text
    _set_uj(root, PACKAGE, 7_000_000)
    clock.advance(1.0)
    assert sensor.read().total_mw == pytest.approx(2000.0)  # counting goes on from the new value


def test_a_wrap_counts_when_its_power_is_possible(fixture_root, clock) -> None:
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    start = int(MAX_RANGE_UJ * 0.6)
    _set_uj(root, PACKAGE, start)
    sensor.read()
    _set_uj(root, PACKAGE, 5_000_000)
    clock.advance(600.0)  # ten minutes unread: 0.4 of the range is 175 W, a wrap
    wrap_uj = MAX_RANGE_UJ - start + 5_000_000
    sample = sensor.read()
    assert sample.total_mw == pytest.approx(wrap_uj / 1000 / 600.0)
    assert sample.total_mw < MAX_ZONE_POWER_MW


def test_a_misread_zone_leaves_every_zone_as_it_was(fixture_root, clock) -> None:
    # before: package-0 advanced before the core subzone's misread raised, so the next read divided the
    # package's energy since the failed read by the time since the last good one (10000 mW, not 20000)
    root = fixture_root("x86_intel_rapl")
    sensor = RaplPowerSensor(root, clock=clock)
    core_max = int((root / "sys/class/powercap/intel-rapl:0:0/max_energy_range_uj").read_text())
    package_0, core_0 = int((root / PACKAGE).read_text()), int((root / CORE).read_text())
    first = sensor.read()
    _set_uj(root, PACKAGE, package_0 + 20_000_000)
    _set_uj(root, CORE, core_max + 5)  # past its range: a misread
    clock.advance(1.0)
    with pytest.raises(SensorError, match=r"intel-rapl:0:0/energy_uj read .* past its max_energy_range_uj"):
        sensor.read()
    _set_uj(root, PACKAGE, package_0 + 40_000_000)
    _set_uj(root, CORE, core_0 + 20_000_000)
    clock.advance(1.0)
    sample = sensor.read()
    assert sample.total_mw == pytest.approx(20_000.0)  # 40 J over the 2 s since the last good read
    assert sample.rails_mw["package-0/core"] == pytest.approx(10_000.0)
    assert sample.energy_mj == pytest.approx(first.energy_mj + 40_000.0)
