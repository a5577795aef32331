"""Parse one line of ``tegrastats`` output into a typed :class:`TegrastatsReading`.

The fields (NVIDIA Jetson Linux developer guide, "tegrastats Utility"; jetson-stats
``jtop/core/tegra_parse.py``)::

    [MM-DD-YYYY HH:MM:SS]            JetPack 5+ prefix each line with the time
    RAM 2344/7620MB (lfb 2x4MB)      used / total memory, MB
    CPU [12%@1510,off,...]           load per core (percent of the current frequency), "off" if parked
    GR3D_FREQ 0%  |  0%@76 | 14%@[407,407]   GPU load, percent
    cpu@45.5C  CPU@45.5C  tj@48C     temperatures, degrees C (names are thermal zone types)
    POM_5V_IN 3245/3245              JetPack 4 rails: current/average power, mW
    VDD_IN 5336mW/4970mW             JetPack 5+ rails: the same with units
    VDD_GPU -392mW/-392mW            JetPack 7 (Thor): a rail may read slightly negative near idle
    VIN 124486mW/36487mW/124486mW    JetPack 7 (Thor, r39+): current/average/max; max is not kept

Temperatures of -256 C are thermal zones that are offline or power-gated (Orin: ``CV0@-256C``,
``GPU@-256C``); :meth:`TegrastatsReading.device_state` leaves them out, as the sysfs reader does.

Examples, JetPack 4 (Nano) and JetPack 6 (Orin Nano)::

    RAM 1180/3965MB (lfb 1x2MB) ... CPU [30%@1036,...] ... GR3D_FREQ 0%@76 ... CPU@60.5C ...
    POM_5V_IN 4520/4680 POM_5V_GPU 0/0 POM_5V_CPU 1078/1205
    04-27-2026 15:00:54 RAM 779/7620MB ... GR3D_FREQ 0% cpu@50.125C ... tj@50.562C ...
    VDD_IN 6626mW/6625mW VDD_CPU_GPU_CV 1228mW/1230mW VDD_SOC 2380mW/2380mW
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from edgekit_runtime.sensors.base import DeviceState
from edgekit_runtime.sensors.device_state import OFFLINE_TEMPERATURE_C

#: Input rails that carry the whole module's (or board's) power, in order of preference (jetson-stats
#: ``total_power``): VDD_IN on Orin/Xavier/TX2, POM_5V_IN on the Nano, VIN on Thor (JetPack 7), whose
#: other rails (VDD_GPU, VDD_CPU_SOC_MSS, VIN_SYS_5V0) are fed from it.
TOTAL_RAIL_NAMES = ("VDD_IN", "POM_5V_IN", "VIN")
UNCONNECTED_RAIL = "NC"

_TIMESTAMP_RE = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\b")
_RAM_RE = re.compile(r"\bRAM (\d+)/(\d+)MB\b")
_CPU_RE = re.compile(r"\bCPU \[([^\]]*)\]")
_CPU_LOAD_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)%")
_GPU_RE = re.compile(r"\bGR3D(?:_FREQ)? (\d+(?:\.\d+)?)%")
_TEMPERATURE_RE = re.compile(r"(?<![\w@%])([A-Za-z][\w-]*)@(-?\d+(?:\.\d+)?)C\b")
# A rail is "NAME cur/avg" or "NAME cur/avg/max" (Thor, r39+), values signed, with optional "mW" units;
# the lookahead rejects "RAM 779/7620MB".
_MW = r"(-?\d+(?:\.\d+)?)(?:mW)?"
_RAIL_RE = re.compile(rf"(?<![\w@%/])([A-Za-z0-9_]+) {_MW}/{_MW}(?:/{_MW})?(?=\s|$)")


@dataclass(frozen=True)
class TegrastatsReading:
    """Everything this module reads from one tegrastats line; absent fields are ``None``/empty."""

    rails_mw: dict[str, float] = field(default_factory=dict)
    rails_average_mw: dict[str, float] = field(default_factory=dict)
    ram_used_mb: float | None = None
    ram_total_mb: float | None = None
    cpu_loads_pct: list[float | None] = field(default_factory=list)  # None = core parked ("off")
    gpu_load_pct: float | None = None
    temperatures_c: dict[str, float] = field(default_factory=dict)
    logged_at: datetime | None = None

    @property
    def total_rail(self) -> str | None:
        return next((name for name in TOTAL_RAIL_NAMES if name in self.rails_mw), None)

    @property
    def total_mw(self) -> float | None:
        """The module input rail when present, else the sum of the rails, else ``None``."""
        if not self.rails_mw:
            return None
        total_rail = self.total_rail
        return self.rails_mw[total_rail] if total_rail else sum(self.rails_mw.values())

    @property
    def cpu_load_pct(self) -> float | None:
        """Mean load of the online cores."""
        online = [load for load in self.cpu_loads_pct if load is not None]
        return sum(online) / len(online) if online else None

    def device_state(self) -> DeviceState | None:
        """The line as a :class:`DeviceState`; ``None`` when it has no RAM field."""
        if self.ram_used_mb is None or self.ram_total_mb is None:
            return None
        return DeviceState(
            temperatures_c={
                name: value for name, value in self.temperatures_c.items() if value > OFFLINE_TEMPERATURE_C
            },
            memory_used_mb=self.ram_used_mb,
            memory_total_mb=self.ram_total_mb,
            cpu_load_pct=self.cpu_load_pct,
            gpu_load_pct=self.gpu_load_pct,
        )


def parse_tegrastats_line(line: str) -> TegrastatsReading:
    """Parse one line; fields the line does not have stay empty (no error for partial lines)."""
    rails_mw: dict[str, float] = {}
    rails_average_mw: dict[str, float] = {}
    for name, current, average, _maximum in _RAIL_RE.findall(line):
        if name == UNCONNECTED_RAIL:  # AGX Orin lists unconnected INA3221 channels as "NC 0mW/0mW"
            continue
        rails_mw[name] = float(current)
        rails_average_mw[name] = float(average)

    ram = _RAM_RE.search(line)
    cpu = _CPU_RE.search(line)
    gpu = _GPU_RE.search(line)
    stamp = _TIMESTAMP_RE.search(line)
    return TegrastatsReading(
        rails_mw=rails_mw,
        rails_average_mw=rails_average_mw,
        ram_used_mb=float(ram.group(1)) if ram else None,
        ram_total_mb=float(ram.group(2)) if ram else None,
        cpu_loads_pct=_cpu_loads(cpu.group(1)) if cpu else [],
        gpu_load_pct=float(gpu.group(1)) if gpu else None,
        temperatures_c={name: float(value) for name, value in _TEMPERATURE_RE.findall(line)},
        logged_at=datetime.strptime(stamp.group(1), "%m-%d-%Y %H:%M:%S") if stamp else None,
    )


def _cpu_loads(cores: str) -> list[float | None]:
    loads: list[float | None] = []
    for core in cores.split(","):
        match = _CPU_LOAD_RE.match(core)
        loads.append(float(match.group(1)) if match else None)
    return loads


__all__ = ["TOTAL_RAIL_NAMES", "TegrastatsReading", "parse_tegrastats_line"]
