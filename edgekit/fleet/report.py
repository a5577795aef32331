"""Fleet status and reports from a store: per-device status, aggregates by bundle and target, the
before/after comparison of a rollout (devices that switched bundle, measured on each side of the switch),
and the records ``edgekit fleet deploy`` kept of its rollouts (waves, per-device outcomes and reasons).

Everything returns frozen records with ``to_json()``; the CLI (``edgekit fleet status|report``) and
the dashboard print or serve them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

from edgekit.fleet.errors import FleetError
from edgekit.fleet.ingest import EARLIEST_TIME, LATEST_TIME
from edgekit.fleet.rollout_state import RolloutRecord, StoreRolloutLog
from edgekit.fleet.store.postgres import redact
from edgekit.fleet.store.base import Aggregate, BundleSpan, DeviceSummary, FleetStore, ModelAggregate

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Figures a rollout comparison puts side by side (lower is better for all of them).
COMPARED_FIGURES = ("p50_ms", "p99_ms", "power_mean_mw", "energy_per_inference_mj", "temperature_max_c")


#: How many of the values a store knows an unknown-filter error lists.
LISTED_KNOWN_VALUES = 8


class UnknownFilterValueError(FleetError):
    """A read filter (``--fleet``, ``--bundle``, ``--target``, ``--model``, a dashboard query) names a value that no
    device in the store has ever reported: a typo, or the wrong store, rather than a quiet time range."""


def unknown_filter_error(store: FleetStore, option: str, key: str, value: str, *,
                         fleet: str | None = None) -> UnknownFilterValueError | None:  # fmt: skip
    """The error for ``option value`` when no device (of ``fleet``, when given) ever reported ``value`` as its ``key``
    (one of :data:`~edgekit.fleet.store.base.KNOWN_VALUE_KEYS`); None when one did, even outside the time range asked."""
    known = store.known_values(key, fleet=fleet)
    if value in known:
        return None
    what, where = key.replace("_", " "), redact(store.url) + (f" fleet {fleet!r}" if fleet is not None else "")
    listed = ", ".join(known[:LISTED_KNOWN_VALUES]) + (f" (and {len(known) - LISTED_KNOWN_VALUES} more)"
                                                       if len(known) > LISTED_KNOWN_VALUES else "")  # fmt: skip
    return UnknownFilterValueError(
        f"{option} {value!r}: no device in {where} has ever reported this {what}",
        hint=f"{where} knows {listed}; check the spelling and the store" if known else
             f"{where} has no {what} values yet; check the store, or leave {option} out",
    )  # fmt: skip


def check_filter_values(store: FleetStore, filters: Mapping[str, tuple[str, str | None]]) -> None:
    """Raise :class:`UnknownFilterValueError` for the first ``option: (key, value)`` whose value the store never saw.
    Callers check after a query came back empty, so rows found cost nothing extra."""
    for option, (key, value) in filters.items():
        if value is not None and (error := unknown_filter_error(store, option, key, value)) is not None:
            raise error




def parse_since(text: str, now: dt.datetime | None = None, option: str = "--since") -> dt.datetime:
    """``"24h"``, ``"30m"``, ``"7d"``, ``"90s"``, ``"2w"`` ago, or an ISO-8601 time (UTC if no zone), between 1970
    and the year 3000; ``option`` names the flag in errors."""
    now = now or dt.datetime.now(dt.timezone.utc)
    hint = "write a duration like 24h, 30m, 7d, or a time like 2026-01-02T03:00:00Z"
    match = _DURATION_RE.match(text)
    try:
        if match is not None:
            moment = now - dt.timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
        else:
            moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
            moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)
        if not EARLIEST_TIME <= moment < LATEST_TIME:  # the times a store holds: outside them, a typo
            raise OverflowError
    except OverflowError:  # a duration reaching before year 1, a time outside what a store holds
        raise FleetError(f"{option} {text!r} is outside 1970 to 2999", hint=hint) from None
    except ValueError:
        raise FleetError(f"{option} {text!r} is neither a duration nor a time", hint=hint) from None
    return moment


def _time(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def summary_to_json(summary: DeviceSummary) -> dict[str, Any]:
    return {"fleet": summary.fleet, "device": summary.device, "state": summary.state, "bundle_id": summary.bundle_id,
            "target": summary.target, "p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms,
            "power_mean_mw": summary.power_mean_mw, "energy_per_inference_mj": summary.energy_per_inference_mj,
            "temperature_max_c": summary.temperature_max_c, "last_seen": _time(summary.last_seen),
            "windows": summary.windows, "missing_seqs": summary.missing_seqs,
            "interval_s": summary.interval_s}  # fmt: skip


def aggregate_to_json(aggregate: Aggregate) -> dict[str, Any]:
    return {"bundle_id": aggregate.bundle_id, "target": aggregate.target, "power_mode": aggregate.power_mode,
            "devices": aggregate.devices,
            "windows": aggregate.windows, "inferences": aggregate.inferences, "errors": aggregate.errors,
            "p50_ms": aggregate.p50_ms, "p99_ms": aggregate.p99_ms, "p99_max_ms": aggregate.p99_max_ms,
            "power_mean_mw": aggregate.power_mean_mw, "energy_mj": aggregate.energy_mj,
            "energy_per_inference_mj": aggregate.energy_per_inference_mj,
            "temperature_max_c": aggregate.temperature_max_c, "first_window_start": _time(aggregate.first_window_start),
            "last_window_end": _time(aggregate.last_window_end)}  # fmt: skip


def model_aggregate_to_json(aggregate: ModelAggregate) -> dict[str, Any]:
    """One per-model row (issue 20); ``model`` None for agents that name none."""
    return {"fleet": aggregate.fleet, "device": aggregate.device, "model": aggregate.model,
            "bundle_id": aggregate.bundle_id, "devices": aggregate.devices, "windows": aggregate.windows,
            "inferences": aggregate.inferences, "errors": aggregate.errors, "p50_ms": aggregate.p50_ms,
            "p99_ms": aggregate.p99_ms, "p99_max_ms": aggregate.p99_max_ms,
            "throughput_per_s": aggregate.throughput_per_s, "memory_mb_max": aggregate.memory_mb_max,
            "first_window_start": _time(aggregate.first_window_start),
            "last_window_end": _time(aggregate.last_window_end)}  # fmt: skip


def model_rows(store: FleetStore, *, per_device: bool = False, fleet: str | None = None, model: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[ModelAggregate]:  # fmt: skip
    """Per model and bundle (and device with ``per_device``): what ``fleet report``/``fleet status --by-model`` show."""
    keys = ("fleet", "device", "model", "bundle_id") if per_device else ("model", "bundle_id")
    return store.model_aggregate(keys, fleet=fleet, model=model, since=since, until=until)


@dataclass(frozen=True)
class RolloutComparison:
    """Devices of one target that went from ``from_bundle`` to ``to_bundle``: their figures on each bundle."""

    from_bundle: str
    to_bundle: str
    target: str | None
    devices: tuple[tuple[str, str], ...]  # (fleet, device)
    first_switch: dt.datetime  # the earliest first window on to_bundle among the devices
    last_switch: dt.datetime
    before: Aggregate | None
    after: Aggregate | None

    def change(self, figure: str) -> tuple[float | None, float | None]:
        """(after - before, relative change) of ``figure``; None where either side is missing."""
        before = getattr(self.before, figure) if self.before is not None else None
        after = getattr(self.after, figure) if self.after is not None else None
        if before is None or after is None:
            return None, None
        return after - before, ((after - before) / before if before else None)

    def to_json(self) -> dict[str, Any]:
        changes = {}
        for figure in COMPARED_FIGURES:
            delta, relative = self.change(figure)
            changes[figure] = {"delta": delta, "relative": relative}
        return {"from_bundle": self.from_bundle, "to_bundle": self.to_bundle, "target": self.target,
                "devices": [f"{fleet}/{device}" for fleet, device in self.devices],
                "first_switch": _time(self.first_switch), "last_switch": _time(self.last_switch),
                "before": aggregate_to_json(self.before) if self.before else None,
                "after": aggregate_to_json(self.after) if self.after else None, "change": changes}  # fmt: skip


@dataclass(frozen=True)
class FleetReport:
    since: dt.datetime | None
    until: dt.datetime | None
    fleet: str | None
    bundle_id: str | None
    target: str | None
    groups: tuple[Aggregate, ...]  # by bundle, target and power mode (the devices' latest reported one)
    rollouts: tuple[RolloutComparison, ...]
    rollout_records: tuple[RolloutRecord, ...] = ()  # `fleet deploy` rollouts started in the range, newest first
    models: tuple[ModelAggregate, ...] = ()  # by model and bundle (issue 20)
    #: devices per liveness state now (edgekit.fleet.liveness: the counts fleet status, the dashboard and /metrics show)
    device_states: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"since": _time(self.since), "until": _time(self.until), "fleet": self.fleet,
                "bundle_id": self.bundle_id, "target": self.target,
                "groups": [aggregate_to_json(group) for group in self.groups],
                "rollouts": [rollout.to_json() for rollout in self.rollouts],
                "rollout_records": [record.to_json() for record in self.rollout_records],
                "models": [model_aggregate_to_json(group) for group in self.models],
                "device_states": dict(self.device_states)}  # fmt: skip


def build_report(store: FleetStore, *, fleet: str | None = None, bundle_id: str | None = None,
                 target: str | None = None, since: dt.datetime | None = None,
                 until: dt.datetime | None = None, model: str | None = None) -> FleetReport:  # fmt: skip
    """Aggregates by bundle and target (and by model and bundle: ``models``, only ``model`` when given), and every bundle switch seen in the time range compared before/after.

    A device that ran bundle A and then B (by first window) counts as switched A -> B when it ran B in the range;
    its "before" is all its windows on A, its "after" all on B (:meth:`FleetStore.bundle_totals`, kept as windows
    arrive, so a rollout to 10,000 devices is compared without reading their windows). ``bundle_id`` keeps switches from or to that bundle.
    ``rollout_records`` are the deploys started in the range (of ``bundle_id`` and for ``target``, when given).
    """
    groups = store.aggregate(("bundle_id", "target", "power_mode"), fleet=fleet, bundle_id=bundle_id, target=target, since=since,
                             until=until)  # fmt: skip
    records = StoreRolloutLog(store).recent(limit=50, fleet=fleet, bundle_id=bundle_id, since=since, until=until)  # damaged ones left out
    counts = store.device_counts(fleet)  # type: ignore[attr-defined]  # counted in the store (device_reads.py)
    states = counts.states if target is None else counts.states_on(target)
    return FleetReport(since, until, fleet, bundle_id, target, tuple(groups),
                       tuple(_rollouts(store, fleet=fleet, bundle_id=bundle_id, target=target, since=since, until=until)),
                       tuple(r for r in records if target is None or r.target == target),
                       tuple(model_rows(store, fleet=fleet, model=model, since=since, until=until)), states)


def _rollouts(store: FleetStore, *, fleet: str | None, bundle_id: str | None, target: str | None,
              since: dt.datetime | None, until: dt.datetime | None) -> list[RolloutComparison]:  # fmt: skip
    switches: dict[tuple[str, str], list[tuple[tuple[str, str], dt.datetime]]] = defaultdict(list)
    previous: dict[tuple[str, str], BundleSpan] = {}
    for span in store.bundle_spans(fleet, since, until):  # ordered by device, then first window
        key = (span.fleet, span.device)
        before = previous.get(key)
        previous[key] = span
        if before is None or before.bundle_id is None or span.bundle_id is None or before.bundle_id == span.bundle_id:
            continue
        if bundle_id is None or bundle_id in (before.bundle_id, span.bundle_id):
            switches[(before.bundle_id, span.bundle_id)].append((key, span.first_window_start))
    if not switches:
        return []
    targets = store.device_targets(fleet)
    comparisons: list[RolloutComparison] = []
    for (from_bundle, to_bundle), moved in sorted(switches.items()):
        by_target: dict[str | None, list[tuple[tuple[str, str], dt.datetime]]] = defaultdict(list)
        for key, moment in moved:
            by_target[targets.get(key)].append((key, moment))
        for group_target, group in sorted(by_target.items(), key=lambda item: item[0] or ""):
            if target is not None and group_target != target:
                continue
            devices = sorted(key for key, _ in group)
            on_from, on_to = (store.bundle_totals(devices, bundle) for bundle in (from_bundle, to_bundle))
            moments = [moment for _, moment in group]
            comparisons.append(RolloutComparison(
                from_bundle=from_bundle, to_bundle=to_bundle, target=group_target, devices=tuple(devices),
                first_switch=min(moments), last_switch=max(moments), before=on_from, after=on_to,
            ))  # fmt: skip
    return comparisons


__all__ = ["COMPARED_FIGURES", "FleetReport", "LISTED_KNOWN_VALUES", "RolloutComparison", "UnknownFilterValueError",
           "aggregate_to_json", "build_report", "check_filter_values", "model_aggregate_to_json", "model_rows",
           "parse_since", "summary_to_json", "unknown_filter_error"]  # fmt: skip
