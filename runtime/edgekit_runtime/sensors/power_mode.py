"""The power mode (Jetson nvpmodel) and whether clocks are locked (jetson_clocks), under an injectable root.

* modes: ``etc/nvpmodel.conf`` (on JetPack 6 a link to ``/etc/nvpmodel/nvpmodel_<module>.conf``), its
  ``< POWER_MODEL ID=<n> NAME=<name> >`` headers and the boot default ``< PM_CONFIG DEFAULT=<n> >``;
* current mode: ``var/lib/nvpmodel/status`` (``pmode:0002 fmode:quiet``: what ``nvpmodel -m`` wrote),
  else ``nvpmodel -q`` (``NV Power Mode: MAXN_SUPER`` then the id on the next line; only when a runner
  is given, which :class:`PowerModeReader` does for the live root), else the conf's default (nvpmodel
  applies it at boot while no mode was ever chosen);
* clocks: a domain is locked when its minimum frequency equals its maximum, as ``jetson_clocks`` leaves
  them: CPU ``sys/devices/system/cpu/cpufreq/policy<N>/scaling_{min,max}_freq`` (kHz), GPU
  ``sys/class/devfreq/<gpu>/{min,max}_freq`` (Hz) for the devfreq devices in :data:`GPU_DEVFREQ_NAMES`.

Reading is cheap (a few small files; the conf is parsed once per reader), so the agent re-reads it every
telemetry window and republishes its status when the mode or the lock changes.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.sensors._files import try_read_text

logger = logging.getLogger(__name__)

NVPMODEL_CONF_PATH = "etc/nvpmodel.conf"
NVPMODEL_STATUS_PATH = "var/lib/nvpmodel/status"
CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"
DEVFREQ_DIR = "sys/class/devfreq"
#: devfreq device names of Jetson GPUs (Nano, TX2, Xavier, Orin JetPack 5, Orin JetPack 6) and any "gpu".
GPU_DEVFREQ_NAMES = ("57000000.gpu", "17000000.gp10b", "17000000.gv11b", "17000000.ga10b", "17000000.gpu")
NVPMODEL_QUERY_TIMEOUT_S = 5.0

_MODEL_RE = re.compile(r"^<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>", re.MULTILINE)
_DEFAULT_RE = re.compile(r"^<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", re.MULTILINE)
_PMODE_RE = re.compile(r"pmode:\s*(\d+)")
_QUERY_RE = re.compile(r"NV Power Mode:\s*(\S+)\s*\n\s*(\d+)")


@dataclass(frozen=True)
class NvpModelConfig:
    """``modes``: id -> name, in file order; ``default_id``: the mode nvpmodel sets at first boot."""

    modes: dict[int, str]
    default_id: int | None
    source: str


def parse_nvpmodel_conf(text: str, source: str = "/" + NVPMODEL_CONF_PATH) -> NvpModelConfig:
    modes = {int(match.group(1)): match.group(2) for match in _MODEL_RE.finditer(text)}
    default = _DEFAULT_RE.search(text)
    return NvpModelConfig(modes, int(default.group(1)) if default else None, source)


def parse_nvpmodel_query(text: str) -> tuple[str, int] | None:
    """``nvpmodel -q`` output (``NV Fan Mode:quiet``, ``NV Power Mode: 15W``, ``0``) -> ``("15W", 0)``."""
    match = _QUERY_RE.search(text)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class ClockRange:
    """One clock domain's allowed range; ``locked`` when the governor cannot move it."""

    domain: str  # "cpu:policy0", "gpu:17000000.gpu"
    min_khz: float
    max_khz: float

    @property
    def locked(self) -> bool:
        return self.min_khz == self.max_khz


@dataclass(frozen=True)
class PowerModeState:
    """The power mode now (``None`` fields on a device without nvpmodel) and the clock ranges."""

    mode_id: int | None
    mode_name: str | None
    mode_source: str | None
    clocks: tuple[ClockRange, ...]

    @property
    def clocks_locked(self) -> bool | None:
        """True when every CPU and GPU domain found is pinned, ``None`` when none was found."""
        return all(clock.locked for clock in self.clocks) if self.clocks else None

    @property
    def label(self) -> str | None:
        """How reports name the mode: ``"MAXN_SUPER"``, ``"15W+clocks"``; ``None`` without one."""
        return power_mode_label(self.mode_name, self.clocks_locked)

    def reported_clocks(self) -> list[ClockRange]:
        """The clocks as the status message carries them: each, or past :data:`MAX_REPORTED_CLOCKS` the CPU policies
        that share a range as one entry (:func:`merged_clocks`), cut at the limit (``clocks_locked`` counts them all)."""
        if len(self.clocks) <= MAX_REPORTED_CLOCKS:
            return list(self.clocks)
        return merged_clocks(self.clocks)[:MAX_REPORTED_CLOCKS]

    def to_dict(self) -> dict[str, Any]:
        """The status message's ``power_mode`` object (see ``status.v1.json``)."""
        return {
            "id": self.mode_id, "name": self.mode_name, "source": self.mode_source,
            "clocks_locked": self.clocks_locked,
            "clocks": [{"domain": c.domain, "min_khz": c.min_khz, "max_khz": c.max_khz} for c in self.reported_clocks()],
        }  # fmt: skip


#: ``status.v1`` carries at most this many clock domains (``power_mode.clocks``)
MAX_REPORTED_CLOCKS = 32
_POLICY_RE = re.compile(r"^cpu:policy(\d+)$")
_POLICY_NAME_RE = re.compile(r"^policy\d+$")


