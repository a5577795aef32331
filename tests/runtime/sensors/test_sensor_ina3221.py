"""INA3221 sysfs sensor against JetPack 4/5/6 fixture trees."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors import Ina3221PowerSensor, PowerIntegrator

HWMON_ORIN_NANO = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"


def test_orin_nano_jetpack6_rails_by_label_and_vdd_in_total(fixtures_dir: Path, clock) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_orin_nano_jp6", clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    sample = sensor.read()
    assert sample.rails_mw == pytest.approx(
        {"VDD_IN": 5064 * 1308 / 1000, "VDD_CPU_GPU_CV": 5064 * 242 / 1000, "VDD_SOC": 5064 * 470 / 1000}
    )
    # in7 ("sum of shunt voltages") and curr4 (sum of currents) are not rails.
    assert "sum of shunt voltages" not in sample.rails_mw
    assert sample.total_mw == pytest.approx(5064 * 1308 / 1000)
    assert sample.energy_mj is None
    assert sample.timestamp_s == clock.now
    assert [(ch.device, ch.layout, ch.number) for ch in sensor.channels] == [
        ("1-0040", "hwmon", 1),
        ("1-0040", "hwmon", 2),
        ("1-0040", "hwmon", 3),
    ]
    assert sensor.source == (
        "ina3221 hwmon (JetPack 5/6): VDD_IN@1-0040, VDD_CPU_GPU_CV@1-0040, VDD_SOC@1-0040; "
        "total_mw = VDD_IN rail"
    )


def test_agx_orin_skips_nc_channels_and_sums_rails_without_vdd_in(fixtures_dir: Path) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_agx_orin_jp5")
    sample = sensor.read()
    expected = {
        "VDD_GPU_SOC": 19008 * 166 / 1000,
        "VDD_CPU_CV": 19008 * 753 / 1000,
        "VIN_SYS_5V0": 4984 * 997 / 1000,
        "VDDQ_VDD2_1V8AO": 4992 * 218 / 1000,
    }
    assert sample.rails_mw == pytest.approx(expected)
    assert "NC" not in sample.rails_mw
    assert sample.total_mw == pytest.approx(sum(expected.values()))
    assert "total_mw = sum of rails (no VDD_IN/POM_5V_IN/VIN rail on this board)" in sensor.source


def test_labels_in_unusual_channel_order_resolve_by_label(fixtures_dir: Path) -> None:
    # VDD_IN sits on channel 3 of 1-0040; a carrier chip at 1-0041 also labels a channel VDD_IN.
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_orin_nx_custom_carrier")
    sample = sensor.read()
    assert sample.total_mw == pytest.approx(5000 * 2000 / 1000)  # channel 3, not channel 1
    assert sample.rails_mw["VDD_SOC"] == pytest.approx(5000 * 300 / 1000)
    assert sample.rails_mw["VDD_IN@1-0041"] == pytest.approx(12000 * 900 / 1000)
    assert sample.rails_mw["VDD_3V3_SYS"] == pytest.approx(3300 * 400 / 1000)
    assert set(sample.rails_mw) == {"VDD_SOC", "VDD_CPU_GPU_CV", "VDD_IN", "VDD_3V3_SYS", "VDD_IN@1-0041"}


def test_total_rail_option_overrides_the_total(fixtures_dir: Path) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_orin_nx_custom_carrier", total_rail="VDD_IN@1-0041")
    assert sensor.read().total_mw == pytest.approx(12000 * 900 / 1000)
    assert sensor.source.endswith("total_mw = VDD_IN@1-0041 rail")


def test_unknown_total_rail_makes_the_sensor_unavailable_and_names_the_rails(fixtures_dir: Path) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_orin_nano_jp6", total_rail="VDD_5V_IN")
    assert not sensor.available()
    assert sensor.unavailable_reason == (
        "total_rail 'VDD_5V_IN' is not a rail of this board; rails: ['VDD_IN', 'VDD_CPU_GPU_CV', 'VDD_SOC']"
    )
    with pytest.raises(
        SensorError, match="power sensor 'ina3221' under root .* is not available: total_rail"
    ) as info:
        sensor.read()
    assert "create_sensor('auto')" in str(info.value)


def test_nano_jetpack4_iio_layout_uses_the_power_files(fixtures_dir: Path) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "jetson_nano_jp4")
    sample = sensor.read()
    # in_power0_input says 4520 mW while 5024 mV x 900 mA = 4521.6 mW: the driver's power wins.
    assert sample.rails_mw == {"POM_5V_IN": 4520.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 1078.0}
    assert sample.total_mw == 4520.0
    # drivers/ina3221x/6-0040 is a symlink to devices/6-0040: the chip is counted once.
    assert len(sensor.channels) == 3
    assert [ch.number for ch in sensor.channels] == [0, 1, 2]
    assert sensor.source.startswith("ina3221 iio (JetPack 4): POM_5V_IN@6-0040")
    assert sensor.source.endswith("total_mw = POM_5V_IN rail")


def test_iio_channel_without_power_file_multiplies_voltage_and_current(fixture_root) -> None:
    root = fixture_root("jetson_nano_jp4")
    (root / "sys/bus/i2c/devices/6-0040/iio:device0/in_power2_input").unlink()
    sample = Ina3221PowerSensor(root).read()
    assert sample.rails_mw["POM_5V_CPU"] == pytest.approx(5016 * 215 / 1000)


def test_reads_follow_the_files_and_integrate_to_energy(fixture_root, clock) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    sensor = Ina3221PowerSensor(root, clock=clock)
    integrator = PowerIntegrator.for_sensor(sensor)
    current_file = root / HWMON_ORIN_NANO / "curr1_input"
    for current_ma in (1000, 1000, 2000):
        current_file.write_text(f"{current_ma}\n")
        integrator.add(sensor.read())
        clock.advance(0.5)
    stats = integrator.take_window()
    p1, p2 = 5064 * 1000 / 1000, 5064 * 2000 / 1000
    assert stats.energy_mj == pytest.approx(0.5 * p1 + 0.5 * (p1 + p2) / 2)
    assert stats.max_mw == pytest.approx(p2)
    assert stats.source.endswith("total_mw = VDD_IN rail")


def test_channel_missing_its_current_file_is_not_a_rail(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    (root / HWMON_ORIN_NANO / "curr2_input").unlink()
    assert set(Ina3221PowerSensor(root).read().rails_mw) == {"VDD_IN", "VDD_SOC"}


def test_channel_whose_input_is_not_a_file_is_not_a_rail(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    voltage = root / HWMON_ORIN_NANO / "in3_input"
    voltage.unlink()
    voltage.mkdir()
    assert set(Ina3221PowerSensor(root).read().rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV"}


def _answer_enodata(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Make ``paths`` fail as the mainline driver's disabled channels do: read() gives ENODATA."""
    real_read_text = Path.read_text

    def read_text(self: Path, *args, **kwargs) -> str:
        if self in paths:
            raise OSError(errno.ENODATA, os.strerror(errno.ENODATA), str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


def test_disabled_channel_is_dropped_at_probe(fixture_root, monkeypatch) -> None:
    # A disabled channel of the mainline driver exists but fails to read (ENODATA).
    root = fixture_root("jetson_orin_nano_jp6")
    _answer_enodata(monkeypatch, root / HWMON_ORIN_NANO / "in3_input")
    sensor = Ina3221PowerSensor(root)
    assert set(sensor.read().rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV"}
    assert sensor.source.endswith("total_mw = VDD_IN rail")


def test_input_rail_failing_its_probe_read_is_kept_not_replaced_by_the_sum(fixture_root, clock) -> None:
    # before: VDD_IN's one failed read at probe dropped it for good; total_mw became the sub-rail sum
    # (46 % low) labelled "no VDD_IN/POM_5V_IN rail on this board"
    root = fixture_root("jetson_orin_nano_jp6")
    current = root / HWMON_ORIN_NANO / "curr1_input"
    good = current.read_text()
    current.write_text("\n")  # an empty read, as from a busy I2C bus at boot
    sensor = Ina3221PowerSensor(root, clock=clock)
    assert sensor.available(), sensor.unavailable_reason
    with pytest.raises(SensorError, match=r"curr1_input should hold a number, found ''"):
        sensor.read()  # still failing: no total rather than a wrong one
    current.write_text(good)
    sample = sensor.read()
    assert set(sample.rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert sample.total_mw == pytest.approx(5064 * 1308 / 1000)
    assert sensor.source == (
        "ina3221 hwmon (JetPack 5/6): VDD_IN@1-0040, VDD_CPU_GPU_CV@1-0040, VDD_SOC@1-0040; "
        "total_mw = VDD_IN rail"
    )


def test_a_sub_rail_that_cannot_be_read_is_left_out_where_the_input_rail_is_the_total(fixture_root, clock) -> None:
    """The total is VDD_IN: a sub-rail that cannot be read does not change it, so it is left out (kept, as the first
    fix had it, every read of the sensor failed for a rail the total does not need)."""
    root = fixture_root("jetson_orin_nano_jp6")
    (root / HWMON_ORIN_NANO / "curr3_input").write_text("denied\n")  # VDD_SOC, unreadable for good
    sensor = Ina3221PowerSensor(root, clock=clock)
    sample = sensor.read()
    assert set(sample.rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV"}
    assert sample.total_mw == pytest.approx(5064 * 1308 / 1000) and sensor.source.endswith("total_mw = VDD_IN rail")


def test_disabled_input_rail_is_named_not_called_absent(fixture_root, monkeypatch) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    _answer_enodata(monkeypatch, root / HWMON_ORIN_NANO / "curr1_input")
    sensor = Ina3221PowerSensor(root)
    sample = sensor.read()
    assert set(sample.rails_mw) == {"VDD_CPU_GPU_CV", "VDD_SOC"}
    assert sample.total_mw == pytest.approx(5064 * (242 + 470) / 1000)
    assert sensor.source.endswith(
        "total_mw = sum of rails, without the input rail: VDD_IN@1-0040 is a disabled channel (ENODATA)"
    )
    assert "no VDD_IN" not in sensor.source
    pinned = Ina3221PowerSensor(root, total_rail="VDD_IN")
    assert pinned.unavailable_reason == (
        "total_rail 'VDD_IN' is a disabled channel (ENODATA); rails: ['VDD_CPU_GPU_CV', 'VDD_SOC']"
    )


def test_thor_vin_label_is_the_total(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    (root / HWMON_ORIN_NANO / "in1_label").write_text("VIN\n")  # Thor's whole-board input rail
    sensor = Ina3221PowerSensor(root)
    assert sensor.read().total_mw == pytest.approx(5064 * 1308 / 1000)
    assert sensor.source.endswith("total_mw = VIN rail")


def test_no_readable_channel_says_where_and_why(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    for n in (1, 2, 3):
        (root / HWMON_ORIN_NANO / f"in{n}_input").write_text("n/a\n")
    sensor = Ina3221PowerSensor(root)
    assert not sensor.available()
    reason = sensor.unavailable_reason or ""
    assert reason.startswith(f"INA3221 found at {root / 'sys/bus/i2c/drivers/ina3221/1-0040'}")
    assert "but no channel could be read; first error: " in reason
    assert "in1_input should hold a number, found 'n/a'" in reason


def test_chip_with_only_unconnected_channels(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    for n in (1, 2, 3):
        (root / HWMON_ORIN_NANO / f"in{n}_label").write_text("NC\n")
    reason = Ina3221PowerSensor(root).unavailable_reason or ""
    assert reason.endswith("but no channel is connected (labels NC or no input files)")


def test_file_vanishing_after_probe_raises_with_the_path(fixture_root) -> None:
    root = fixture_root("jetson_orin_nano_jp6")
    sensor = Ina3221PowerSensor(root)
    assert sensor.available()
    shutil.rmtree(root / HWMON_ORIN_NANO)
    with pytest.raises(
        SensorError, match=r"cannot read .*hwmon1/in1_input: No such file or directory \(ENOENT\)"
    ):
        sensor.read()


def test_not_a_jetson(fixtures_dir: Path) -> None:
    sensor = Ina3221PowerSensor(fixtures_dir / "x86_intel_rapl")
    assert not sensor.available()
    reason = sensor.unavailable_reason or ""
    assert reason.startswith("no INA3221 power monitor under ")
    assert "(JetPack 5/6)" in reason and "(JetPack 4)" in reason and "Jetson Nano 2GB has none" in reason
    assert sensor.source.startswith("ina3221 (unavailable: no INA3221")


def test_closed_sensor_refuses_reads(fixtures_dir: Path) -> None:
    with Ina3221PowerSensor(fixtures_dir / "jetson_orin_nano_jp6") as sensor:
        sensor.read()
    with pytest.raises(SensorError, match="power sensor 'ina3221' is closed"):
        sensor.read()
