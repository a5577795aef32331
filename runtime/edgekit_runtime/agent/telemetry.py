"""Builders for the messages a device publishes: telemetry windows, status, events.

Each builder takes typed records (:class:`~edgekit_runtime.timing.LatencyStats`,
:class:`~edgekit_runtime.sensors.base.PowerStats`, :class:`~edgekit_runtime.sensors.base.DeviceState`)
and returns a plain dict that validates against its schema in :mod:`edgekit_runtime.schemas`.
Nothing is estimated: a figure the device did not measure is ``None`` (and ``power.reason`` says
why power is missing).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.topics import TelemetryError, validate_id
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.sensors.base import energy_per_inference_mj

if TYPE_CHECKING:
    from edgekit_runtime.sensors.base import DeviceState, PowerStats
    from edgekit_runtime.timing import LatencyStats

TELEMETRY_SCHEMA = "edgekit.telemetry/1"
STATUS_SCHEMA = "edgekit.status/1"
EVENT_SCHEMA = "edgekit.event/1"
COMMAND_SCHEMA = "edgekit.command/1"

#: Event kinds the agent itself emits; others may add kinds matching ``^[a-z][a-z0-9_]*$``.
EVENT_DEPLOY_RESULT = "deploy_result"
EVENT_ROLLBACK_RESULT = "rollback_result"
EVENT_INTERVAL_CHANGED = "interval_changed"
EVENT_COMMAND_REJECTED = "command_rejected"
EVENT_COMMAND_FAILED = "command_failed"
EVENT_PONG = "pong"
EVENT_ERROR = "error"
EVENT_THREAD_RESTARTED = "thread_restarted"

MAX_ERRORS = 64
MAX_ERROR_MESSAGE_CHARS = 1024
MAX_EVENT_MESSAGE_CHARS = 2048
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CODE_RE = re.compile(r"^[a-z][a-z0-9_.]*$")

EventLevel = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class BundleRef:
    """The bundle a device runs: its id and the sha256 of its manifest (lowercase hex)."""

    id: str
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not 1 <= len(self.id) <= 128:
            raise TelemetryError(f"bundle id must be a string of 1-128 characters, got {self.id!r}")
        if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
            raise TelemetryError(
                f"bundle {self.id!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}",
                hint="use the manifest digest from edgekit_runtime.hashing (hexdigest())",
            )

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "sha256": self.sha256}


@dataclass(frozen=True)
class TelemetryProblem:
    """One entry of a telemetry message's ``errors`` list, e.g. ``("sensor.read_failed", "...")``."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or len(self.code) > 64 or not _CODE_RE.match(self.code):
            raise TelemetryError(
                f"telemetry error code {self.code!r} is invalid",
                hint="use lowercase words joined by '_' or '.', at most 64 characters (e.g. 'sensor.read_failed')",
            )

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": _truncate(str(self.message), MAX_ERROR_MESSAGE_CHARS)}


