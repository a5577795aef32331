"""The sensor for machines without one: always available, never a power number."""

from __future__ import annotations

from edgekit_runtime.sensors.base import PowerSample, PowerSensor

NO_POWER_SENSOR = "no power sensor"


class NoPowerSensor(PowerSensor):
    """Samples carry a timestamp and nothing else; :class:`PowerStats` from them say why."""

    name = "none"
    no_power_reason = NO_POWER_SENSOR

    def _probe_impl(self) -> str | None:
        return None

    def _read_impl(self) -> PowerSample:
        return PowerSample(timestamp_s=self._clock(), rails_mw={}, total_mw=None, energy_mj=None)

    def _source_impl(self) -> str:
        return f"none ({NO_POWER_SENSOR})"


__all__ = ["NO_POWER_SENSOR", "NoPowerSensor"]
