"""Fleet-wide rollout of a signed bundle: canary first, widen only when the canary is healthy.

:func:`run_rollout` (``edgekit fleet deploy``) goes through these states, saving the
:class:`~edgekit.fleet.rollout_state.RolloutRecord` at each step:

``canary``      deploy commands (``command.v1``, QoS 1) to the canary devices; wait for each one's
                ``deploy_result`` event in the fleet store (the collector writes it there).
``watching``    for ``health_window_s``: the canary's telemetry on the new bundle (from the store)
                against the same devices' windows before the rollout. Unhealthy when a canary's
                deploy failed or rolled itself back, when an error-level event arrives from a canary,
                when the error rate is above ``max_error_rate``, when p99 grew by more than
                ``max_p99_ratio``, or when a canary sent no telemetry on the new bundle at all.
``widening``    healthy: deploy commands to every other selected device; wait for their results.
``rolling_back`` unhealthy: ``rollback`` (to the bundle each canary ran before) to every canary device
                that switched; the rest of the fleet is never touched.

Final states: ``completed``, ``completed_with_failures``, ``rolled_back``, ``stopped``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.rollout_state import RolloutLog, RolloutRecord
from edgekit.fleet.store.base import DeviceSummary, FleetStore

logger = logging.getLogger(__name__)


class UnknownDeviceError(RolloutError):
    """A device named with ``--devices`` is not in the fleet store."""


class NoDevicesMatchError(RolloutError):
    """The selection (``--devices`` / ``--target``) leaves no device to deploy to."""


@dataclass(frozen=True)
class RolloutPolicy:
    """When to widen and when to stop. ``canary`` is a share (``"10%"``) or a device count (``"2"``)."""

    canary: str = "10%"
    health_window_s: float = 60.0
    deploy_timeout_s: float = 180.0
    max_error_rate: float = 0.02
    max_p99_ratio: float = 1.5
    baseline_s: float = 900.0
    poll_s: float = 0.5
    include_offline: bool = False

    def canary_count(self, total: int) -> int:
        text = str(self.canary).strip()
        try:
            if text.endswith("%"):
                share = float(text[:-1])
                if not 0 < share <= 100:
                    raise ValueError
                return min(total, max(1, math.ceil(total * share / 100.0)))
            count = int(text)
            if count < 1:
                raise ValueError
            return min(total, count)
        except ValueError:
            raise RolloutError(f"--canary {self.canary!r} is neither a share like '10%' nor a device count like '2'",
                               hint="e.g. --canary 10% (at least one device) or --canary 1") from None  # fmt: skip


def select_devices(store: FleetStore, *, devices: Sequence[str] | None = None, target: str | None = None,
                   fleet: str | None = None) -> list[DeviceSummary]:  # fmt: skip
    """The devices a rollout goes to: named ones (all must be known) or every device of a target."""
    if bool(devices) == bool(target):
        raise RolloutError("give either --devices a,b or --target NAME (exactly one)", hint="e.g. --target jetson-orin-nano-8gb")
    known = store.device_summaries(fleet)
    if devices:
        by_name: dict[str, list[DeviceSummary]] = {}
        for summary in known:
            by_name.setdefault(summary.device, []).append(summary)
        chosen: list[DeviceSummary] = []
        for name in dict.fromkeys(devices):
            matches = by_name.get(name, [])
            if not matches:
                import difflib

                close = difflib.get_close_matches(name, list(by_name), n=3)
                raise UnknownDeviceError(
                    f"unknown device {name!r}: the fleet store has no device by that name"
                    + (f" in fleet {fleet!r}" if fleet else "") + (f" (did you mean {', '.join(close)}?)" if close else ""),
                    hint="`edgekit fleet status` lists the devices the collector has seen",
                )  # fmt: skip
            if len(matches) > 1:
                raise RolloutError(f"device {name!r} exists in several fleets ({', '.join(m.fleet for m in matches)})",
                                   hint="pass --fleet to pick one")  # fmt: skip
            chosen.append(matches[0])
        return chosen
    chosen = [s for s in known if s.target == target]
    if not chosen:
        targets = sorted({s.target for s in known if s.target})
        raise NoDevicesMatchError(
            f"no devices match target {target!r}" + (f" in fleet {fleet!r}" if fleet else "")
            + f" ({len(known)} device(s) known; their targets: {', '.join(targets) or 'none recorded'})",
            hint="agents do not report their target: name devices with --devices, or record targets first "
            "(a deploy by --devices or `edgekit fleet simulate --store` records them)",
        )  # fmt: skip
    return chosen


class Rollout:
    """One rollout; :meth:`run` blocks until it reaches a final state and returns the final record."""

    def __init__(self, store: FleetStore, publisher: CommandPublisher, log: RolloutLog, artifact: BundleArtifact,
                 devices: Sequence[DeviceSummary], policy: RolloutPolicy = RolloutPolicy(), *,
                 on_update: Callable[[RolloutRecord], None] | None = None, stop: threading.Event | None = None) -> None:  # fmt: skip
        fleets = {d.fleet for d in devices}
        if len(fleets) != 1:
            raise RolloutError(f"a rollout goes to one fleet, but the devices are in {len(fleets)}: {', '.join(sorted(fleets))}",
                               hint="pass --fleet")  # fmt: skip
        self.store, self.publisher, self.log, self.artifact, self.policy = store, publisher, log, artifact, policy
        self.fleet = fleets.pop()
        self._on_update = on_update
        self._stop = stop or threading.Event()
        online = [d for d in devices if policy.include_offline or d.state == "online"]
        if not online:
            raise NoDevicesMatchError(f"none of the {len(devices)} selected device(s) is online",
                                      hint="start the agents (or pass include_offline) and try again")  # fmt: skip
        ordered = sorted(online, key=lambda d: d.device)
        canary = ordered[: policy.canary_count(len(ordered))]
        now = dt.datetime.now(dt.timezone.utc)
        outcomes = {d.device: "pending" for d in ordered}
        outcomes.update({d.device: "skipped_offline" for d in devices if d not in online})
        self.record = RolloutRecord(
            rollout_id=uuid.uuid4().hex[:12], fleet=self.fleet, bundle_id=artifact.bundle_id, url=artifact.url,
            sha256=artifact.sha256, state="canary", canary=tuple(d.device for d in canary),
            devices=tuple(d.device for d in ordered), started_at=now, updated_at=now,
            previous_bundles={d.device: d.bundle_id for d in ordered}, outcomes=outcomes,
        )  # fmt: skip
        self._targets_unknown = {d.device for d in ordered if d.target is None}

    # -- the state machine ----------------------------------------------------------------------------

    def run(self) -> RolloutRecord:
        self._save(self.record)
        canary = list(self.record.canary)
        self._deploy(canary)
        failed = {d: o for d, o in self._outcomes(canary).items() if o != "succeeded"}
        if failed:
            return self._roll_back(f"canary deploy did not succeed on {len(failed)} of {len(canary)} device(s): "
                                   + ", ".join(f"{d} {o}" for d, o in sorted(failed.items())))  # fmt: skip
        self._save(self.record.with_state("watching"))
        problem = self._watch_health(canary)
        if problem is not None:
            return self._roll_back(problem)
        rest = [d for d in self.record.devices if d not in canary]
        self._save(self.record.with_state("widening"))
        if rest:
            self._deploy(rest)
        bad = {d: o for d, o in self.record.outcomes.items() if o not in ("succeeded", "skipped_offline")}
        final = "completed" if not bad else "completed_with_failures"
        reason = None if not bad else f"{len(bad)} device(s) did not take the bundle: " + ", ".join(f"{d} {o}" for d, o in sorted(bad.items()))
        return self._save(self.record.with_state(final, reason=reason))

    def _save(self, record: RolloutRecord) -> RolloutRecord:
        self.record = record
        self.log.save(record)
        logger.info("rollout %s: %s %s", record.rollout_id, record.state, record.reason or "")
        if self._on_update is not None:
            self._on_update(record)
        return record

    def _outcomes(self, devices: Sequence[str]) -> dict[str, str]:
        return {d: self.record.outcomes[d] for d in devices}

    def _set_outcomes(self, changes: dict[str, str]) -> None:
        if changes:
            self._save(self.record.with_state(self.record.state, outcomes={**self.record.outcomes, **changes}))

    def _deploy(self, devices: Sequence[str]) -> None:
        """Send deploy commands and wait for every device's ``deploy_result`` (or the timeout)."""
        command_ids: dict[str, str] = {}
        for device in devices:
            command = build_command("deploy", self.artifact.deploy_args())
            self.publisher.send(self.fleet, device, command)
            command_ids[command["id"]] = device
        self._set_outcomes({d: "deploying" for d in devices})
        results = self._await_results(command_ids, "deploy_result", self.policy.deploy_timeout_s)
        self._set_outcomes({d: results.get(d, "timeout") for d in devices})
        for device in devices:
            if results.get(device) == "succeeded" and device in self._targets_unknown and self.artifact.target:
                self.store.set_device_target(self.fleet, device, self.artifact.target)

    def _await_results(self, command_ids: dict[str, str], kind: str, timeout_s: float) -> dict[str, str]:
        """device -> ``details.outcome`` of the ``kind`` event answering its command."""
        since = self.record.started_at - dt.timedelta(minutes=5)  # device clocks may lag the host's
        results: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < len(command_ids) and time.monotonic() < deadline and not self._stop.is_set():
            for event in self.store.events(fleet=self.fleet, since=since, limit=100_000):
                device = command_ids.get(event.command_id or "")
                if device is None or event.kind not in (kind, "command_rejected", "command_failed"):
                    continue
                details = event.payload.get("details") or {}
                results[device] = str(details.get("outcome") or ("rejected" if event.kind != kind else "failed"))
            if len(results) < len(command_ids):
                self._stop.wait(self.policy.poll_s)
        return results

    def _watch_health(self, canary: list[str]) -> str | None:
        """Wait out the health window; return why the canary is unhealthy, or None when it is healthy."""
        policy = self.policy
        watch_start = dt.datetime.now(dt.timezone.utc)
        deadline = time.monotonic() + policy.health_window_s
        while True:
            problem = self._error_events(canary, watch_start) or None
            if problem is not None:
                return problem
            if time.monotonic() >= deadline or self._stop.is_set():
                break
            self._stop.wait(min(policy.poll_s, max(0.0, deadline - time.monotonic())))
        pairs = [(self.fleet, d) for d in canary]
        after = self.store.aggregate(("device",), devices=pairs, bundle_id=self.artifact.bundle_id, since=self.record.started_at)
        before = self.store.aggregate(("device",), devices=pairs, since=self.record.started_at - dt.timedelta(seconds=policy.baseline_s),
                                      until=self.record.started_at)  # fmt: skip
        silent = sorted(set(canary) - {a.device for a in after if a.windows > 0})
        inferences, errors = sum(a.inferences for a in after), sum(a.errors for a in after)
        error_rate = errors / (inferences + errors) if inferences + errors else None
        p99_after, p99_before = _weighted_p99(after), _weighted_p99(before)
        ratio = p99_after / p99_before if p99_after is not None and p99_before else None
        health = {"windows": sum(a.windows for a in after), "inferences": inferences, "errors": errors, "error_rate": error_rate,
                  "p99_before_ms": p99_before, "p99_after_ms": p99_after, "p99_ratio": ratio,
                  "max_error_rate": policy.max_error_rate, "max_p99_ratio": policy.max_p99_ratio}  # fmt: skip
        self._save(self.record.with_state("watching", health=health))
        if silent:
            return f"no telemetry on {self.artifact.bundle_id} from canary device(s) {', '.join(silent)} within the health window"
        if error_rate is not None and error_rate > policy.max_error_rate:
            return f"canary error rate {error_rate:.1%} is above the limit of {policy.max_error_rate:.1%}"
        if ratio is not None and ratio > policy.max_p99_ratio:
            return f"canary p99 grew from {p99_before:.2f} ms to {p99_after:.2f} ms ({ratio:.2f}x, limit {policy.max_p99_ratio:.2f}x)"
        return None

    def _error_events(self, canary: list[str], since: dt.datetime) -> str | None:
        for event in self.store.events(fleet=self.fleet, since=since - dt.timedelta(seconds=1), limit=10_000):
            if event.device in canary and event.level == "error":
                return f"canary device {event.device} reported an error event ({event.kind}): {event.message}"
        return None

    def _roll_back(self, reason: str) -> RolloutRecord:
        """Stop: send rollback to every canary that switched to the new bundle; the rest stays untouched."""
        switched = [d for d in self.record.canary if self.record.outcomes.get(d) == "succeeded"]
        logger.warning("rollout %s unhealthy: %s; rolling back %d device(s)", self.record.rollout_id, reason, len(switched))
        if not switched:
            return self._save(self.record.with_state("stopped", reason=reason))
        self._save(self.record.with_state("rolling_back", reason=reason))
        command_ids: dict[str, str] = {}
        for device in switched:
            previous = self.record.previous_bundles.get(device)
            command = build_command("rollback", {"bundle_id": previous} if previous else {})
            self.publisher.send(self.fleet, device, command)
            command_ids[command["id"]] = device
        results = self._await_results(command_ids, "rollback_result", self.policy.deploy_timeout_s)
        self._set_outcomes({d: "rolled_back" if results.get(d) == "succeeded" else f"rollback_{results.get(d, 'timeout')}"
                            for d in switched})  # fmt: skip
        return self._save(self.record.with_state("rolled_back", reason=reason))


def _weighted_p99(rows: Sequence[Any]) -> float | None:
    weighted = [(r.p99_ms, r.inferences) for r in rows if r.p99_ms is not None and r.inferences > 0]
    total = sum(n for _, n in weighted)
    return sum(p * n for p, n in weighted) / total if total else None


def run_rollout(artifact: BundleArtifact, *, broker_url: str, store_url: str, devices: Sequence[str] | None = None,
                target: str | None = None, fleet: str | None = None, policy: RolloutPolicy = RolloutPolicy(),
                mqtt_version: str = "5", on_update: Callable[[RolloutRecord], None] | None = None,
                publisher_options: dict[str, Any] | None = None) -> RolloutRecord:  # fmt: skip
    """Select devices in the store at ``store_url``, then run a :class:`Rollout` through ``broker_url``."""
    from edgekit.fleet.rollout_state import open_rollout_log
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store:
        selected = select_devices(store, devices=devices, target=target, fleet=fleet)
        with open_rollout_log(store_url) as log, CommandPublisher(broker_url, mqtt_version=mqtt_version,  # type: ignore[arg-type]
                                                                  **(publisher_options or {})) as publisher:  # fmt: skip
            return Rollout(store, publisher, log, artifact, selected, policy, on_update=on_update).run()