def utc_timestamp(moment: datetime | None = None) -> str:
    """``moment`` (timezone-aware; default now) as ISO-8601 UTC with microseconds and a ``Z``."""
    if moment is None:
        moment = datetime.now(timezone.utc)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise TelemetryError(
            f"timestamp {moment.isoformat()} has no time zone",
            hint="use datetime.now(timezone.utc) or attach tzinfo",
        )
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_message(message: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON; NaN and infinities are refused (JSON has no spelling for them)."""
    try:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError as exc:
        raise TelemetryError(f"message cannot be encoded as JSON: {exc}",
                             hint="replace non-finite numbers with None before building the message") from exc  # fmt: skip


def build_telemetry(
    *,
    seq: int,
    device: str,
    fleet: str,
    window_start: datetime,
    window_end: datetime,
    latency: LatencyStats | None,
    power: PowerStats,
    device_state: DeviceState | None,
    failed_inferences: int = 0,
    queue_latency: LatencyStats | None = None,
    bundle: BundleRef | None = None,
    rss_mb: float | None = None,
    errors: Sequence[TelemetryProblem] = (),
    spool_dropped: int = 0,
    spool_backlog: int = 0,
    agent_version: str = AGENT_VERSION,
    power_mode: str | None = None,
    model: str | None = None,
    models: Sequence[Mapping[str, Any]] | None = None,
    batches: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``telemetry.v1`` message for the window ``[window_start, window_end]``.

    ``model`` (optional) names the model ``bundle`` and ``latency`` are for; ``models`` (optional) lists
    every model's window on an agent serving several (:meth:`ModelSlot <edgekit_runtime.agent.repository>`).

    ``batches`` (optional, :func:`batches_field`) counts the runner calls by batch size.

    ``power_mode`` (optional, left out when ``None``) is the mode the window was measured in
    (:attr:`PowerModeState.label`).

    ``latency`` summarises the inferences completed in the window (``None`` when there were none);
    ``failed_inferences`` counts the ones that raised; ``queue_latency`` is time spent waiting before
    inference when the agent queues requests. ``device_state`` is ``None`` when it could not be read
    (memory and load are then null; put the reason in ``errors``). ``throughput_per_s`` is completed
    inferences over the window's length.
    """
    _check_counter("seq", seq, minimum=1)
    for label, value in (("failed_inferences", failed_inferences), ("spool_dropped", spool_dropped),
                         ("spool_backlog", spool_backlog)):  # fmt: skip
        _check_counter(label, value, minimum=0)
    start, end = utc_timestamp(window_start), utc_timestamp(window_end)
    duration_s = (window_end - window_start).total_seconds()
    if duration_s < 0:
        raise TelemetryError(f"telemetry window ends ({end}) before it starts ({start})",
                             hint="pass window_start <= window_end")  # fmt: skip
    count = latency.count if latency is not None else 0
    implausible: list[TelemetryProblem] = []  # readings a sensor cannot have meant: left out, said in errors
    power, device_state = _plausible_power(power, implausible), _plausible_state(device_state, implausible)

    message: dict[str, Any] = {
        "schema": TELEMETRY_SCHEMA,
        "seq": seq,
        "device": validate_id(device, "device id"),
        "fleet": validate_id(fleet, "fleet id"),
        "agent_version": agent_version,
        "bundle": bundle.to_dict() if bundle is not None else None,
        "window": {"start": start, "end": end},
        "latency": {
            "count": count,
            "errors": failed_inferences,
            **_latency_fields(latency),
            "queue_p50_ms": _finite(queue_latency.p50_ms) if queue_latency is not None else None,
            "queue_p99_ms": _finite(queue_latency.p99_ms) if queue_latency is not None else None,
            "throughput_per_s": _finite(count / duration_s) if duration_s > 0 else None,
        },
        "power": {
            "mean_mw": _finite(power.mean_mw),
            "max_mw": _finite(power.max_mw),
            "energy_mj": _finite(power.energy_mj),
            "source": power.source or "unknown",
            "reason": power.reason,
        },
        "energy_per_inference_mj": _finite(energy_per_inference_mj(power, count)),
        **_device_state_fields(device_state, rss_mb),
        "errors": _error_list([*implausible, *errors]),
        "spool": {"dropped": spool_dropped, "backlog": spool_backlog},
    }
    if power_mode is not None:
        message["power_mode"] = power_mode
    if model is not None:
        message["model"] = model
    if models is not None:
        message["models"] = [dict(entry) for entry in models]
    if batches is not None:
        message["batches"] = dict(batches)
    validate_message(message, "telemetry.v1", what=f"telemetry message seq {seq}")
    return message


def batches_field(batch_sizes: Mapping[int, int]) -> dict[str, Any]:
    """The ``batches`` object of a window whose runner calls held ``batch_sizes`` (items -> calls)."""
    calls = sum(batch_sizes.values())
    items = sum(size * count for size, count in batch_sizes.items())
    return {"calls": calls, "mean_items": round(items / calls, 4) if calls else None,
            "sizes": {str(size): count for size, count in sorted(batch_sizes.items())}}  # fmt: skip


def build_status(
    *,
    device: str,
    fleet: str,
    state: Literal["online", "offline"],
    bundle: BundleRef | None = None,
    reason: str | None = None,
    at: datetime | None = None,
    agent_version: str = AGENT_VERSION,
    identity: Mapping[str, Any] | None = None,
    target: Mapping[str, Any] | None = None,
    power_mode: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``status.v1`` message (retained on the status topic; the offline one is also the will).

    ``identity``, ``target`` and ``power_mode`` (optional fields, left out when ``None``) come from
    :meth:`DeviceIdentity.to_dict`, :meth:`TargetDetection.to_status` and :meth:`PowerModeState.to_dict`
    in :mod:`edgekit_runtime.sensors`."""
    message: dict[str, Any] = {
        "schema": STATUS_SCHEMA,
        "state": state,
        "device": validate_id(device, "device id"),
        "fleet": validate_id(fleet, "fleet id"),
        "agent_version": agent_version,
        "at": utc_timestamp(at),
        "bundle": bundle.to_dict() if bundle is not None else None,
        "reason": reason,
    }
    for name, value in (("identity", identity), ("target", target), ("power_mode", power_mode)):
        if value is not None:
            message[name] = dict(value)
    validate_message(message, "status.v1", what=f"status message for device {device!r}")
    return message


def build_event(
    *,
    device: str,
    fleet: str,
    kind: str,
    message: str,
    level: EventLevel = "info",
    command_id: str | None = None,
    details: Mapping[str, Any] | None = None,
    at: datetime | None = None,
    event_id: str | None = None,
    agent_version: str = AGENT_VERSION,
) -> dict[str, Any]:
    """An ``event.v1`` message; ``event_id`` (random when not given) lets the collector drop duplicates."""
    event: dict[str, Any] = {
        "schema": EVENT_SCHEMA,
        "event_id": event_id or uuid.uuid4().hex,
        "device": validate_id(device, "device id"),
        "fleet": validate_id(fleet, "fleet id"),
        "agent_version": agent_version,
        "at": utc_timestamp(at),
        "kind": kind,
        "level": level,
        "message": _truncate(message, MAX_EVENT_MESSAGE_CHARS),
        "command_id": command_id,
    }
    if details is not None:
        event["details"] = dict(details)
    validate_message(event, "event.v1", what=f"event {kind!r}")
    return event


def _check_counter(label: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TelemetryError(f"telemetry {label} must be an int >= {minimum}, got {value!r}",
                             hint="seq comes from Spool.next_seq(); the counters from the spool and the runner")  # fmt: skip


def _finite(value: float | None) -> float | None:
    """``value`` as a float, or ``None`` when absent or not finite (JSON cannot carry NaN or inf)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


#: What a reading can be, by field: outside it a sensor misread (a signed shunt current, a counter that went
#: back, a thermal zone's 2147483647), and the reading is left out rather than losing the whole window.
PLAUSIBLE = {"power_mw": (0.0, 1e8), "energy_mj": (0.0, 1e12), "memory_mb": (0.0, 1e9), "load_pct": (0.0, 100.0),
             "temperature_c": (-60.0, 200.0)}  # fmt: skip


def _plausible(value: float | None, kind: str, where: str, problems: list[TelemetryProblem]) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    low, high = PLAUSIBLE[kind]
    if kind == "load_pct" and high < value <= high + 1.0:  # a rounding of two counters read apart
        return high
    if not low <= value <= high:
        problems.append(TelemetryProblem("sensor.implausible", f"{where} read {value:g}, outside {low:g} to {high:g}: left out"))
        return None
    return float(value)


def _plausible_power(power: PowerStats, problems: list[TelemetryProblem]) -> PowerStats:
    checked = {name: _plausible(getattr(power, name), kind, f"power.{name}", problems)
               for name, kind in (("mean_mw", "power_mw"), ("max_mw", "power_mw"), ("energy_mj", "energy_mj"))}  # fmt: skip
    if all(checked[name] == getattr(power, name) for name in checked):
        return power
    return dataclasses.replace(power, **checked)


def _plausible_state(state: DeviceState | None, problems: list[TelemetryProblem]) -> DeviceState | None:
    if state is None:
        return None
    temperatures = {zone: c for zone, c in state.temperatures_c.items()
                    if _plausible(c, "temperature_c", f"temperatures_c.{zone}", problems) is not None}  # fmt: skip
    return dataclasses.replace(
        state, temperatures_c=temperatures,
        memory_used_mb=_plausible(state.memory_used_mb, "memory_mb", "memory.used_mb", problems),
        memory_total_mb=_plausible(state.memory_total_mb, "memory_mb", "memory.total_mb", problems),
        cpu_load_pct=_plausible(state.cpu_load_pct, "load_pct", "cpu_load_pct", problems),
        gpu_load_pct=_plausible(state.gpu_load_pct, "load_pct", "gpu_load_pct", problems),
    )  # fmt: skip


def _latency_fields(latency: LatencyStats | None) -> dict[str, float | None]:
    names = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")
    if latency is None:
        return dict.fromkeys(names)
    return {name: _finite(getattr(latency, name)) for name in names}


def _device_state_fields(state: DeviceState | None, rss_mb: float | None) -> dict[str, Any]:
    if state is None:
        return {
            "temperatures_c": {},
            "memory": {"used_mb": None, "total_mb": None, "rss_mb": _finite(rss_mb)},
            "cpu_load_pct": None,
            "gpu_load_pct": None,
        }
    temperatures = {zone: float(c) for zone, c in state.temperatures_c.items() if math.isfinite(c)}
    return {
        "temperatures_c": temperatures,
        "memory": {
            "used_mb": _finite(state.memory_used_mb),
            "total_mb": _finite(state.memory_total_mb),
            "rss_mb": _finite(rss_mb),
        },
        "cpu_load_pct": _finite(state.cpu_load_pct),
        "gpu_load_pct": _finite(state.gpu_load_pct),
    }


def _error_list(errors: Sequence[TelemetryProblem]) -> list[dict[str, str]]:
    entries = [problem.to_dict() for problem in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        entries[-1] = {"code": "errors_truncated", "message": f"{len(errors) - MAX_ERRORS + 1} more errors left out"}
    return entries


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
