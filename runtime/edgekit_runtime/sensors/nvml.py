"""NVIDIA GPU board power through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package).

* ``nvmlDeviceGetPowerUsage(handle)``: board power in mW. On Ampere (except GA100) and newer it is
  averaged over one second, so short windows should rely on the energy counter.
* ``nvmlDeviceGetTotalEnergyConsumption(handle)``: energy in mJ since the driver loaded, Volta and
  newer. When every device has it, samples carry it as ``energy_mj`` and windows use its difference.

Either call may raise ``NVMLError`` with ``value == NVML_ERROR_NOT_SUPPORTED``: Jetson's NVML has no
power counters at all, so the sensor reports itself unavailable there and ``auto`` moves on. A binding
too old to have a call (``nvidia-ml-py3`` 7.352.0 has no ``nvmlDeviceGetTotalEnergyConsumption``)
counts as not supported; a binding that fails the probe in another way makes the sensor unavailable
with the error as its reason, after shutting NVML down.

``pynvml`` is imported only when the sensor probes, never at module import. Pass ``nvml=`` any
module-like object with the same names to use another binding, or a fake one in tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors.base import Clock, PowerSample, PowerSensor

logger = logging.getLogger(__name__)

NVML_ERROR_NOT_SUPPORTED = 3  # nvml.h; pynvml exposes the same value under the same name


@dataclass(frozen=True)
class _Gpu:
    index: int
    name: str
    handle: Any
    has_power: bool
    has_energy: bool


class NvmlPowerSensor(PowerSensor):
    """Sums the power of the selected GPUs (all by default); rails are ``gpu<index>``."""

    name = "nvml"

    def __init__(
        self,
        root: Path = Path("/"),
        *,
        nvml: Any | None = None,
        device_indices: Sequence[int] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(root, clock=clock)  # NVML reads no files; root is kept for the interface
        self._nvml: Any = nvml  # a pynvml-like module; imported lazily when None
        self._device_indices = None if device_indices is None else list(device_indices)
        self._gpus: list[_Gpu] = []
        self._initialized = False

    def _probe_impl(self) -> str | None:
        if self._nvml is None:
            try:
                import pynvml  # lazy: only machines that ask for NVML need nvidia-ml-py
            except ImportError:
                return "the NVML Python bindings are not installed (pip install nvidia-ml-py)"
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return f"NVML could not start: {exc}"
        self._initialized = True
        try:
            reason = self._find_gpus()
        except nvml.NVMLError as exc:
            reason = f"NVML could not list GPUs: {exc}"
        except Exception as exc:  # a binding without a name we call, or answering with odd types
            reason = f"NVML could not list GPUs: the binding failed: {type(exc).__name__}: {exc}"
        if reason is not None:
            self._gpus = []
            self._shutdown()
        return reason

    def _find_gpus(self) -> str | None:
        nvml = self._nvml
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return "NVML sees no GPU"
        indices = self._device_indices if self._device_indices is not None else list(range(count))
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            return f"device_indices {bad} out of range: NVML sees {count} GPU(s), indices 0..{count - 1}"
        unsupported = []
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            has_power = self._supports(getattr(nvml, "nvmlDeviceGetPowerUsage", None), handle)
            has_energy = self._supports(getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None), handle)
            if has_power or has_energy:
                self._gpus.append(_Gpu(index, name, handle, has_power, has_energy))
            else:
                unsupported.append(f"GPU {index} ({name})")
        if not self._gpus:
            return (
                f"NVML reports power readings as not supported on {', '.join(unsupported)} "
                "(as on Jetson, whose NVML has no power counters: use the ina3221 sensor)"
            )
        if unsupported:
            logger.warning("NVML power not supported on %s; left out of total_mw", ", ".join(unsupported))
        return None

    def _supports(self, query: Any, handle: Any) -> bool:
        if query is None:  # the binding predates the call
            return False
        try:
            query(handle)
        except self._nvml.NVMLError as exc:
            not_supported = getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)
            if getattr(exc, "value", None) != not_supported:
                logger.warning("NVML %s failed: %s", getattr(query, "__name__", "query"), exc)
            return False
        return True

    def _read_impl(self) -> PowerSample:
        nvml = self._nvml
        timestamp_s = self._clock()
        rails_mw: dict[str, float] = {}
        energies_mj: list[float] = []
        for gpu in self._gpus:
            try:
                if gpu.has_power:
                    rails_mw[f"gpu{gpu.index}"] = float(nvml.nvmlDeviceGetPowerUsage(gpu.handle))
                if gpu.has_energy:
                    energies_mj.append(float(nvml.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)))
            except nvml.NVMLError as exc:
                raise SensorError(f"NVML read of GPU {gpu.index} ({gpu.name}) failed: {exc}") from exc
        total_mw = sum(rails_mw.values()) if all(g.has_power for g in self._gpus) else None
        energy_mj = sum(energies_mj) if all(g.has_energy for g in self._gpus) else None
        return PowerSample(timestamp_s=timestamp_s, rails_mw=rails_mw, total_mw=total_mw, energy_mj=energy_mj)

    def gpu_load_pct(self) -> float | None:
        """Utilization of the first selected GPU (``nvmlDeviceGetUtilizationRates``), if known."""
        if not self.available() or self._closed:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._gpus[0].handle).gpu)
        except self._nvml.NVMLError:
            return None

    def _source_impl(self) -> str:
        gpus = ", ".join(f"gpu{g.index} {g.name}" for g in self._gpus)
        counter = "energy counter" if all(g.has_energy for g in self._gpus) else "no energy counter"
        return f"nvml: total_mw = sum of {gpus} board power ({counter})"

    def _close_impl(self) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                logger.debug("nvmlShutdown failed: %s", exc)


def _text(value: object) -> str:
    """Old pynvml versions return bytes for names."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


__all__ = ["NvmlPowerSensor"]
