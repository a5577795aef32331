"""CPU package power from the Linux powercap RAPL energy counters (Intel, and AMD Zen).

Layout (kernel ``Documentation/power/powercap/powercap.rst``)::

    /sys/class/powercap/intel-rapl:<N>/name                  "package-<N>", "psys", ...
                                       energy_uj             cumulative energy, microjoules
                                       max_energy_range_uj   the counter wraps to 0 past this
    /sys/class/powercap/intel-rapl:<N>:<M>/...               subzones: "core", "uncore", "dram"

``total_mw`` is the sum of the package zones (subzones are parts of a package, ``psys`` covers
more than the CPU); every zone is also reported as a rail (``package-0``, ``package-0/dram``).
Power is the energy difference between two reads over the time between them, so the first read
carries no power; ``energy_mj`` is the packages' counter unwrapped across wraparounds. A counter that
went back is a wrap only when the energy that implies, over the time since the last read, stays under
:data:`MAX_ZONE_POWER_MW` (and the step back is at least half the range); otherwise it was reset (a
driver reload, a resume, firmware) and counts no energy. So read at least once per half wrap period:
minutes at full load. Since the PLATYPUS fix (CVE-2020-8694) kernels make
``energy_uj`` readable by root only; the sensor then reports itself unavailable with that reason.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors._files import read_number, read_text
from edgekit_runtime.sensors.base import Clock, PowerSample, PowerSensor

logger = logging.getLogger(__name__)

POWERCAP_DIR = "sys/class/powercap"
#: No RAPL zone draws more (a server CPU package is under 1 kW): a "wrap" that would mean more was a reset.
MAX_ZONE_POWER_MW = 5_000_000.0
_ZONE_RE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")


@dataclass
class _Zone:
    rail: str
    directory: Path
    is_package: bool
    max_energy_range_uj: float
    last_raw_uj: float | None = None
    unwrapped_uj: float = 0.0

    def check(self, raw_uj: float) -> None:
        """Raise :class:`SensorError` for a raw reading no counter can hold (before any zone advances)."""
        if raw_uj > self.max_energy_range_uj:  # no counter holds more than its range: a misread, not energy
            raise SensorError(f"{self.directory / 'energy_uj'} read {raw_uj:g} uJ, past its max_energy_range_uj "
                              f"{self.max_energy_range_uj:g}")  # fmt: skip

    def advance(self, raw_uj: float, elapsed_s: float) -> float:
        """Take a new raw reading ``elapsed_s`` after the previous one; return the energy between (uJ).

        A step back is a wrap only when at least half the range and at most :data:`MAX_ZONE_POWER_MW` over
        ``elapsed_s``; otherwise the counter was reset and the step counts no energy.
        """
        self.check(raw_uj)
        if self.last_raw_uj is None:
            delta_uj = 0.0
            self.unwrapped_uj = raw_uj
        elif raw_uj >= self.last_raw_uj:
            delta_uj = raw_uj - self.last_raw_uj
        else:
            wrap_uj = self.max_energy_range_uj - self.last_raw_uj + raw_uj  # passed the top, started from 0
            wrap_mw = wrap_uj / 1000.0 / elapsed_s if elapsed_s > 0 else float("inf")
            if self.last_raw_uj - raw_uj >= self.max_energy_range_uj / 2 and wrap_mw <= MAX_ZONE_POWER_MW:
                delta_uj = wrap_uj
            else:
                logger.warning("RAPL %s went back from %.0f to %.0f uJ in %.3g s: a counter reset (a wrap would "
                               "mean %.3g mW), no energy counted", self.directory / "energy_uj",
                               self.last_raw_uj, raw_uj, elapsed_s, wrap_mw)  # fmt: skip
                delta_uj = 0.0
        self.last_raw_uj = raw_uj
        self.unwrapped_uj += delta_uj
        return delta_uj


def unreadable_energy_reason(path: Path, error: SensorError) -> str:
    """Why the sensor is unavailable when ``energy_uj`` cannot be read."""
    if "permission denied" in error.message:
        return (
            f"cannot read {path}: permission denied; since the PLATYPUS fix (CVE-2020-8694) kernels "
            "let only root read RAPL energy_uj: run the agent as root or grant read access to it "
            "(for example a udev rule or tmpfiles.d entry that sets mode 0444)"
        )
    return error.message


class RaplPowerSensor(PowerSensor):
    """Sums the RAPL package zones; reports every zone and subzone as a rail."""

    name = "rapl"

    def __init__(self, root: Path = Path("/"), *, clock: Clock = time.monotonic) -> None:
        super().__init__(root, clock=clock)
        self._zones: list[_Zone] = []
        self._skipped: list[str] = []  # zones left out because they cannot be read (a subzone, psys)
        self._last_timestamp_s: float | None = None

    def _probe_impl(self) -> str | None:
        powercap = self.path(POWERCAP_DIR)
        zone_dirs = _zone_dirs(powercap)
        if not zone_dirs:
            return (
                f"no RAPL zones (intel-rapl:N) under {powercap}; needs an Intel or AMD x86 CPU "
                "with the intel_rapl_msr kernel module loaded (not available in most VMs)"
            )
        names: dict[str, str] = {}
        zones, skipped = [], []
        first_problem: str | None = None
        for directory, package_index, sub_index in zone_dirs:
            try:
                zone_name = read_text(directory / "name")
                max_range_uj = read_number(directory / "max_energy_range_uj")
                read_number(directory / "energy_uj")
                if max_range_uj <= 0:
                    raise SensorError(f"{directory / 'max_energy_range_uj'} is {max_range_uj:g}: the counter's wrap "
                                      "cannot be followed")  # fmt: skip
            except SensorError as exc:
                problem = unreadable_energy_reason(directory / "energy_uj", exc)
                first_problem = first_problem or problem
                skipped.append(f"{directory.name} ({problem})")  # a zone that cannot be read leaves the others
                continue
            if sub_index is None:
                names[package_index] = zone_name
                rail = zone_name
            else:
                rail = f"{names.get(package_index, f'intel-rapl:{package_index}')}/{zone_name}"
            is_package = sub_index is None and zone_name.startswith("package")
            zones.append(_Zone(rail, directory, is_package, max_range_uj))
        if not any(z.is_package for z in zones):
            if first_problem is not None:
                return first_problem
            return f"RAPL zones under {powercap} include no package zone: {[z.rail for z in zones]}"
        self._zones, self._skipped = zones, skipped
        return None

    def _read_impl(self) -> PowerSample:
        timestamp_s = self._clock()
        raws = [read_number(z.directory / "energy_uj") for z in self._zones]  # every zone read before any advances
        for zone, raw in zip(self._zones, raws):  # and checked: a misread leaves every zone as it was
            zone.check(raw)
        previous_s = self._last_timestamp_s
        elapsed_s = timestamp_s - previous_s if previous_s is not None else 0.0
        deltas_uj = {z.rail: z.advance(raw, elapsed_s) for z, raw in zip(self._zones, raws)}
        energy_mj = sum(z.unwrapped_uj for z in self._zones if z.is_package) / 1000.0
        self._last_timestamp_s = timestamp_s
        if previous_s is None or elapsed_s <= 0:
            return PowerSample(timestamp_s=timestamp_s, rails_mw={}, total_mw=None, energy_mj=energy_mj)
        rails_mw = {rail: delta_uj / 1000.0 / elapsed_s for rail, delta_uj in deltas_uj.items()}
        total_mw = sum(rails_mw[z.rail] for z in self._zones if z.is_package)
        return PowerSample(timestamp_s=timestamp_s, rails_mw=rails_mw, total_mw=total_mw, energy_mj=energy_mj)

    def _source_impl(self) -> str:
        packages = " + ".join(z.rail for z in self._zones if z.is_package)
        left_out = f"; left out, unreadable: {', '.join(self._skipped)}" if self._skipped else ""
        return f"rapl powercap: total_mw = {packages} (CPU packages only, not the whole machine){left_out}"


def _zone_dirs(powercap: Path) -> list[tuple[Path, str, str | None]]:
    """``(directory, package index, subzone index)`` of each RAPL zone, packages before subzones."""
    try:
        entries = list(powercap.iterdir())
    except OSError:
        return []
    zones = []
    for entry in entries:
        match = _ZONE_RE.match(entry.name)
        if match and entry.is_dir():
            zones.append((entry, match.group(1), match.group(2)))
    return sorted(zones, key=lambda z: (z[2] is not None, int(z[1]), int(z[2] or 0)))


__all__ = ["MAX_ZONE_POWER_MW", "POWERCAP_DIR", "RaplPowerSensor", "unreadable_energy_reason"]
