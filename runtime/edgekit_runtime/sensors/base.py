"""Power and device-state records, the :class:`PowerSensor` interface and :class:`PowerIntegrator`.

Every record carries its unit in its field names. A value a platform cannot measure is ``None``
together with a reason; a sensor never fills in a number it did not read.

Every filesystem path a sensor touches is relative to an injectable ``root`` (default ``/``), so tests
point sensors at fixture trees and never at the machine's own ``/sys`` or ``/proc``.

Energy for a window comes from one of two methods:

* the difference of a cumulative energy counter (``PowerSample.energy_mj``: NVML total energy, RAPL)
  when every sample in the window carries one; sensors unwrap hardware counter wraparound before
  they report, so ``energy_mj`` only ever grows;
* otherwise the trapezoid rule over ``total_mw`` against ``timestamp_s`` (mW x s = mJ).
"""

from __future__ import annotations

import abc
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

from edgekit_runtime.errors import SensorError

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

SensorT = TypeVar("SensorT", bound="PowerSensor")

METHOD_COUNTER = "energy counter difference"
METHOD_TRAPEZOID = "trapezoid over total_mw"


@dataclass(frozen=True)
class PowerSample:
    """One reading of a power sensor.

    ``timestamp_s`` comes from the sensor's clock (``time.monotonic`` unless injected);
    ``rails_mw`` maps rail names (``VDD_IN``, ``package-0``, ``gpu0``) to power; ``total_mw`` is the
    sensor's best whole-device figure (``None`` when it has none); ``energy_mj`` is a cumulative
    energy counter where the platform has one, else ``None``.
    """

    timestamp_s: float
    rails_mw: dict[str, float] = field(default_factory=dict)
    total_mw: float | None = None
    energy_mj: float | None = None


@dataclass(frozen=True)
class PowerStats:
    """Power over one window. With no sensor the power fields are ``None`` and ``reason`` says why."""

    mean_mw: float | None
    max_mw: float | None
    energy_mj: float | None
    duration_s: float
    samples: int
    source: str
    reason: str | None = None
    #: How ``energy_mj`` was obtained: :data:`METHOD_COUNTER` or :data:`METHOD_TRAPEZOID`.
    energy_method: str | None = None


@dataclass(frozen=True)
class DeviceState:
    """Temperatures, memory and load at one moment. ``gpu_load_pct`` is ``None`` without a GPU
    load source; ``cpu_load_pct`` is ``None`` only when no CPU time elapsed between two reads."""

    temperatures_c: dict[str, float]
    memory_used_mb: float
    memory_total_mb: float
    cpu_load_pct: float | None
    gpu_load_pct: float | None = None


