"""One simulated device: the messages a real agent publishes, with synthetic numbers.

:class:`VirtualAgent` holds no socket. It builds its messages with the runtime's own builders
(``build_telemetry``, ``build_status``, ``build_event``: schema-validated, identical in shape to a
real agent's), answers commands the way :class:`~edgekit_runtime.agent.mqtt.MqttLink` and the
agent service do (JSON and ``command.v1`` checks, ``command_rejected``, duplicate ids ignored,
``pong``, ``interval_changed``, the deploy steps and results of :mod:`edgekit_runtime.agent.ota`),
and hands every message to a ``send`` callback. Timed steps (a deploy's progress, its health
watch) go through a ``schedule`` callback, so one loop thread can drive hundreds of devices.

Latency, power, temperature and load are SYNTHETIC (see :mod:`edgekit.fleet.sim.profiles`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from edgekit.fleet.sim.profiles import SyntheticProfile
from edgekit.fleet.sim.unchecked_telemetry import unchecked_telemetry
from edgekit_runtime.agent.telemetry import (
    BundleRef,
    TelemetryProblem,
    build_event,
    build_status,
    build_telemetry,
)
from edgekit_runtime.agent.topics import DeviceTopics, TopicKind
from edgekit_runtime.schemas import schema_problems
from edgekit_runtime.sensors.base import DeviceState, PowerStats
from edgekit_runtime.timing import LatencyStats

logger = logging.getLogger(__name__)

#: ``send(kind, message, retain)`` publishes one message on the device's topic of that kind.
SendFn = Callable[[TopicKind, dict[str, Any], bool], None]
#: ``schedule(delay_s, action)`` runs ``action`` on the loop thread after ``delay_s``.
ScheduleFn = Callable[[float, Callable[[], None]], None]

SIM_AGENT_VERSION = "sim-1"
POWER_SOURCE = "synthetic"
_REMEMBERED_COMMAND_IDS = 256
_Z90, _Z99 = 1.2816, 2.3263  # standard normal quantiles: a log-normal's p90 and p99 from its median


@dataclass(frozen=True)
class BundleBehaviour:
    """How a bundle behaves on simulated devices: slower, failing inferences, or a failing self-check."""

    latency_factor: float = 1.0
    error_rate: float = 0.0
    self_check_passes: bool = True
    power_factor: float = 1.0


HEALTHY = BundleBehaviour()


@dataclass(frozen=True)
class SyntheticWindow:
    """The figures of one simulated telemetry window."""

    latency: LatencyStats | None
    errors: int
    power: PowerStats
    state: DeviceState


@dataclass(frozen=True)
class DeployTiming:
    """A simulated deploy: ``step_s`` between progress events, then a health watch of ``watch_s``
    that rolls back when the error rate is above ``max_error_rate`` (the agent's ``health`` config)."""

    step_s: float = 0.05
    watch_s: float = 1.0
    max_error_rate: float = 0.05


class VirtualAgent:
    """A simulated edgekit agent; every method runs on the loop thread that owns it."""

    def __init__(
        self,
        fleet: str,
        device: str,
        profile: SyntheticProfile,
        *,
        send: SendFn,
        schedule: ScheduleFn,
        bundle: BundleRef | None = None,
        behaviours: Mapping[str, BundleBehaviour] | None = None,
        deploy_timing: DeployTiming = DeployTiming(),
        verify_downloads: bool = False,
        interval_s: float = 10.0,
        seed: int | None = None,
        agent_version: str = SIM_AGENT_VERSION,
        load: float | None = None,
        validate_every: int = 1,
    ) -> None:
        self.topics = DeviceTopics(fleet, device)
        self.profile = profile
        self.bundle = bundle
        self.previous_bundle: BundleRef | None = None
        self.behaviours = dict(behaviours or {})
        self.deploy_timing = deploy_timing
        self.verify_downloads = verify_downloads
        self.interval_s = float(interval_s)
        self.agent_version = agent_version
        self.load = load
        #: 1: every window through the runtime's validating builder; N: the first and every Nth, the others
        #: through :func:`~edgekit.fleet.sim.unchecked_telemetry.unchecked_telemetry` (same output, no schema check)
        self.validate_every = max(1, int(validate_every))
        self.seq = 0
        self._send = send
        self._schedule = schedule
        self._rng = random.Random(seed if seed is not None else hash((fleet, device)))
        self._speed = math.exp(self._rng.gauss(0.0, 0.08))  # this unit is a little faster or slower
        self._phase = self._rng.uniform(0.0, 2.0 * math.pi)
        self._busy = False
        self._watch: dict[str, int] | None = None
        self._recent_command_ids: OrderedDict[str, None] = OrderedDict()

    # -- messages -----------------------------------------------------------------------------------

    @property
    def fleet(self) -> str:
        return self.topics.fleet

    @property
    def device(self) -> str:
        return self.topics.device

    def status(self, state: str, reason: str | None = None) -> dict[str, Any]:
        return build_status(device=self.device, fleet=self.fleet, state=state, bundle=self.bundle,  # type: ignore[arg-type]
                            reason=reason, agent_version=self.agent_version)  # fmt: skip

    def event(self, kind: str, message: str, *, level: str = "info", command_id: str | None = None,
              **details: Any) -> dict[str, Any]:  # fmt: skip
        return build_event(device=self.device, fleet=self.fleet, kind=kind, message=message, level=level,  # type: ignore[arg-type]
                           command_id=command_id, details=details or None, agent_version=self.agent_version)  # fmt: skip

    def started_event(self) -> dict[str, Any]:
        """What a starting agent reports: the bundle it serves, plus (simulator only) its target."""
        if self.bundle is None:
            return self.event("no_bundle", "no working bundle; waiting for a deploy", level="warning",
                              target=self.profile.target, synthetic=True)  # fmt: skip
        return self.event("serving", f"serving bundle {self.bundle.id}", bundle=self.bundle.id,
                          target=self.profile.target, synthetic=True)  # fmt: skip

    def utilisation(self, at: datetime) -> float:
        """Load in [0.05, 1]: a daily cycle per device (or the fixed ``load``) plus noise (synthetic)."""
        day_s = at.timestamp() % 86400.0
        wave = self.load if self.load is not None else 0.55 + 0.3 * math.sin(2.0 * math.pi * day_s / 86400.0 + self._phase)
        return min(1.0, max(0.05, wave + self._rng.gauss(0.0, 0.05)))

    def sample(self, window_start: datetime, window_end: datetime) -> SyntheticWindow:
        """The synthetic figures of one window (advances this device's random state)."""
        profile, behaviour = self.profile, self._behaviour()
        window_s = max((window_end - window_start).total_seconds(), 1e-3)
        load = self.utilisation(window_end)
        expected = profile.inferences_per_s * load * window_s
        attempts = max(0, int(round(self._rng.gauss(expected, math.sqrt(expected) if expected > 0 else 0.0))))
        errors = sum(1 for _ in range(attempts) if self._rng.random() < behaviour.error_rate) if behaviour.error_rate else 0
        completed = attempts - errors
        latency = None
        if completed > 0:
            sigma = profile.latency_sigma
            p50 = profile.latency_p50_ms * self._speed * behaviour.latency_factor * (1.0 + 0.3 * load)
            p50 *= math.exp(self._rng.gauss(0.0, 0.03))
            latency = LatencyStats(count=completed, mean_ms=p50 * math.exp(sigma * sigma / 2.0),
                                   min_ms=p50 * math.exp(-2.0 * sigma), p50_ms=p50, p90_ms=p50 * math.exp(_Z90 * sigma),
                                   p99_ms=p50 * math.exp(_Z99 * sigma), max_ms=p50 * math.exp(2.8 * sigma), std_ms=p50 * sigma)  # fmt: skip
        span_mw = profile.active_power_mw - profile.idle_power_mw
        mean_mw = (profile.idle_power_mw + span_mw * load) * behaviour.power_factor * self._rng.uniform(0.97, 1.03)
        power = PowerStats(mean_mw=mean_mw, max_mw=mean_mw * 1.15, energy_mj=mean_mw * window_s, duration_s=window_s,
                           samples=max(1, int(window_s * 10)), source=POWER_SOURCE)  # fmt: skip
        temperature_c = profile.ambient_c + profile.hot_rise_c * load + self._rng.gauss(0.0, 0.5)
        state = DeviceState(
            temperatures_c={"soc": round(temperature_c, 2)},
            memory_used_mb=profile.memory_total_mb * (0.3 + 0.1 * load),
            memory_total_mb=profile.memory_total_mb,
            cpu_load_pct=min(100.0, 15.0 + 60.0 * load),
            gpu_load_pct=min(100.0, 80.0 * load) if profile.has_gpu else None,
        )
        return SyntheticWindow(latency=latency, errors=errors, power=power, state=state)

    def telemetry(self, window_start: datetime, window_end: datetime) -> dict[str, Any]:
        """The next ``telemetry.v1`` window (synthetic numbers), built and validated by the runtime."""
        window = self.sample(window_start, window_end)
        completed = window.latency.count if window.latency is not None else 0
        problems = [TelemetryProblem("inference.failed", f"{window.errors} inference(s) failed in the window")] if window.errors else []
        if self._watch is not None:
            self._watch["requests"] += completed
            self._watch["errors"] += window.errors
        self.seq += 1
        if self.validate_every > 1 and (self.seq - 1) % self.validate_every:
            return unchecked_telemetry(seq=self.seq, device=self.device, fleet=self.fleet, window_start=window_start,
                                       window_end=window_end, latency=window.latency, power=window.power,
                                       device_state=window.state, failed_inferences=window.errors, bundle=self.bundle,
                                       rss_mb=180.0, errors=problems, agent_version=self.agent_version)  # fmt: skip
        return build_telemetry(seq=self.seq, device=self.device, fleet=self.fleet, window_start=window_start,
                               window_end=window_end, latency=window.latency, power=window.power, device_state=window.state,
                               failed_inferences=window.errors, bundle=self.bundle, rss_mb=180.0, errors=problems,
                               agent_version=self.agent_version)  # fmt: skip

    def _behaviour(self) -> BundleBehaviour:
        return self.behaviours.get(self.bundle.id, HEALTHY) if self.bundle is not None else HEALTHY

    # -- commands -----------------------------------------------------------------------------------

    def handle_command_payload(self, payload: bytes) -> None:
        """A message on ``.../cmd``: checked like the real link does, then carried out."""
        try:
            command = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._reject(f"command payload is not valid UTF-8 JSON: {exc}", payload, None)
            return
        command_id = command.get("id") if isinstance(command, dict) and isinstance(command.get("id"), str) else None
        problems = schema_problems(command, "command.v1")
        if problems:
            self._reject(f"command does not match schema command.v1: {'; '.join(problems[:5])}", payload, command_id)
            return
        if command["id"] in self._recent_command_ids:
            logger.info("%s: command %s delivered again; ignoring the duplicate", self.device, command["id"])
            return
        self._recent_command_ids[command["id"]] = None
        while len(self._recent_command_ids) > _REMEMBERED_COMMAND_IDS:
            self._recent_command_ids.popitem(last=False)
        name, args, command_id = command["command"], command.get("args") or {}, command["id"]
        if name == "ping":
            self._emit(self.event("pong", "pong", command_id=command_id,
                                  bundle=self.bundle.to_dict() if self.bundle else None))  # fmt: skip
        elif name == "set_interval":
            previous_s, self.interval_s = self.interval_s, float(args["interval_s"])
            self._emit(self.event("interval_changed", f"telemetry interval {previous_s:g} s -> {self.interval_s:g} s",
                                  command_id=command_id, interval_s=self.interval_s, previous_interval_s=previous_s))  # fmt: skip
        elif name == "deploy":
            self._deploy(args, command_id)
        elif name == "rollback":
            self._rollback(args.get("bundle_id"), command_id)

    def _emit(self, message: dict[str, Any]) -> None:
        self._send("events", message, False)

    def _publish_status(self) -> None:
        self._send("status", self.status("online"), True)

    def _reject(self, problem: str, payload: bytes, command_id: str | None) -> None:
        excerpt = payload[:200].decode("utf-8", errors="replace")
        self._emit(self.event("command_rejected", problem, level="error", command_id=command_id,
                              topic=self.topics.cmd, payload_excerpt=excerpt))  # fmt: skip

    def _progress(self, command_id: str, step: str, message: str, **details: Any) -> None:
        self._emit(self.event("deploy_progress", message, command_id=command_id, step=step, **details))

    def _result(self, command_id: str, outcome: str, message: str, *, level: str = "info", **details: Any) -> None:
        self._emit(self.event("deploy_result", message, level=level, command_id=command_id, outcome=outcome, **details))

    def _deploy(self, args: Mapping[str, Any], command_id: str) -> None:
        url, bundle_id, sha256 = str(args["url"]), str(args["bundle_id"]), str(args["sha256"])
        if self._busy:
            self._result(command_id, "failed", "another deploy or rollback is in progress; try again later",
                         level="error", step="queued", url=url)  # fmt: skip
            return
        self._busy = True
        self._progress(command_id, "started", f"deploying {url}", url=url, bundle_id=bundle_id)
        problem = _check_download(url, sha256) if self.verify_downloads else None
        if problem is not None:
            self._busy = False
            self._result(command_id, "failed", f"deploy of {url} failed at download: {problem}", level="error",
                         step="download", error=problem)  # fmt: skip
            return
        new_bundle = BundleRef(bundle_id[:128], sha256)
        behaviour = self.behaviours.get(bundle_id, HEALTHY)
        steps: list[tuple[str, str, dict[str, Any]]] = [
            ("downloaded", "fetched the bundle, sha256 verified", {"sha256": sha256, "sha256_verified": True}),
            ("signature_verified", "signature verified", {"fingerprint": "simulated"}),
            ("files_verified", "files verified", {}),
        ]
        delay = self.deploy_timing.step_s
        for step, message, details in steps:
            self._schedule(delay, lambda s=step, m=message, d=details: self._progress(command_id, s, m, **d))
            delay += self.deploy_timing.step_s
        if not behaviour.self_check_passes:
            self._schedule(delay, lambda: self._fail_self_check(command_id, url))
            return
        self._schedule(delay, lambda: self._switch(command_id, new_bundle))

    def _fail_self_check(self, command_id: str, url: str) -> None:
        self._busy = False
        message = "golden outputs differ from the bundle's reference outputs (simulated self-check failure)"
        self._result(command_id, "failed", f"deploy of {url} failed at self_check: {message}", level="error",
                     step="self_check", error=message)  # fmt: skip

    def _switch(self, command_id: str, new_bundle: BundleRef) -> None:
        self._progress(command_id, "self_check_passed", "self check passed", passed=True)
        if self.bundle is not None and self.bundle.id == new_bundle.id:
            self._busy = False
            self._result(command_id, "succeeded", f"{new_bundle.id} is already the current bundle",
                         bundle=new_bundle.id, unchanged=True)  # fmt: skip
            return
        self.previous_bundle, self.bundle = self.bundle, new_bundle
        self._publish_status()
        self._progress(command_id, "switched", f"now serving {new_bundle.id}", bundle=new_bundle.id,
                       previous=None if self.previous_bundle is None else self.previous_bundle.id)  # fmt: skip
        timing = self.deploy_timing
        self._progress(command_id, "watching", f"watching {new_bundle.id} for {timing.watch_s:g} s",
                       window_s=timing.watch_s, max_error_rate=timing.max_error_rate)  # fmt: skip
        self._watch = {"requests": 0, "errors": 0}
        self._schedule(timing.watch_s, lambda: self._end_watch(command_id, new_bundle))

    def _end_watch(self, command_id: str, new_bundle: BundleRef) -> None:
        watch, self._watch = self._watch or {"requests": 0, "errors": 0}, None
        attempts = watch["requests"] + watch["errors"]
        error_rate = watch["errors"] / attempts if attempts else None
        health = {**watch, "error_rate": error_rate, "self_check_passed": True, "window_s": self.deploy_timing.watch_s,
                  "interrupted": False}  # fmt: skip
        self._busy = False
        if error_rate is not None and error_rate > self.deploy_timing.max_error_rate and self.previous_bundle is not None:
            reason = f"error rate {error_rate:.1%} over {attempts} request(s) is above {self.deploy_timing.max_error_rate:.1%}"
            self._progress(command_id, "rolling_back", f"{new_bundle.id} is unhealthy ({reason}); rolling back",
                           health=health)  # fmt: skip
            self.bundle, self.previous_bundle = self.previous_bundle, self.bundle
            self._publish_status()
            self._result(command_id, "rolled_back", f"rolled back to {self.bundle.id}: {new_bundle.id} was unhealthy ({reason})",
                         level="warning", bundle=self.bundle.id, failed_bundle=new_bundle.id, health=health)  # fmt: skip
            return
        self._result(command_id, "succeeded", f"deployed {new_bundle.id}", bundle=new_bundle.id,
                     bundle_id=new_bundle.id, health=health)  # fmt: skip

    def _rollback(self, bundle_id: object, command_id: str) -> None:
        def failed(message: str) -> None:
            self._emit(self.event("rollback_result", f"rollback failed: {message}", level="error",
                                  command_id=command_id, outcome="failed", error=message))  # fmt: skip

        if self._busy:
            self._emit(self.event("rollback_result", "a deploy or rollback is in progress; try again later",
                                  level="error", command_id=command_id, outcome="failed"))  # fmt: skip
            return
        if self.previous_bundle is None:
            failed(f"no previous bundle on {self.device} to roll back to")
            return
        if bundle_id is not None and bundle_id != self.previous_bundle.id:
            failed(f"cannot roll back to bundle {bundle_id!r}: the previous bundle is {self.previous_bundle.id!r}")
            return
        from_id = self.bundle.id if self.bundle else None
        self.bundle, self.previous_bundle = self.previous_bundle, self.bundle
        self._publish_status()
        self._emit(self.event("rollback_result", f"rolled back from {from_id} to {self.bundle.id}", command_id=command_id,
                              outcome="succeeded", bundle=self.bundle.id, previous_bundle=from_id))  # fmt: skip


def _check_download(url: str, sha256: str) -> str | None:
    """For ``file://`` URLs: the file (tar) or directory (its manifest.json) must hash to ``sha256``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file":
        return None  # the simulator fetches nothing over the network
    path = Path(urllib.parse.unquote(parts.path))
    target = path / "manifest.json" if path.is_dir() else path
    if not target.is_file():
        return f"{path} does not exist"
    actual = hashlib.sha256(target.read_bytes()).hexdigest()
    if actual != sha256:
        return f"sha256 of {target} is {actual}, but the deploy command expects {sha256}"
    return None
