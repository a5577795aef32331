"""What each rule kind checks: one function per kind, looked up in :data:`CONDITIONS`.

A condition reads a :class:`FleetSnapshot` (the devices as the store judges them, the newest window the
collector stored for each device, the recent rollouts) and returns a :class:`Breach` for every device (or
rollout) breaching the rule right now. The engine (:mod:`edgekit.fleet.alerts.engine`) turns breaches that
last ``for`` into firing alerts.

Window figures (p99, errors, temperature, spool problems) are judged only for devices that are heard from
(``online`` or another state their agent reported): an offline device's last window is old news, and the
``device_state`` rules speak for it.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from edgekit.fleet.alerts.rules import (
    DeviceStateRule,
    ErrorRateAboveRule,
    P99AboveFleetMedianRule,
    P99AboveRule,
    RolloutFailedRule,
    SpoolDiskFullRule,
    TemperatureAboveRule,
)
from edgekit.fleet.store.base import DeviceSummary, TelemetryWindow

#: The telemetry problem code an agent puts in its windows while its spool cannot be written (disk full).
SPOOL_DISK_FULL_CODE = "spool.disk_full"
#: Device states whose newest window is not judged (it is not fresh).
SILENT_STATES = ("stale", "offline", "unknown")


@dataclass(frozen=True)
class WindowFigures:
    """What the alert rules need from a device's newest telemetry window (kept per device by the engine)."""

    seq: int
    inferences: int
    errors: int
    problem_codes: frozenset[str]
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None

    @classmethod
    def of(cls, window: TelemetryWindow) -> WindowFigures:
        problems = window.payload.get("errors") if isinstance(window.payload, dict) else None
        codes = frozenset(str(p.get("code")) for p in problems if isinstance(p, dict)) if isinstance(problems, list) else frozenset()
        return cls(window.seq, window.count, window.errors, codes, window.window_start, window.window_end)

    def replaces(self, held: WindowFigures) -> bool:
        """Whether these figures are newer than ``held``, the same device's: a higher (or the same) seq, or a window
        that starts after the held one ended (a device whose seqs started again: a reflash, a new spool; as the
        store's ``device_latest`` takes it)."""
        if self.seq >= held.seq:
            return True
        return self.window_start is not None and held.window_end is not None and self.window_start >= held.window_end


@dataclass(frozen=True)
class FleetSnapshot:
    """The fleet as one evaluation sees it."""

    now: dt.datetime
    devices: Sequence[DeviceSummary]
    windows: Mapping[tuple[str, str], WindowFigures] = field(default_factory=dict)
    rollouts: Sequence[dict[str, Any]] = ()


@dataclass(frozen=True)
class Breach:
    """One device (or rollout) breaching a rule now. ``subject`` is the device id, or ``rollout/<id>``;
    ``device`` is the device the alert's store event goes on (None: no event)."""

    fleet: str
    subject: str
    device: str | None
    value: float | str | None
    threshold: float | str | None
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def _heard(device: DeviceSummary) -> bool:
    return device.state not in SILENT_STATES


def device_state_breaches(rule: DeviceStateRule, snapshot: FleetSnapshot) -> list[Breach]:
    found, states = [], "|".join(rule.states)
    for d in snapshot.devices:
        if d.state in rule.states:
            seen = d.last_seen.isoformat() if d.last_seen else None
            found.append(Breach(d.fleet, d.device, d.device, d.state, states, f"{d.device} is {d.state} (last seen {seen or 'never'})",
                                {"last_seen": seen, "interval_s": d.interval_s}))  # fmt: skip
    return found


def p99_breaches(rule: P99AboveRule, snapshot: FleetSnapshot) -> list[Breach]:
    return [Breach(d.fleet, d.device, d.device, d.p99_ms, rule.threshold_ms,
                   f"{d.device} p99 {d.p99_ms:.1f} ms > {rule.threshold_ms:g} ms", {"bundle_id": d.bundle_id})
            for d in snapshot.devices if _heard(d) and d.p99_ms is not None and d.p99_ms > rule.threshold_ms]  # fmt: skip