class PowerSensor(abc.ABC):
    """One source of power readings.

    Public methods check state, then call the implementation hooks (``_probe_impl``,
    ``_read_impl``, ``_close_impl``). A sensor is a context manager: ``with sensor: sensor.read()``.
    """

    #: The registry name (``"ina3221"``, ``"nvml"``, ...).
    name: ClassVar[str]
    #: Why this sensor's samples never carry power (only the ``none`` sensor sets it).
    no_power_reason: ClassVar[str | None] = None

    def __init__(self, root: Path = Path("/"), *, clock: Clock = time.monotonic) -> None:
        self._root = Path(root)
        self._clock = clock
        self._probed = False
        self._unavailable_reason: str | None = None
        self._closed = False

    # -- public API ---------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self._root

    def path(self, relative: str) -> Path:
        """``relative`` (written as on the device, without the leading ``/``) under ``root``."""
        return self._root / relative.lstrip("/")

    def available(self) -> bool:
        """Whether this sensor can read on this machine; probes once, then remembers."""
        if not self._probed:
            self._unavailable_reason = self._probe_impl()
            self._probed = True
            if self._unavailable_reason is not None:
                logger.debug("power sensor %s unavailable: %s", self.name, self._unavailable_reason)
        return self._unavailable_reason is None

    @property
    def unavailable_reason(self) -> str | None:
        """Why :meth:`available` is False; ``None`` when the sensor is available."""
        self.available()
        return self._unavailable_reason

    @property
    def source(self) -> str:
        """What the sensor measures and how it forms ``total_mw``, for telemetry and reports."""
        if not self.available():
            return f"{self.name} (unavailable: {self._unavailable_reason})"
        return self._source_impl()

    def read(self) -> PowerSample:
        """One fresh sample. Raises :class:`SensorError` when the sensor is closed or unavailable."""
        self._require_readable()
        return self._read_impl()

    def read_pending(self) -> list[PowerSample]:
        """The samples produced since the last call. Polled sensors read once; sensors fed by a
        stream (tegrastats) return everything that arrived, oldest first."""
        self._require_readable()
        return self._read_pending_impl()

    def close(self) -> None:
        """Release files, processes and libraries; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close_impl()

    def __enter__(self: SensorT) -> SensorT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- implementation hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _probe_impl(self) -> str | None:
        """Return ``None`` when the sensor can read, else the reason it cannot."""

    @abc.abstractmethod
    def _read_impl(self) -> PowerSample: ...

    @abc.abstractmethod
    def _source_impl(self) -> str: ...

    def _read_pending_impl(self) -> list[PowerSample]:
        return [self._read_impl()]

    def _close_impl(self) -> None:
        return None

    def _require_readable(self) -> None:
        if self._closed:
            raise SensorError(
                f"power sensor '{self.name}' is closed",
                hint="create a new sensor with edgekit_runtime.sensors.create_sensor()",
            )
        if not self.available():
            raise SensorError(
                f"power sensor '{self.name}' under root {self._root} is not available: "
                f"{self._unavailable_reason}",
                hint="use create_sensor('auto') to pick the first available sensor, "
                "or 'none' to record no power",
            )


class PowerIntegrator:
    """Collects samples and turns a window of them into :class:`PowerStats`.

    The agent feeds it every telemetry interval (``integrator.extend(sensor.read_pending())``) and
    calls :meth:`take_window`; the last sample of a window starts the next one, so consecutive
    windows cover time without gaps or overlap. Methods are thread-safe, so a sampling thread may
    feed it while the telemetry thread takes windows. ``source`` is a string or a callable giving
    one (a sensor's :attr:`~PowerSensor.source` can change once it has read, as tegrastats' does).
    """

    def __init__(
        self,
        *,
        source: str | Callable[[], str],
        no_power_reason: str | None = None,
        max_samples: int = 100_000,
    ) -> None:
        if max_samples < 2:
            raise SensorError(f"PowerIntegrator: max_samples must be at least 2, got {max_samples}")
        self._source = source
        self._no_power_reason = no_power_reason
        self._samples: deque[PowerSample] = deque(maxlen=max_samples)
        self._lock = threading.Lock()

    @classmethod
    def for_sensor(cls, sensor: PowerSensor, *, max_samples: int = 100_000) -> PowerIntegrator:
        return cls(
            source=lambda: sensor.source, no_power_reason=sensor.no_power_reason, max_samples=max_samples
        )

    @property
    def source(self) -> str:
        return self._source() if callable(self._source) else self._source

    @property
    def sample_count(self) -> int:
        return len(self._samples)

    def add(self, sample: PowerSample) -> None:
        with self._lock:
            self._append(sample)

    def extend(self, samples: Iterable[PowerSample]) -> None:
        with self._lock:
            for sample in samples:
                self._append(sample)

    def stats(self, *, start_s: float | None = None, end_s: float | None = None) -> PowerStats:
        """Stats over the samples with ``start_s <= timestamp_s <= end_s`` (bounds optional)."""
        with self._lock:
            window = [
                s
                for s in self._samples
                if (start_s is None or s.timestamp_s >= start_s) and (end_s is None or s.timestamp_s <= end_s)
            ]
        return summarize_samples(window, source=self.source, no_power_reason=self._no_power_reason)

    def take_window(self) -> PowerStats:
        """Stats over every held sample; then keep only the last one as the next window's start."""
        with self._lock:
            window = list(self._samples)
            if window:
                self._samples.clear()
                self._samples.append(window[-1])
        return summarize_samples(window, source=self.source, no_power_reason=self._no_power_reason)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()

    def _append(self, sample: PowerSample) -> None:
        if self._samples and sample.timestamp_s < self._samples[-1].timestamp_s:
            raise SensorError(
                f"PowerIntegrator.add: sample at {sample.timestamp_s:.6f} s is older than the previous "
                f"one at {self._samples[-1].timestamp_s:.6f} s",
                hint="feed samples in time order from one sensor and one clock",
            )
        self._samples.append(sample)


def summarize_samples(
    samples: list[PowerSample], *, source: str, no_power_reason: str | None = None
) -> PowerStats:
    """:class:`PowerStats` for ``samples`` (time-ordered); see the module docstring for the method."""
    if not samples:
        return PowerStats(None, None, None, 0.0, 0, source, reason="no samples in the window")
    duration_s = samples[-1].timestamp_s - samples[0].timestamp_s
    powered = [(s.timestamp_s, s.total_mw) for s in samples if s.total_mw is not None]
    max_mw = max(p for _, p in powered) if powered else None

    energy_mj = _counter_energy_mj(samples)
    if energy_mj is not None:
        mean_mw = energy_mj / duration_s if duration_s > 0 else None
        return PowerStats(mean_mw, max_mw, energy_mj, duration_s, len(samples), source, None, METHOD_COUNTER)

    if len(powered) >= 2:
        energy_mj = math.fsum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in pairwise(powered))
        span_s = powered[-1][0] - powered[0][0]
        mean_mw = energy_mj / span_s if span_s > 0 else None
        return PowerStats(
            mean_mw, max_mw, energy_mj, duration_s, len(samples), source, None, METHOD_TRAPEZOID
        )

    if len(powered) == 1:
        only_mw = powered[0][1]
        reason = "one power reading in the window; energy needs at least two"
        return PowerStats(only_mw, only_mw, None, duration_s, len(samples), source, reason)

    reason = no_power_reason or "no sample in the window carried a power reading"
    return PowerStats(None, None, None, duration_s, len(samples), source, reason)


def _counter_energy_mj(samples: list[PowerSample]) -> float | None:
    """Energy from the cumulative counter when every sample has one and it never goes back."""
    counters: list[float] = []
    for sample in samples:
        if sample.energy_mj is None:
            return None
        counters.append(sample.energy_mj)
    if len(counters) < 2:
        return None
    if any(later < earlier for earlier, later in pairwise(counters)):
        logger.warning("energy counter went backwards inside a window (driver reload?); using total_mw")
        return None
    return counters[-1] - counters[0]


def energy_per_inference_mj(stats: PowerStats, inferences: int) -> float | None:
    """Energy of one inference in the window; ``None`` without energy or without inferences."""
    if isinstance(inferences, bool) or not isinstance(inferences, int) or inferences < 0:
        raise SensorError(
            f"energy_per_inference_mj: inferences must be a non-negative int, got {inferences!r}",
            hint="pass the number of inferences completed inside the window the stats cover",
        )
    if stats.energy_mj is None or inferences == 0:
        return None
    return stats.energy_mj / inferences