def merged_clocks(clocks: Sequence[ClockRange]) -> list[ClockRange]:
    """``clocks`` with each run of CPU policies that share a range made one, ``cpu:policy0-47``: a many-core x86 or
    Arm server has one cpufreq policy a core (``intel_pstate``), and one entry a core outgrew the status message."""
    merged: list[ClockRange] = []
    run: list[ClockRange] = []

    def close_run() -> None:
        if len(run) > 1:
            first, last = _POLICY_RE.match(run[0].domain), _POLICY_RE.match(run[-1].domain)
            assert first is not None and last is not None
            merged.append(ClockRange(f"cpu:policy{first.group(1)}-{last.group(1)}", run[0].min_khz, run[0].max_khz))
        else:
            merged.extend(run)
        run.clear()

    for clock in clocks:
        if _POLICY_RE.match(clock.domain) and (not run or (clock.min_khz, clock.max_khz) == (run[0].min_khz, run[0].max_khz)):
            run.append(clock)
            continue
        close_run()
        if _POLICY_RE.match(clock.domain):
            run.append(clock)
        else:
            merged.append(clock)
    close_run()
    return merged


#: The longest label a telemetry window carries (telemetry.v1 ``power_mode``; status.v1 allows longer mode names).
MAX_LABEL_CHARS = 128


def power_mode_label(mode_name: str | None, clocks_locked: bool | None) -> str | None:
    """The mode name, with ``+clocks`` when jetson_clocks pinned the clocks (the collector groups by it)."""
    if mode_name is None:
        return None
    suffix = "+clocks" if clocks_locked else ""
    return mode_name[: MAX_LABEL_CHARS - len(suffix)] + suffix  # telemetry.v1's power_mode holds 128 characters


QueryRunner = Callable[[], str | None]


def run_nvpmodel_query() -> str | None:
    """``nvpmodel -q`` output, or ``None`` when the tool is missing or fails."""
    executable = shutil.which("nvpmodel")
    if executable is None:
        return None
    try:
        done = subprocess.run([executable, "-q"], capture_output=True, text=True, timeout=NVPMODEL_QUERY_TIMEOUT_S,
                              check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("nvpmodel -q failed: %s", exc)
        return None
    return done.stdout if done.returncode == 0 else None


class PowerModeReader:
    """Reads :class:`PowerModeState`; ``query`` runs ``nvpmodel -q`` (default: only for the live root)."""

    def __init__(self, root: Path = Path("/"), *, query: QueryRunner | None = None) -> None:
        self._root = Path(root)
        self._query = query if query is not None else (run_nvpmodel_query if self._root == Path("/") else None)
        self._config: NvpModelConfig | None = None
        self._config_read = False

    @property
    def config(self) -> NvpModelConfig | None:
        """The parsed nvpmodel.conf (read once), or ``None`` without one."""
        if not self._config_read:
            self._config_read = True
            text = try_read_text(self._root / NVPMODEL_CONF_PATH)
            if text:
                self._config = parse_nvpmodel_conf(text)
        return self._config

    def read(self) -> PowerModeState:
        mode_id, mode_name, source = self._read_mode()
        return PowerModeState(mode_id, mode_name, source, self._cpu_clocks() + self._gpu_clocks())

    def _read_mode(self) -> tuple[int | None, str | None, str | None]:
        config = self.config
        status = try_read_text(self._root / NVPMODEL_STATUS_PATH)
        match = _PMODE_RE.search(status or "")
        if match is not None:
            mode_id = int(match.group(1))
            name = config.modes.get(mode_id) if config is not None else None
            return mode_id, name, "/" + NVPMODEL_STATUS_PATH
        if config is None:
            return None, None, None  # no nvpmodel on this device
        query = self._query() if self._query is not None else None
        parsed = parse_nvpmodel_query(query or "")
        if parsed is not None:
            return parsed[1], parsed[0], "nvpmodel -q"
        if config.default_id is not None:
            return config.default_id, config.modes.get(config.default_id), f"{config.source} DEFAULT"
        return None, None, None

    def _cpu_clocks(self) -> tuple[ClockRange, ...]:
        try:
            policies = sorted((p for p in (self._root / CPUFREQ_DIR).iterdir() if _POLICY_NAME_RE.match(p.name)),
                              key=lambda p: int(p.name[len("policy"):]))  # policy2 before policy10
        except OSError:
            return ()
        return tuple(clock for policy in policies
                     if (clock := _range(f"cpu:{policy.name}", policy / "scaling_min_freq",
                                         policy / "scaling_max_freq", 1.0)) is not None)  # fmt: skip

    def _gpu_clocks(self) -> tuple[ClockRange, ...]:
        try:
            devices = sorted((self._root / DEVFREQ_DIR).iterdir())
        except OSError:
            return ()
        clocks = []
        for device in devices:
            if device.name in GPU_DEVFREQ_NAMES or "gpu" in device.name:
                clock = _range(f"gpu:{device.name}", device / "min_freq", device / "max_freq", 1000.0)
                if clock is not None:
                    clocks.append(clock)
        return tuple(clocks)


def _range(domain: str, min_path: Path, max_path: Path, per_khz: float) -> ClockRange | None:
    low, high = try_read_text(min_path), try_read_text(max_path)
    if not low or not high or not low.isdigit() or not high.isdigit():
        return None
    return ClockRange(domain, int(low) / per_khz, int(high) / per_khz)


__all__ = [
    "ClockRange",
    "NvpModelConfig",
    "PowerModeReader",
    "PowerModeState",
    "parse_nvpmodel_conf",
    "parse_nvpmodel_query",
    "power_mode_label",
]