def p99_fleet_median_breaches(rule: P99AboveFleetMedianRule, snapshot: FleetSnapshot) -> list[Breach]:
    by_bundle: dict[tuple[str, str, str], list[DeviceSummary]] = defaultdict(list)
    for d in snapshot.devices:
        if _heard(d) and d.p99_ms is not None and d.bundle_id:
            by_bundle[(d.fleet, d.bundle_id, d.target or "")].append(d)
    found = []
    for (fleet, bundle, target), devices in sorted(by_bundle.items()):
        if len(devices) < rule.min_devices:
            continue
        median = statistics.median(d.p99_ms for d in devices)  # type: ignore[misc]
        limit = rule.factor * median
        for d in devices:
            if d.p99_ms > limit and d.p99_ms >= rule.min_p99_ms:  # type: ignore[operator]
                found.append(Breach(fleet, d.device, d.device, d.p99_ms, round(limit, 3),
                                    f"{d.device} p99 {d.p99_ms:.1f} ms > {rule.factor:g} x the median {median:.1f} ms of "
                                    f"{len(devices)} devices on {bundle}" + (f" ({target})" if target else ""),
                                    {"bundle_id": bundle, "target": target or None, "median_p99_ms": median,
                                     "devices": len(devices)}))  # fmt: skip
    return found


def error_rate_breaches(rule: ErrorRateAboveRule, snapshot: FleetSnapshot) -> list[Breach]:
    found = []
    for d in snapshot.devices:
        figures = snapshot.windows.get((d.fleet, d.device))
        attempts = figures.inferences + figures.errors if figures is not None else 0
        if not _heard(d) or attempts < rule.min_inferences:
            continue
        share = figures.errors / attempts  # type: ignore[union-attr]
        if share > rule.share:
            found.append(Breach(d.fleet, d.device, d.device, round(share, 6), rule.share,
                                f"{d.device}: {figures.errors} of {attempts} inferences failed "  # type: ignore[union-attr]
                                f"({share:.1%} > {rule.share:.1%})", {"seq": figures.seq}))  # fmt: skip
    return found


def temperature_breaches(rule: TemperatureAboveRule, snapshot: FleetSnapshot) -> list[Breach]:
    return [Breach(d.fleet, d.device, d.device, d.temperature_max_c, rule.threshold_c,
                   f"{d.device} at {d.temperature_max_c:.1f} C > {rule.threshold_c:g} C")
            for d in snapshot.devices
            if _heard(d) and d.temperature_max_c is not None and d.temperature_max_c > rule.threshold_c]  # fmt: skip


def spool_disk_full_breaches(rule: SpoolDiskFullRule, snapshot: FleetSnapshot) -> list[Breach]:
    found = []
    for d in snapshot.devices:
        figures = snapshot.windows.get((d.fleet, d.device))
        if _heard(d) and figures is not None and SPOOL_DISK_FULL_CODE in figures.problem_codes:
            found.append(Breach(d.fleet, d.device, d.device, SPOOL_DISK_FULL_CODE, None,
                                f"{d.device} cannot write its telemetry spool: disk full", {"seq": figures.seq}))  # fmt: skip
    return found


def rollout_failed_breaches(rule: RolloutFailedRule, snapshot: FleetSnapshot) -> list[Breach]:
    found = []
    for record in snapshot.rollouts:
        if record.get("state") not in rule.states:
            continue
        ended = record.get("finished_at") or record.get("updated_at")
        try:
            ended_at = dt.datetime.fromisoformat(ended) if isinstance(ended, str) else None
        except ValueError:
            ended_at = None
        if ended_at is None or (snapshot.now - ended_at).total_seconds() > rule.within_s:
            continue
        outcomes: dict[str, str] = record.get("outcomes") or {}
        failed = sorted(d for d, o in outcomes.items() if o not in ("succeeded", "already_current", "pending", "skipped_offline", "deploying"))
        first = failed[0] if failed else next(iter(record.get("devices") or ()), None)
        found.append(Breach(record.get("fleet", ""), f"rollout/{record.get('rollout_id')}", first, record.get("state"),
                            "|".join(rule.states),
                            f"rollout {record.get('rollout_id')} of {record.get('bundle_id')} {record.get('state')}: "
                            f"{len(failed)} device(s) failed" + (f" ({record['reason']})" if record.get("reason") else ""),
                            {"rollout_id": record.get("rollout_id"), "bundle_id": record.get("bundle_id"),
                             "failed_devices": failed[:20]}))  # fmt: skip
    return found


#: Rule kind -> its condition (a test checks every kind of :data:`~edgekit.fleet.alerts.rules.RULE_KINDS` has one).
CONDITIONS: dict[str, Callable[[Any, FleetSnapshot], list[Breach]]] = {
    "device_state": device_state_breaches,
    "p99_above": p99_breaches,
    "p99_above_fleet_median": p99_fleet_median_breaches,
    "error_rate_above": error_rate_breaches,
    "temperature_above": temperature_breaches,
    "spool_disk_full": spool_disk_full_breaches,
    "rollout_failed": rollout_failed_breaches,
}

__all__ = ["Breach", "CONDITIONS", "FleetSnapshot", "SPOOL_DISK_FULL_CODE", "WindowFigures"]
