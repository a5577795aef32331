"""Jetson on-module power rails from the TI INA3221 monitors, read straight from sysfs.

Two kernel drivers expose the same chips, and this sensor reads both layouts:

* JetPack 5/6 (L4T r34+) use the mainline hwmon driver ``ina3221``::

      /sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmon<K>/in<N>_label   rail name ("VDD_IN")
                                                             in<N>_input    bus voltage, mV
                                                             curr<N>_input  current, mA

  Channels are numbered 1..3 (kernel Documentation/hwmon/ina3221.rst). ``in4..6_input`` are the
  shunt voltages and ``in7`` ("sum of shunt voltages") has no ``curr7_input``; neither is a rail.
  Unconnected channels are labelled ``NC`` (jetson-stats ``jtop/core/power.py`` skips them too).
* JetPack 4 (L4T r32) use NVIDIA's staging IIO driver ``ina3221x``::

      /sys/bus/i2c/devices/<bus>-<addr>/iio:device<K>/rail_name_<N>       rail name ("POM_5V_IN")
                                                       in_power<N>_input   power, mW
                                                       in_voltage<N>_input voltage, mV
                                                       in_current<N>_input current, mA

  Channels are numbered 0..2 (energymon ``jetson/ina3221x.c``; L4T 32.x developer guide).

Rails are resolved by label, never by channel number, because boards wire them differently
(Orin Nano/NX: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC on 1-0040; AGX Orin: VDD_GPU_SOC, VDD_CPU_CV,
VIN_SYS_5V0 on 1-0040 and VDDQ_VDD2_1V8AO on 1-0041, per the tegra234 device trees in Linux
``arch/arm64/boot/dts/nvidia/tegra234-p3767.dtsi`` / ``tegra234-p3701.dtsi``). ``total_mw`` is the
module input rail (``VDD_IN``; ``POM_5V_IN`` on the Nano; ``VIN`` on Thor) when the board has one,
because the other rails are fed from it; boards without one (AGX Orin, AGX Xavier) report the sum of
their rails and say so in :attr:`source`.

Only a channel that answers ``ENODATA`` when probed (the mainline driver's disabled channel) is left
out. A channel that fails to read for another reason (EIO from a busy I2C bus at boot, an empty read)
is kept, so a failure that outlasts the probe makes :meth:`read` raise rather than quietly turning
``total_mw`` into the sum of the rails the input rail feeds.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors._files import os_errno, read_number, try_read_text
from edgekit_runtime.sensors.base import Clock, PowerSample, PowerSensor
from edgekit_runtime.sensors.tegrastats_parse import TOTAL_RAIL_NAMES

logger = logging.getLogger(__name__)

HWMON_DRIVER_DIR = "sys/bus/i2c/drivers/ina3221"
IIO_DRIVER_DIR = "sys/bus/i2c/drivers/ina3221x"
I2C_DEVICES_DIR = "sys/bus/i2c/devices"
#: Module input rails, in order of preference (jetson-stats ``total_power``; energymon README): the
#: same rails tegrastats reports as the total.
TOTAL_RAIL_LABELS = TOTAL_RAIL_NAMES
UNCONNECTED_LABELS = frozenset({"", "NC"})

_LAYOUT_NAMES = {"hwmon": "hwmon (JetPack 5/6)", "iio": "iio (JetPack 4)"}
_I2C_CLIENT_RE = re.compile(r"^\d+-[0-9a-fA-F]{4}$")
_HWMON_LABEL_RE = re.compile(r"^in(\d+)_label$")
_IIO_RAIL_RE = re.compile(r"^rail_name_(\d+)$")


@dataclass(frozen=True)
class Ina3221Channel:
    """One connected INA3221 channel and the files that hold its readings."""

    rail: str
    device: str  # I2C client, "<bus>-<addr>" such as "1-0040"
    layout: str  # "hwmon" (JetPack 5/6) or "iio" (JetPack 4)
    number: int
    voltage_path: Path
    current_path: Path
    power_path: Path | None = None  # the iio driver reports power itself

    def read_power_mw(self) -> float:
        if self.power_path is not None:
            return read_number(self.power_path)
        return read_number(self.voltage_path) * read_number(self.current_path) / 1000.0


class Ina3221PowerSensor(PowerSensor):
    """Reads every connected INA3221 rail; ``total_rail`` overrides which rail is the total."""

    name = "ina3221"

    def __init__(
        self, root: Path = Path("/"), *, total_rail: str | None = None, clock: Clock = time.monotonic
    ) -> None:
        super().__init__(root, clock=clock)
        self._total_rail_option = total_rail
        self._channels: list[Ina3221Channel] = []
        self._total_rail: str | None = None
        self._disabled: list[Ina3221Channel] = []  # channels that answered ENODATA at probe

    @property
    def channels(self) -> list[Ina3221Channel]:
        self.available()
        return list(self._channels)

    def _probe_impl(self) -> str | None:
        device_dirs = self._device_dirs()
        if not device_dirs:
            return (
                f"no INA3221 power monitor under {self.path(HWMON_DRIVER_DIR)} (JetPack 5/6) or "
                f"{self.path(I2C_DEVICES_DIR)}/*/iio:device* (JetPack 4); not a Jetson module with "
                "on-module power monitors (the Jetson Nano 2GB has none)"
            )
        found = [ch for d in device_dirs for ch in (*_hwmon_channels(d), *_iio_channels(d))]
        channels, disabled, readable, first_error = [], [], 0, None
        totals = {*TOTAL_RAIL_LABELS, self._total_rail_option}
        has_input_rail = any(ch.rail in totals for ch in found)
        for channel in found:
            try:
                channel.read_power_mw()
            except SensorError as exc:
                first_error = first_error or exc.message
                if os_errno(exc) == errno.ENODATA:  # the mainline driver's answer for a disabled channel
                    logger.debug("INA3221 channel %s on %s disabled: %s", channel.rail, channel.device, exc)
                    disabled.append(channel)
                    continue
                if has_input_rail and channel.rail not in totals:  # the total is the input rail: this one is a detail
                    logger.warning("INA3221 channel %s on %s cannot be read, left out (the total is the input rail): %s",
                                   channel.rail, channel.device, exc)  # fmt: skip
                    continue
                # The total, or a part of the sum that is the total: anything else may pass (a busy I2C bus at boot),
                # so keep the rail; read() raises while it lasts, rather than give a total that is too small.
                logger.warning("INA3221 channel %s on %s failed its first read, kept: %s",
                               channel.rail, channel.device, exc)  # fmt: skip
            else:
                readable += 1
            channels.append(channel)
        if not readable:
            where = ", ".join(str(d) for d in device_dirs)
            if first_error is None:
                return f"INA3221 found at {where} but no channel is connected (labels NC or no input files)"
            return f"INA3221 found at {where} but no channel could be read; first error: {first_error}"
        self._channels, self._disabled = _unique_rail_names(channels), disabled
        rails = [ch.rail for ch in self._channels]
        if self._total_rail_option is not None:
            if self._total_rail_option not in rails:
                off = [ch.rail for ch in disabled if ch.rail == self._total_rail_option]
                why = "is a disabled channel (ENODATA)" if off else "is not a rail of this board"
                return f"total_rail {self._total_rail_option!r} {why}; rails: {rails}"
            self._total_rail = self._total_rail_option
        else:
            self._total_rail = next((r for r in TOTAL_RAIL_LABELS if r in rails), None)
        return None

    def _device_dirs(self) -> list[Path]:
        """I2C client directories of INA3221 chips, each once (drivers/ and devices/ alias them)."""
        candidates: list[Path] = []
        for driver_dir in (self.path(HWMON_DRIVER_DIR), self.path(IIO_DRIVER_DIR)):
            candidates += _i2c_clients(driver_dir)
        for client in _i2c_clients(self.path(I2C_DEVICES_DIR)):
            if (try_read_text(client / "name") or "").startswith("ina3221"):
                candidates.append(client)
        seen: set[str] = set()
        unique: list[Path] = []
        for client in candidates:
            real = os.path.realpath(client)
            if real not in seen:
                seen.add(real)
                unique.append(client)
        return unique

    def _read_impl(self) -> PowerSample:
        timestamp_s = self._clock()
        rails_mw = {ch.rail: ch.read_power_mw() for ch in self._channels}
        total_mw = rails_mw[self._total_rail] if self._total_rail else sum(rails_mw.values())
        return PowerSample(timestamp_s=timestamp_s, rails_mw=rails_mw, total_mw=total_mw)

    def _source_impl(self) -> str:
        layouts = sorted({_LAYOUT_NAMES[ch.layout] for ch in self._channels})
        rails = ", ".join(f"{ch.rail}@{ch.device}" for ch in self._channels)
        disabled_inputs = [f"{ch.rail}@{ch.device}" for ch in self._disabled if ch.rail in TOTAL_RAIL_LABELS]
        if self._total_rail:
            total = f"total_mw = {self._total_rail} rail"
        elif disabled_inputs:  # the board has an input rail: the sum of the others is not the whole module
            total = (f"total_mw = sum of rails, without the input rail: {', '.join(disabled_inputs)} "
                     "is a disabled channel (ENODATA)")  # fmt: skip
        else:
            total = f"total_mw = sum of rails (no {'/'.join(TOTAL_RAIL_LABELS)} rail on this board)"
        return f"ina3221 {' + '.join(layouts)}: {rails}; {total}"


def _i2c_clients(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    return [e for e in entries if _I2C_CLIENT_RE.match(e.name) and e.is_dir()]


def _hwmon_channels(client: Path) -> list[Ina3221Channel]:
    channels = []
    for hwmon_dir in sorted((client / "hwmon").glob("hwmon*")):
        for label_file in hwmon_dir.glob("in*_label"):
            match = _HWMON_LABEL_RE.match(label_file.name)
            label = try_read_text(label_file)
            if not match or label is None or label in UNCONNECTED_LABELS:
                continue
            number = int(match.group(1))
            voltage, current = hwmon_dir / f"in{number}_input", hwmon_dir / f"curr{number}_input"
            if voltage.is_file() and current.is_file():  # in7 "sum of shunt voltages" has no curr7
                channels.append(Ina3221Channel(label, client.name, "hwmon", number, voltage, current))
    return sorted(channels, key=lambda ch: (str(ch.voltage_path.parent), ch.number))


def _iio_channels(client: Path) -> list[Ina3221Channel]:
    channels = []
    for iio_dir in sorted(client.glob("iio:device*")):
        for rail_file in iio_dir.glob("rail_name_*"):
            match = _IIO_RAIL_RE.match(rail_file.name)
            label = try_read_text(rail_file)
            if not match or label is None or label in UNCONNECTED_LABELS:
                continue
            number = int(match.group(1))
            power = iio_dir / f"in_power{number}_input"
            voltage, current = iio_dir / f"in_voltage{number}_input", iio_dir / f"in_current{number}_input"
            if power.is_file() or (voltage.is_file() and current.is_file()):
                power_path = power if power.is_file() else None
                channels.append(
                    Ina3221Channel(label, client.name, "iio", number, voltage, current, power_path)
                )
    return sorted(channels, key=lambda ch: (str(ch.voltage_path.parent), ch.number))


def _unique_rail_names(channels: list[Ina3221Channel]) -> list[Ina3221Channel]:
    """Keep labels as rail names; a label seen twice gets ``@<bus>-<addr>`` on its later copies."""
    seen: set[str] = set()
    result = []
    for channel in channels:
        rail = channel.rail if channel.rail not in seen else f"{channel.rail}@{channel.device}"
        seen.add(rail)
        result.append(replace(channel, rail=rail))
    return result


__all__ = ["TOTAL_RAIL_LABELS", "Ina3221Channel", "Ina3221PowerSensor"]
