"""Power and device-state sensors of the device runtime.

``create_sensor("auto")`` picks the first available of :data:`AUTO_ORDER` (ina3221, nvml, rapl,
none); ``tegrastats`` needs a running process or a line source, so it is used only when named.
Every sensor takes ``root`` (default ``/``) for the files it reads. Typical agent loop::

    sensor = create_sensor("auto")
    integrator = PowerIntegrator.for_sensor(sensor)
    ...  # a sampling thread: integrator.extend(sensor.read_pending())
    stats = integrator.take_window()  # every telemetry interval
    energy_per_inference_mj(stats, inferences_in_window)
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors.base import (
    DeviceState,
    PowerIntegrator,
    PowerSample,
    PowerSensor,
    PowerStats,
    energy_per_inference_mj,
    summarize_samples,
)
from edgekit_runtime.sensors.device_state import DeviceStateReader
from edgekit_runtime.sensors.ina3221 import Ina3221PowerSensor
from edgekit_runtime.sensors.none import NoPowerSensor
from edgekit_runtime.sensors.nvml import NvmlPowerSensor
from edgekit_runtime.sensors.rapl import RaplPowerSensor
from edgekit_runtime.sensors.tegrastats import TegrastatsPowerSensor
from edgekit_runtime.sensors.tegrastats_parse import (
    TegrastatsReading,
    parse_tegrastats_line,
)

logger = logging.getLogger(__name__)

SENSORS: dict[str, type[PowerSensor]] = {
    "ina3221": Ina3221PowerSensor,
    "tegrastats": TegrastatsPowerSensor,
    "nvml": NvmlPowerSensor,
    "rapl": RaplPowerSensor,
    "none": NoPowerSensor,
}
AUTO = "auto"
AUTO_ORDER = ("ina3221", "nvml", "rapl", "none")


def create_sensor(name: str, root: Path = Path("/"), **options: object) -> PowerSensor:
    """The sensor registered as ``name``, or with ``"auto"`` the first available one.

    ``options`` go to the sensor's constructor (``nvml=``, ``total_rail=``, ``lines=``, ``clock=``);
    with ``"auto"`` each candidate gets the options its constructor accepts.
    """
    if name == AUTO:
        return _create_auto(Path(root), options)
    if name not in SENSORS:
        raise SensorError(
            f"unknown power sensor {name!r}; known sensors: {', '.join([*SENSORS, AUTO])}",
            hint="use 'auto' to pick the first available one, or 'none' to record no power",
        )
    sensor_class = SENSORS[name]
    accepted = _accepted_options(sensor_class)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise SensorError(
            f"power sensor {name!r} takes no option(s) {unknown}; it accepts: {sorted(accepted)}"
        )
    return sensor_class(Path(root), **options)  # type: ignore[arg-type]


def _create_auto(root: Path, options: dict[str, object]) -> PowerSensor:
    candidates = [SENSORS[name] for name in AUTO_ORDER]
    accepted_anywhere = set().union(*(_accepted_options(c) for c in candidates))
    unknown = sorted(set(options) - accepted_anywhere)
    if unknown:
        raise SensorError(
            f"no sensor tried by 'auto' ({', '.join(AUTO_ORDER)}) takes option(s) {unknown}",
            hint=f"options they accept: {sorted(accepted_anywhere)}",
        )
    skipped: list[str] = []
    for sensor_class in candidates:
        accepted = _accepted_options(sensor_class)
        sensor = sensor_class(root, **{k: v for k, v in options.items() if k in accepted})  # type: ignore[arg-type]
        if sensor.available():
            if skipped:
                logger.info("power sensor 'auto' chose %s; skipped %s", sensor.name, "; ".join(skipped))
            return sensor
        skipped.append(f"{sensor.name}: {sensor.unavailable_reason}")
        sensor.close()
    raise SensorError(f"no power sensor available, not even 'none': {'; '.join(skipped)}")  # unreachable


def _accepted_options(sensor_class: type[PowerSensor]) -> set[str]:
    parameters = inspect.signature(sensor_class.__init__).parameters
    return {p.name for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


__all__ = [
    "AUTO_ORDER",
    "SENSORS",
    "DeviceState",
    "DeviceStateReader",
    "Ina3221PowerSensor",
    "NoPowerSensor",
    "NvmlPowerSensor",
    "PowerIntegrator",
    "PowerSample",
    "PowerSensor",
    "PowerStats",
    "RaplPowerSensor",
    "TegrastatsPowerSensor",
    "TegrastatsReading",
    "create_sensor",
    "energy_per_inference_mj",
    "parse_tegrastats_line",
    "summarize_samples",
]
