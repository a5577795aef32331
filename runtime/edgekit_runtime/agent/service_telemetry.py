"""The agent's measuring threads: power sampling, a telemetry window every ``telemetry.interval_s`` (latency,
power integrated over the window, energy per inference, device state, each model's window), and the
optional probe that sends a synthetic request to every model every ``probe.interval_s``. A part of
:class:`~edgekit_runtime.agent.service.AgentService`, which supplies the state named below.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from edgekit_runtime.agent.config import AgentConfig
from edgekit_runtime.agent.service_commands import COMMAND_POLL_S
from edgekit_runtime.agent.telemetry import BundleRef, TelemetryProblem, batches_field, build_telemetry
from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.sensors import DeviceStateReader, PowerIntegrator, PowerSensor
from edgekit_runtime.sensors.power_mode import PowerModeState
from edgekit_runtime.signature import ANONYMOUS_DIM, IOSignature
from edgekit_runtime.timing import rss_mb

logger = logging.getLogger("edgekit_runtime.agent.service")


def synthetic_feeds(signature: IOSignature, dims: Mapping[str, int], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds that match ``signature``: named dims from ``dims``, else their ``opt`` (or ``min``), else 1;
    an input with a pinned ``value`` holds it, other floats are standard normal, integers and booleans
    zero (valid indices for any embedding). A scalar input (shape ``[]``) gets a rank-0 array."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for tensor in signature.inputs:
        shape: list[int] = []
        for dim in tensor.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim in dims:
                shape.append(dims[dim])
            elif dim != ANONYMOUS_DIM and dim in signature.dims:
                bounds = signature.dims[dim]
                shape.append(bounds.opt if bounds.opt is not None else max(bounds.min, 1))
            else:
                shape.append(1)
        dtype = np.dtype(tensor.dtype)
        if tensor.value is not None:  # the recipe pins it (a sample rate)
            feeds[tensor.name] = np.full(shape, tensor.value, dtype)
        else:
            feeds[tensor.name] = np.asarray(rng.standard_normal(shape), dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return feeds


#: How far the wall clock may move apart from the steady clock (steady_s) over one window before it counts as stepped
CLOCK_STEP_TOLERANCE_S = 2.0


def steady_s() -> float:
    """Seconds on a clock no one sets: CLOCK_BOOTTIME where there is one (it counts a suspend, as the wall clock
    does, so a suspended device is not taken for a stepped clock), else the monotonic clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def window_bounds(start: datetime, end: datetime, elapsed_s: float) -> tuple[datetime, TelemetryProblem | None]:
    """The window's start: ``start``, or, when the wall clock was stepped during the window (NTP correcting a clock
    that was set wrong at boot, ``date -s``) by more than :data:`CLOCK_STEP_TOLERANCE_S`, ``end`` less the window's
    length by :func:`steady_s`, with a ``clock.stepped`` problem. Before, a clock stepped back made every window
    end before it started: none was published until the clock caught up again, and their counts were lost."""
    stepped_s = (end - start).total_seconds() - elapsed_s
    if abs(stepped_s) <= CLOCK_STEP_TOLERANCE_S:
        return start, None
    return end - timedelta(seconds=max(elapsed_s, 0.0)), TelemetryProblem(
        "clock.stepped", f"the wall clock was stepped {stepped_s:+.1f} s during this window (NTP or date -s); its start is "
                         f"its end less its {elapsed_s:.1f} s by the steady clock (CLOCK_BOOTTIME)")  # fmt: skip


