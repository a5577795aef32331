"""Readings a sensor cannot have meant (a signed shunt current read negative, /proc/stat counters that went back,
MemAvailable above MemTotal, a thermal zone's 2147483647) are left out of the window with a ``sensor.implausible``
problem; before, telemetry.v1's minimum 0 failed the whole window, every window while the reading lasted."""

from __future__ import annotations

import datetime as dt

from edgekit_runtime.agent.telemetry import build_telemetry
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.sensors.base import DeviceState, PowerStats
from edgekit_runtime.sensors.power_mode import power_mode_label

START = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)


def test_implausible_readings_are_left_out_and_said_the_window_still_goes() -> None:
    power = PowerStats(-60.8, 10.0, -600.0, 10.0, 100, "ina3221 VDD_IN")
    state = DeviceState(temperatures_c={"cpu": 50.0, "broken": 2147483.647, "absent": -273.15}, memory_used_mb=-97.7,
                        memory_total_mb=7620.0, cpu_load_pct=-100.0, gpu_load_pct=100.4)  # fmt: skip
    message = build_telemetry(seq=1, device="dev-1", fleet="lab", window_start=START, window_end=START + dt.timedelta(seconds=10),
                              latency=None, power=power, device_state=state)  # fmt: skip
    validate_message(message, "telemetry.v1")  # before: refused, and the window with it
    assert message["power"]["mean_mw"] is None and message["power"]["energy_mj"] is None and message["power"]["max_mw"] == 10.0
    assert message["temperatures_c"] == {"cpu": 50.0}
    assert message["memory"]["used_mb"] is None and message["cpu_load_pct"] is None
    assert message["gpu_load_pct"] == 100.0  # a rounding just past 100 %: kept as 100
    said = [e["message"] for e in message["errors"] if e["code"] == "sensor.implausible"]
    assert any("power.mean_mw read -60.8" in m for m in said) and any("temperatures_c.broken" in m for m in said)
    assert any("cpu_load_pct read -100" in m for m in said) and any("memory.used_mb" in m for m in said)


def test_a_long_power_mode_name_fits_the_window() -> None:
    label = power_mode_label("M" * 200, True)
    assert label is not None and len(label) == 128 and label.endswith("+clocks")  # before: every window refused
