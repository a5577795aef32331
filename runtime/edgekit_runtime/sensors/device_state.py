"""Temperatures, memory, CPU and GPU load from procfs/sysfs under an injectable root.

* temperatures: ``/sys/class/thermal/thermal_zone<N>/{type,temp}``, ``temp`` in millidegrees C
  (kernel ``Documentation/driver-api/thermal/sysfs-api.rst``). Unreadable zones and Jetson's
  "offline" value of -256 C (jetson-stats ``jtop/core/temperature.py``) are left out.
* memory: ``/proc/meminfo``, used = ``MemTotal - MemAvailable`` (kB, reported in MiB as ``_mb``).
* CPU load: the aggregate ``cpu`` line of ``/proc/stat`` (``proc(5)``), from two reads: the
  previous call's and this one's; the first call reads twice, ``first_read_interval_s`` apart.
* GPU load: Jetson's GPU ``load`` file, per mille (jetson-stats ``jtop/core/gpu.py`` divides by 10),
  at the first of :data:`GPU_LOAD_PATHS` that exists; else the ``gpu_load_pct`` callable if given
  (for example :meth:`NvmlPowerSensor.gpu_load_pct`); else ``None``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors._files import read_number, read_text, try_read_text
from edgekit_runtime.sensors.base import DeviceState

logger = logging.getLogger(__name__)

THERMAL_DIR = "sys/class/thermal"
MEMINFO_PATH = "proc/meminfo"
PROC_STAT_PATH = "proc/stat"
GPU_LOAD_PATHS = (
    "sys/devices/gpu.0/load",  # Nano, TX1/TX2, Xavier (JetPack 4)
    "sys/devices/platform/gpu.0/load",  # Orin: link to the GPU device
    "sys/devices/17000000.ga10b/load",  # Orin, JetPack 5
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/platform/bus@0/17000000.gpu/load",  # Orin, JetPack 6
    "sys/devices/platform/17000000.gpu/load",
    "sys/devices/17000000.gv11b/load",  # Xavier, JetPack 5
)
OFFLINE_TEMPERATURE_C = -256.0

_ZONE_RE = re.compile(r"^thermal_zone(\d+)$")
# user nice system idle iowait irq softirq steal; guest time is already counted in user/nice.
_STAT_FIELDS = 8
_IDLE_FIELDS = (3, 4)


class DeviceStateReader:
    """Reads a :class:`DeviceState`; keep one reader so CPU load covers the time between reads."""

    def __init__(
        self,
        root: Path = Path("/"),
        *,
        gpu_load_pct: Callable[[], float | None] | None = None,
        first_read_interval_s: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._root = Path(root)
        self._gpu_load_fallback = gpu_load_pct
        self._first_read_interval_s = first_read_interval_s
        self._sleep = sleep
        self._previous_cpu: tuple[int, int] | None = None

    def path(self, relative: str) -> Path:
        return self._root / relative

    def read(self) -> DeviceState:
        used_mb, total_mb = self.read_memory_mb()
        return DeviceState(
            temperatures_c=self.read_temperatures_c(),
            memory_used_mb=used_mb,
            memory_total_mb=total_mb,
            cpu_load_pct=self.read_cpu_load_pct(),
            gpu_load_pct=self.read_gpu_load_pct(),
        )

    def read_temperatures_c(self) -> dict[str, float]:
        zones = []
        try:
            entries = list(self.path(THERMAL_DIR).iterdir())
        except OSError:
            return {}
        for entry in entries:
            match = _ZONE_RE.match(entry.name)
            if match:
                zones.append((int(match.group(1)), entry))
        temperatures: dict[str, float] = {}
        for number, zone in sorted(zones):
            zone_type = try_read_text(zone / "type")
            try:
                value_c = read_number(zone / "temp") / 1000.0
            except SensorError as exc:  # some zones refuse reads (EINVAL/ENODATA) while idle
                logger.debug("thermal zone %s skipped: %s", zone, exc)
                continue
            if not zone_type or value_c <= OFFLINE_TEMPERATURE_C:
                continue
            key = zone_type if zone_type not in temperatures else f"{zone_type}@thermal_zone{number}"
            temperatures[key] = value_c
        return temperatures

    def read_memory_mb(self) -> tuple[float, float]:
        """``(used, total)`` in MiB."""
        path = self.path(MEMINFO_PATH)
        fields_kb: dict[str, float] = {}
        for line in read_text(path).splitlines():
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                fields_kb[name.strip()] = float(value[0])
        if "MemTotal" not in fields_kb:
            raise SensorError(f"{path} has no MemTotal line", hint="point root at a Linux /proc")
        total_kb = fields_kb["MemTotal"]
        if "MemAvailable" in fields_kb:
            available_kb = fields_kb["MemAvailable"]
        else:  # kernels before 3.14
            available_kb = sum(fields_kb.get(k, 0.0) for k in ("MemFree", "Buffers", "Cached"))
        return (total_kb - available_kb) / 1024.0, total_kb / 1024.0

    def read_cpu_load_pct(self) -> float | None:
        """Busy share of all CPUs since the previous call, percent; ``None`` if no time passed."""
        if self._previous_cpu is None:
            self._previous_cpu = self._cpu_times()
            self._sleep(self._first_read_interval_s)
        previous, current = self._previous_cpu, self._cpu_times()
        self._previous_cpu = current
        total_delta = current[0] - previous[0]
        idle_delta = current[1] - previous[1]
        if total_delta <= 0:
            return None
        return 100.0 * (total_delta - idle_delta) / total_delta

    def _cpu_times(self) -> tuple[int, int]:
        """``(total, idle)`` jiffies from the aggregate ``cpu`` line."""
        path = self.path(PROC_STAT_PATH)
        for line in read_text(path).splitlines():
            parts = line.split()
            if parts and parts[0] == "cpu":
                try:
                    values = [int(v) for v in parts[1 : 1 + _STAT_FIELDS]]
                except ValueError as exc:
                    raise SensorError(f"{path}: cannot parse the cpu line {line!r}") from exc
                if len(values) < 4:
                    break
                return sum(values), sum(values[i] for i in _IDLE_FIELDS if i < len(values))
        raise SensorError(f"{path} has no aggregate 'cpu' line", hint="point root at a Linux /proc")

    def read_gpu_load_pct(self) -> float | None:
        for relative in GPU_LOAD_PATHS:
            path = self.path(relative)
            if path.is_file():
                try:
                    return read_number(path) / 10.0  # per mille -> percent
                except SensorError as exc:
                    logger.debug("GPU load unreadable: %s", exc)
                    return None
        return self._gpu_load_fallback() if self._gpu_load_fallback is not None else None


__all__ = ["GPU_LOAD_PATHS", "DeviceStateReader"]