class TelemetryReporting:
    """The power, telemetry and probe threads of :class:`~edgekit_runtime.agent.service.AgentService`."""

    config: AgentConfig
    models: Any
    server: Any
    state_reader: DeviceStateReader
    integrator: PowerIntegrator | None
    power_mode: PowerModeState | None
    _sensor: PowerSensor | None
    _stop: threading.Event
    _interval_s: float
    _interval_changed: threading.Event
    _telemetry_lock: threading.Lock
    _problems_lock: threading.Lock
    _problems: list[TelemetryProblem]
    _events_lock: threading.Lock
    _outbox: Any
    _outbox_retry_at: float
    _link: Any
    _link_started: bool
    _spool: Any
    _window_start: datetime
    _window_started_steady: float
    _problem: Callable[[str, str], None]
    _refresh_power_mode: Callable[[], TelemetryProblem | None]
    _current_problems: Callable[[], list[TelemetryProblem]]
    _bundle_ref: Callable[[], BundleRef | None]
    _send: Callable[[str, dict[str, Any]], None]
    retry_outbox: Callable[[], bool]

    def _power_loop(self) -> None:
        sensor, integrator = self._sensor, self.integrator
        if sensor is None or integrator is None or not sensor.available():
            return
        while not self._stop.is_set():
            try:
                integrator.extend(sensor.read_pending())
            except EdgekitError as err:
                self._problem("sensor.read_failed", str(err.message))
                logger.warning("power sensor read failed: %s", err.message)
            self._stop.wait(self.config.power.sample_interval_s)

    def _telemetry_loop(self) -> None:
        while not self._stop.is_set():
            deadline = time.monotonic() + self._interval_s
            while not self._stop.is_set() and time.monotonic() < deadline:
                if self._interval_changed.wait(min(COMMAND_POLL_S, max(deadline - time.monotonic(), 0))):
                    self._interval_changed.clear()
                    deadline = time.monotonic() + self._interval_s
                if self._outbox and time.monotonic() >= self._outbox_retry_at:
                    self.retry_outbox()
            if self._stop.is_set():
                return
            try:
                self.publish_telemetry()
            except EdgekitError as err:
                logger.error("telemetry window not published: %s", err)

    def _open_window(self) -> None:
        """The next telemetry window starts now (by the wall clock, and by the steady one for its length)."""
        self._window_start, self._window_started_steady = datetime.now(timezone.utc), steady_s()

    def build_telemetry_window(self) -> dict[str, Any]:
        """Close the current window and return it as a telemetry.v1 message (without publishing)."""
        with self._telemetry_lock:
            window_mode = self.power_mode.label if self.power_mode is not None else None  # as at the window's start
            mode_changed = self._refresh_power_mode()
            window_end, ended_steady = datetime.now(timezone.utc), steady_s()
            window_start, stepped = window_bounds(self._window_start, window_end, ended_steady - self._window_started_steady)
            serving = self.server.take_window()
            power = self.integrator.take_window() if self.integrator is not None else None
            with self._problems_lock:
                problems, self._problems = self._problems, []
            problems.extend(problem for problem in self._current_problems() if problem.code.startswith("spool."))
            try:
                state = self.state_reader.read()
            except EdgekitError as err:
                state = None
                problems.append(TelemetryProblem("device_state.read_failed", err.message))
            if mode_changed is not None:
                problems.append(mode_changed)
            if stepped is not None:
                problems.append(stepped)
            if serving.errors:
                problems.append(TelemetryProblem("inference.failed", f"{serving.errors} inference(s) failed in the window"))
            if power is None:
                from edgekit_runtime.sensors import PowerStats

                power = PowerStats(None, None, None, 0.0, 0, "none", reason="no power sensor started")
            message = build_telemetry(
                seq=self._spool.last_seq() + 1 if self._spool is not None else 1,  # taken when stored
                device=self.config.device_id,
                fleet=self.config.fleet,
                window_start=window_start,
                window_end=window_end,
                latency=serving.latency,
                power=power,
                device_state=state,
                failed_inferences=serving.errors,
                queue_latency=serving.queue,
                bundle=self._bundle_ref(),
                rss_mb=rss_mb(),
                errors=problems,
                spool_dropped=self._spool.dropped_total() if self._spool is not None else 0,
                spool_backlog=self._spool.backlog() if self._spool is not None else 0,
                power_mode=window_mode,
                model=self.models.default.name,
                models=self._model_windows(serving) if self.config.models is not None else None,
                batches=batches_field(serving.batch_sizes),
            )
            self._window_start, self._window_started_steady = window_end, ended_steady
            return message

    def _model_windows(self, default_window: Any) -> list[dict[str, Any]]:
        """Every model's window (the default model's already taken as ``default_window``) for ``models``."""
        entries = []
        for slot in self.models.slots():
            window = default_window if slot is self.models.default else slot.server.take_window()
            latency, served = window.latency, slot.served
            entries.append({
                "model": slot.name, "count": window.requests, "errors": window.errors,
                "bundle": None if served is None else {"id": served.bundle_id[:128], "sha256": served.manifest_sha256},
                "p50_ms": None if latency is None else round(latency.p50_ms, 4),
                "p99_ms": None if latency is None else round(latency.p99_ms, 4),
                "throughput_per_s": round(window.throughput_per_s, 4), "memory_mb": slot.deployer.held_mb,
                "queue_p50_ms": None if window.queue is None else round(window.queue.p50_ms, 4),
                "queue_p99_ms": None if window.queue is None else round(window.queue.p99_ms, 4),
                "batches": batches_field(window.batch_sizes),
            })  # fmt: skip
        return entries

    def publish_telemetry(self) -> dict[str, Any]:
        """Close the window and publish it (spooled until the broker acknowledges it).

        The window's ``seq`` is taken when it is stored; while the spool cannot be written it waits in
        memory (see the module docstring) and the returned message's ``seq`` is only a guess."""
        message = self.build_telemetry_window()
        with self._events_lock:
            if self._link is not None and self._link_started:
                self._send("telemetry", message)
        return message

    def _probe_loop(self) -> None:
        probe = self.config.probe
        if probe is None:
            return
        seed = 0
        while not self._stop.wait(probe.interval_s):
            seed += 1
            for slot in self.models.slots():  # every model of the repository, each on its own server
                signature = slot.server.signature
                if signature is None:
                    continue
                try:
                    slot.server.infer(synthetic_feeds(signature, probe.dims, seed=seed))
                except EdgekitError as err:
                    self._problem("probe.failed", err.message if slot.key is None else f"model {slot.key}: {err.message}")
