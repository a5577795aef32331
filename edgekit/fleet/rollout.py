"""Fleet-wide rollout of a verified, signed bundle in waves, with a health gate between waves.

:func:`run_rollout` (``edgekit fleet deploy``) first checks that every selected device reports the
bundle's target (:func:`check_targets`; ``force`` deploys anyway and records why), then goes through
the waves of :class:`RolloutPolicy` (cumulative: ``1,10%,50%,100%`` is one device, then up to a
tenth, half, all), saving the :class:`~edgekit.fleet.rollout_state.RolloutRecord` at each step:

``deploying``    deploy commands (``command.v1``, QoS 1) to the wave's devices; wait for each one's
                 ``deploy_result`` event in the fleet store (the collector writes it there). A device
                 whose deploy failed, was refused or rolled itself back fails the wave.
``watching``     the gate, for ``health_window_s``: the telemetry of every device switched so far on
                 the new bundle (from the store) against the same devices' windows before the
                 rollout. It fails when an error-level event arrives from one of them, when the error
                 rate is above ``max_error_rate``, when p99 grew by more than ``max_p99_ratio``, or
                 when a switched device sent no telemetry on the new bundle at all.
``rolling_back`` a wave or its gate failed: ``rollback`` (to the bundle each ran before) to every
                 device this rollout switched, in every wave so far; later waves are never touched.

The last wave has no gate after it (nothing is left to protect); its failed devices are listed and
the rollout ends ``completed_with_failures``. Final states: ``completed``, ``completed_with_failures``,
``rolled_back``, ``stopped`` (no device switched: a first wave that failed, or one wave in which all failed; or a deploy ended
early: Ctrl-C, SIGTERM in ``fleet deploy``, a set ``stop`` event, an error, after which nothing more is sent). Every device that did not take
the bundle keeps the reason its agent gave (the ``deploy_result`` or ``command_rejected`` message) and
a hint from :data:`FAILURE_HINTS`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError, refuse_file_url_for_agents
from edgekit.fleet.rollout_models import ModelDeploy, model_health_rows, pipeline_bundle_id
from edgekit.fleet.rollout_answers import PROVISIONAL, all_final, late_switches, later_failures, newest_answers
from edgekit.fleet.rollout_answers import EVENT_CLOCK_LAG, answer_seconds, answers_to_deploys, refuse_a_second_rollout
from edgekit.fleet.rollout_hints import FAILURE_HINTS, failure_hint
from edgekit.fleet.rollout_policy import RolloutPolicy, deploy_command, parse_waves
from edgekit.fleet.rollout_state import FINAL_STATES, KEPT_OUTCOMES, RolloutLog, RolloutRecord, interrupted
from edgekit.fleet.store.base import DeviceSummary, FleetStore
from edgekit.fleet.store_patience import patiently

logger = logging.getLogger(__name__)


class UnknownDeviceError(RolloutError):
    """A device named with ``--devices`` is not in the fleet store."""


class NoDevicesMatchError(RolloutError):
    """The selection (``--devices`` / ``--target``) leaves no device to deploy to."""


class TargetMismatchError(RolloutError):
    """Selected devices report another target than the bundle's, or none (``--force`` deploys anyway)."""


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
            hint="only devices whose target is recorded in the store can be selected by --target (simulated devices "
            "record theirs); name devices with --devices instead (and pass --force if they report no target)",
        )  # fmt: skip
    return chosen


def check_targets(devices: Sequence[DeviceSummary], bundle_target: str | None, *, bundle: str, force: bool) -> dict[str, str]:
    """device -> why its target does not match ``bundle_target`` (none when all match). Raises
    :class:`TargetMismatchError` naming them unless ``force``."""
    problems: dict[str, str] = {}
    for device in devices:
        if bundle_target is None:
            problems[device.device] = "the bundle's manifest names no target"
        elif device.target is None:
            problems[device.device] = "reports no target"
        elif device.target != bundle_target:
            problems[device.device] = f"reports target {device.target!r}"
    if problems and not force:
        if bundle_target is None:
            raise TargetMismatchError(f"bundle {bundle} names no target, so no device can be matched to it; nothing was sent",
                                      hint="rebuild it with `edgekit build --target NAME`, or pass --force to deploy it anyway")  # fmt: skip
        listed = "; ".join(f"{d} {why}" for d, why in list(problems.items())[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise TargetMismatchError(
            f"bundle {bundle} is built for target {bundle_target!r}, but {len(problems)} of the {len(devices)} selected "
            f"device(s) do not report it: {listed}{more}; nothing was sent",
            hint=f"select devices of that target (--target {bundle_target}); a device that reports another target, or "
            "none (agents before device identity, devices the collector has no status of), takes it only with --force",
        )
    return problems


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


#: Devices recorded ``deploying`` (with their command ids) in one save, before their commands go out.
SEND_CHUNK = 500
#: Why a rollout whose ``stop`` event was set ended (the reason of its ``stopped`` record).
STOP_REQUESTED = "stopped on request (its stop event was set)"


class Rollout:
    """One rollout; :meth:`run` blocks until it reaches a final state and returns the final record."""

    def __init__(self, store: FleetStore, publisher: CommandPublisher, log: RolloutLog, artifact: BundleArtifact,
                 devices: Sequence[DeviceSummary], policy: RolloutPolicy = RolloutPolicy(), *,
                 on_update: Callable[[RolloutRecord], None] | None = None, stop: threading.Event | None = None,
                 signed_commands: bool = False, models: Sequence[ModelDeploy] = (), pipeline: bool = False) -> None:  # fmt: skip
        """``models`` (issue 20): deploy to named models of the devices' repositories instead of their default
        one: one ``ModelDeploy`` sends ``deploy`` with ``args.model``; with ``pipeline`` they all go in one
        ``deploy_pipeline`` command (all or none on each device). ``artifact`` is then the first model's."""
        if pipeline and not models:
            raise RolloutError("a pipeline deploy needs at least one model=bundle", hint="pass --pipeline detector=DIR,...")
        if len(models) > 1 and not pipeline:
            raise RolloutError(f"{len(models)} models to deploy: send them as a pipeline", hint="use --pipeline")
        self.models, self.pipeline = tuple(models), pipeline
        devices = list({(d.fleet, d.device): d for d in devices}.values())  # a device named twice gets one deploy
        fleets = {d.fleet for d in devices}
        if len(fleets) != 1:
            raise RolloutError(f"a rollout goes to one fleet, but the devices are in {len(fleets)}: {', '.join(sorted(fleets))}",
                               hint="pass --fleet")  # fmt: skip
        self.store, self.publisher, self.log, self.artifact, self.policy = store, publisher, log, artifact, policy
        self.fleet = fleets.pop()
        self._command_name, self._command_args = deploy_command(artifact, self.models, policy, pipeline=pipeline)
        refuse_a_second_rollout(log, self.fleet)
        self._on_update = on_update
        self._stop = stop or threading.Event()
        self._saved_at = time.monotonic()
        self._unsent: set[str] = set()  # recorded deploying before its command went out, not sent yet
        self._events_before: list[set[str]] = []  # per wave: the events stored before its commands went out
        online = [d for d in devices if policy.include_offline or d.state == "online"]
        if not online:
            raise NoDevicesMatchError(f"none of the {len(devices)} selected device(s) is online",
                                      hint="start the agents (or pass include_offline) and try again")  # fmt: skip
        forced = check_targets(online, artifact.target, bundle=artifact.bundle_id, force=policy.force)
        refuse_file_url_for_agents([artifact, *(m.artifact for m in self.models)], [(d.fleet, d.device) for d in online],
                                   store.agent_versions(self.fleet))  # fmt: skip
        for deploy in self.models[1:]:
            forced.update(check_targets(online, deploy.artifact.target, bundle=deploy.artifact.bundle_id, force=policy.force))
        ordered = sorted(online, key=lambda d: d.device)
        plan = policy.plan([d.device for d in ordered])
        now = _now()
        outcomes = {d.device: "pending" for d in ordered}
        online_names = {d.device for d in online}
        outcomes.update({d.device: "skipped_offline" for d in devices if d.device not in online_names})
        waves: tuple[dict[str, Any], ...] = tuple({"index": i + 1, "spec": spec, "devices": list(members), "state": "pending", "started_at": None,
                       "finished_at": None, "seconds": None, "health": {}, "reason": None}
                      for i, (spec, members) in enumerate(plan))  # fmt: skip
        options: dict[str, Any] = {"allow_downgrade": policy.allow_downgrade, "allow_signature_change": policy.allow_signature_change,
                   "force": policy.force, "signed_commands": signed_commands, "health_window_s": policy.health_window_s,
                   "max_error_rate": policy.max_error_rate, "max_p99_ratio": policy.max_p99_ratio,
                   "deploy_timeout_s": policy.deploy_timeout_s, "progress_s": policy.progress_s,
                   "files_verified": artifact.files_verified, "signed_by": artifact.signed_by,
                   "dropped_waves": policy.dropped_waves([d.device for d in ordered])}  # fmt: skip
        if self.models:  # the models deployed to, recorded with the rollout (report, dashboard)
            options["model"] = None if pipeline else self.models[0].model
            options["models"] = [{"model": m.model, "bundle_id": m.artifact.bundle_id, "url": m.artifact.url,
                                  "sha256": m.artifact.sha256} for m in self.models]  # fmt: skip
            options["pipeline"] = pipeline
        bundle_id = pipeline_bundle_id(self.models) if pipeline else artifact.bundle_id
        if forced:
            logger.warning("deploying %s with --force to %d device(s) whose target does not match: %s", artifact.bundle_id,
                           len(forced), "; ".join(f"{d} {why}" for d, why in forced.items()))  # fmt: skip
        self.record = RolloutRecord(
            rollout_id=uuid.uuid4().hex[:12], fleet=self.fleet, bundle_id=bundle_id, url=artifact.url,
            sha256=artifact.sha256, state="deploying", canary=plan[0][1], devices=tuple(d.device for d in ordered),
            started_at=now, updated_at=now, previous_bundles={d.device: d.bundle_id for d in ordered}, outcomes=outcomes,
            target=artifact.target, waves=waves, forced=forced, options=options,
        )  # fmt: skip

    # -- the state machine ----------------------------------------------------------------------------

    def run(self) -> RolloutRecord:
        """Wave by wave, a health gate between; a deploy ended early (Ctrl-C, SIGTERM, an error) records ``stopped``."""
        try:
            return self._run_waves()
        except BaseException as exc:
            if self.record.state not in FINAL_STATES:
                self._stopped(exc)
            raise

    def _stopped(self, exc: BaseException | None, what: str | None = None) -> RolloutRecord:
        """Record the rollout ``stopped`` (:func:`~edgekit.fleet.rollout_state.interrupted`): devices recorded deploying
        but never sent their command become ``not_started``; those sent it take the answers already stored."""
        record = self.record
        outcomes, results = dict(record.outcomes), dict(record.device_results)
        for device in self._unsent:
            outcomes[device] = "pending"
            results.pop(device, None)
        record = replace(record, outcomes=outcomes, device_results=results)
        with contextlib.suppress(Exception):  # the store may be what failed: the caller sees the first error
            deploying = [d for d, o in outcomes.items() if o == "deploying"]
            for device, answer in answers_to_deploys(self.store, record, deploying).items():
                outcomes[device] = answer["outcome"]
                results[device] = {**results[device], **answer,
                                   "seconds": answer_seconds(results[device]["sent_at"], answer.get("answered_at"))}  # fmt: skip
        self.record = replace(record, outcomes=outcomes, device_results=results)
        with contextlib.suppress(Exception):
            self._save(interrupted(self.record, exc, what=what))
        return self.record

    def _run_waves(self) -> RolloutRecord:
        self._save(self.record)
        switched: list[str] = []  # devices this rollout switched: a rollback sends them back
        watched: list[str] = []  # devices on the new bundle (also those already on it): the gates judge them
        last = len(self.record.waves) - 1
        for index, wave in enumerate(self.record.waves):
            if self._stop.is_set():
                return self._stopped(None, STOP_REQUESTED)
            devices = list(wave["devices"])
            self._set_wave(index, state="deploying", started_at=_now().isoformat())
            self._save(self.record.with_state("deploying"))
            self._events_before.append(self._event_ids())  # a watched device's error after this counts (_error_events)
            self._deploy(devices, index + 1)
            if self._stop.is_set():
                return self._stopped(None, STOP_REQUESTED)
            switched += [d for d in devices if self.record.outcomes[d] in ("succeeded", *PROVISIONAL)]
            watched += [d for d in devices if self.record.outcomes[d] in ("succeeded", "already_current", *PROVISIONAL)]
            failed = {d: o for d, o in self._outcomes(devices).items() if o not in KEPT_OUTCOMES}
            if failed and index < last:
                reason = (f"wave {index + 1} ({wave['spec']}): the deploy did not succeed on {len(failed)} of {len(devices)} "
                          "device(s): " + "; ".join(self._describe(d) for d in sorted(failed)))  # fmt: skip
                self._end_wave(index, "failed", f"the deploy failed on {len(failed)} of {len(devices)} device(s)")
                return self._roll_back(reason, switched)
            if index == last:
                self._end_wave(index, "failed" if failed else "passed",
                               None if not failed else f"{len(failed)} device(s) did not take the bundle")  # fmt: skip
                break
            self._set_wave(index, state="watching")
            self._save(self.record.with_state("watching"))
            problem = self._watch_health(watched, index)
            if self._stop.is_set():  # a window cut short is no verdict
                return self._stopped(None, STOP_REQUESTED)
            again = self._answered_again(watched) if problem is None else []
            problem = problem or (f"{len(again)} device(s) answered again after their deploy: " + "; ".join(map(self._describe, again))
                                  if again else None)  # fmt: skip
            if problem is not None:
                self._end_wave(index, "failed", problem)
                return self._roll_back(f"wave {index + 1} ({wave['spec']}) gate: {problem}", switched)
            self._end_wave(index, "passed", None)
        self._answered_again(watched)  # answers that came during the last wave
        bad = self.record.failed_devices()
        if not bad:
            return self._save(self.record.with_state("completed", reason=None))
        reason = f"{len(bad)} device(s) did not take the bundle: " + "; ".join(self._describe(d) for d in bad)
        return self._save(self.record.with_state("completed_with_failures" if switched else "stopped", reason=reason))

    def _describe(self, device: str) -> str:
        result = self.record.device_results.get(device, {})
        outcome = self.record.outcomes.get(device)
        return f"{device} {outcome}" + (f" ({result['reason']})" if result.get("reason") else "")

    def _save(self, record: RolloutRecord) -> RolloutRecord:
        self.record = record
        self.log.save(record)
        self._saved_at = time.monotonic()
        logger.info("rollout %s: %s %s", record.rollout_id, record.state, record.reason or "")
        if self._on_update is not None:
            self._on_update(record)
        return record

    def _set_wave(self, index: int, **changes: Any) -> None:
        waves = list(self.record.waves)
        waves[index] = {**waves[index], **changes}
        self.record = replace(self.record, waves=tuple(waves))

    def _end_wave(self, index: int, state: str, reason: str | None) -> None:
        started = self.record.waves[index].get("started_at")
        finished = _now()
        seconds = round((finished - dt.datetime.fromisoformat(started)).total_seconds(), 3) if started else None
        self._set_wave(index, state=state, reason=reason, finished_at=finished.isoformat(), seconds=seconds)
        self._save(self.record.with_state(self.record.state))

    def _outcomes(self, devices: Sequence[str]) -> dict[str, str]:
        return {d: self.record.outcomes[d] for d in devices}

    def _update_devices(self, outcomes: dict[str, str], results: dict[str, dict[str, Any]]) -> None:
        if not outcomes and not results:
            return
        merged = dict(self.record.device_results)
        for device, result in results.items():
            merged[device] = {**merged.get(device, {}), **result}
        self._save(self.record.with_state(self.record.state, outcomes={**self.record.outcomes, **outcomes},
                                          device_results=merged))  # fmt: skip

    def _deploy(self, devices: Sequence[str], wave: int) -> None:
        """Send deploy commands and wait for every device's ``deploy_result`` (or the timeout). Each device is recorded
        ``deploying`` with its command id before its command goes out (``SEND_CHUNK`` devices a save), so a deploy
        that ends while sending (a broker that stops acknowledging, Ctrl-C, ``kill -9``) leaves a record of whom it sent
        to; the record is saved at least every ``progress_s`` while sending and waiting."""
        command_ids: dict[str, str] = {}
        sent_at: dict[str, str] = {}
        for start in range(0, len(devices), SEND_CHUNK):
            if self._stop.is_set():
                break  # the later chunks are never marked deploying: they stay as they were
            chunk = devices[start : start + SEND_CHUNK]
            commands, marked = {d: build_command(self._command_name, self._command_args) for d in chunk}, _now().isoformat()
            self._unsent |= set(chunk)
            self._update_devices({d: "deploying" for d in chunk}, {d: {"wave": wave, "command_id": commands[d]["id"],
                                 "sent_at": marked, "outcome": "deploying", "reason": None, "step": None, "hint": None}
                                 for d in chunk})  # fmt: skip
            for device in chunk:
                if self._stop.is_set():
                    break
                sent_at[device] = _now().isoformat()  # the time before the send: answers come after it
                self._unsent.discard(device)  # from here on the device may get it, whatever send says
                self.publisher.send(self.fleet, device, commands[device])
                command_ids[commands[device]["id"]] = device
                self._keep_alive()
        answers = self._await_results(command_ids, "deploy_result", self.policy.deploy_timeout_s)
        results: dict[str, dict[str, Any]] = {}
        for device in sent_at:
            if device not in answers and self._stop.is_set():
                continue  # stopped, not timed out: still deploying as far as anyone knows (_stopped)
            answer = answers.get(device) or {
                "outcome": "timeout", "step": None, "answered_at": None,
                "reason": f"no deploy_result from the device within {self.policy.deploy_timeout_s:g} s (offline, busy, or the "
                          "collector is not writing its events to this store)",
                "hint": "check `edgekit fleet status` and the device's log; raise --deploy-timeout-s for large bundles",
            }  # fmt: skip
            results[device] = {**answer, "sent_at": sent_at[device], "seconds": answer_seconds(sent_at[device], answer.get("answered_at"))}
        self._update_devices({d: r["outcome"] for d, r in results.items()}, results)

    def _keep_alive(self) -> None:
        """Save the record when ``progress_s`` has passed since it was last: a long send loop or wait is not taken for
        a deploy that died (``RolloutRecord.silent_s``), and the record keeps up with what was sent."""
        if time.monotonic() - self._saved_at >= self.policy.progress_s:
            self._save(self.record.with_state(self.record.state))

    def _await_results(self, command_ids: dict[str, str], kind: str, timeout_s: float) -> dict[str, dict[str, Any]]:
        """device -> outcome, reason, step, hint and answered_at of the ``kind`` event answering its command; the answers
        are read at least once, even when the rollout is being stopped."""
        since = self.record.started_at - dt.timedelta(minutes=5)  # device clocks may lag the host's
        deadline = time.monotonic() + timeout_s
        while True:  # until every device's answer is final
            results = newest_answers(patiently("reading answers", self.store.events, fleet=self.fleet, since=since,
                                               limit=100_000), command_ids, kind)  # fmt: skip
            if all_final(results, command_ids.values()) or time.monotonic() >= deadline or self._stop.is_set():
                return results
            self._keep_alive()
            self._stop.wait(min(self.policy.poll_s, max(0.0, deadline - time.monotonic())))

    def _watch_health(self, devices: list[str], index: int) -> str | None:
        """Wait out the health window; return why the switched devices are unhealthy, or None when healthy.
        Every ``progress_s`` the wave's gate figures so far (``health`` with ``final: False``) and ``watch_ends_at``
        are saved, so ``fleet deploy`` prints a live line and the dashboard shows the wave as it is watched."""
        policy = self.policy
        watch_start = _now()
        deadline = time.monotonic() + policy.health_window_s
        ends_at = watch_start + dt.timedelta(seconds=policy.health_window_s)
        self._set_wave(index, watch_ends_at=ends_at.isoformat())
        shown_at: float | None = None
        while True:
            problem = self._error_events(devices)
            if problem is not None:
                return problem
            if time.monotonic() >= deadline or self._stop.is_set():
                break
            if shown_at is None or time.monotonic() - shown_at >= policy.progress_s:
                shown_at = time.monotonic()
                health, _ = self._gate_figures(devices)
                self._set_wave(index, health={**health, "final": False})
                self._save(self.record.with_state("watching", health={**health, "final": False}))
            self._stop.wait(min(policy.poll_s, max(0.0, deadline - time.monotonic())))
        health, silent = self._gate_figures(devices)
        health["final"] = True
        self._set_wave(index, health=health)
        self._save(self.record.with_state("watching", health=health))
        if silent:
            return f"no telemetry on {self.record.bundle_id} from device(s) {', '.join(silent)} within the health window"
        error_rate, ratio = health["error_rate"], health["p99_ratio"]
        if error_rate is not None and error_rate > policy.max_error_rate:
            return f"error rate {error_rate:.1%} is above the limit of {policy.max_error_rate:.1%}"
        if ratio is not None and ratio > policy.max_p99_ratio:
            return (f"p99 grew from {health['p99_before_ms']:.2f} ms to {health['p99_after_ms']:.2f} ms ({ratio:.2f}x, "
                    f"limit {policy.max_p99_ratio:.2f}x)")  # fmt: skip
        return None

    def _gate_figures(self, devices: list[str]) -> tuple[dict[str, Any], list[str]]:
        """The gate's figures for the switched ``devices`` so far, and those that sent no telemetry on the new bundle
        yet. ``healthy`` counts the devices heard from on the new bundle; ``failed`` the wave devices whose deploy
        did not succeed."""
        policy = self.policy
        pairs = [(self.fleet, d) for d in devices]
        baseline_since = self.record.started_at - dt.timedelta(seconds=policy.baseline_s)
        if self.models:  # per model: the deployed models' own windows (issue 20)
            after, before = model_health_rows(self.store, self.models, pairs, since=self.record.started_at,
                                              baseline_since=baseline_since)  # fmt: skip
        else:
            after = self.store.aggregate(("device",), devices=pairs, bundle_id=self.artifact.bundle_id, since=self.record.started_at)
            before = self.store.aggregate(("device",), devices=pairs, since=baseline_since, until=self.record.started_at)
        silent = sorted(set(devices) - {a.device for a in after if a.windows > 0})
        inferences, errors = sum(a.inferences for a in after), sum(a.errors for a in after)
        error_rate = errors / (inferences + errors) if inferences + errors else None
        p99_after, p99_before = _weighted_p99(after), _weighted_p99(before)
        ratio = p99_after / max(p99_before, 0.01) if p99_after is not None and p99_before is not None else None  # 0 ms before: 0.01
        failed = sum(1 for o in self.record.outcomes.values()
                     if o not in ("succeeded", "already_current", "pending", "deploying", "skipped_offline"))  # fmt: skip
        # the first 20 silent devices by name (the record is saved every progress_s: no list of thousands each time)
        health = {"devices": len(devices), "healthy": len(devices) - len(silent), "silent": silent[:20], "failed": failed,
                  "windows": sum(a.windows for a in after), "inferences": inferences, "errors": errors,
                  "error_rate": error_rate, "p99_before_ms": p99_before, "p99_after_ms": p99_after, "p99_ratio": ratio,
                  "max_error_rate": policy.max_error_rate, "max_p99_ratio": policy.max_p99_ratio}  # fmt: skip
        return health, silent

    def _event_ids(self) -> set[str]:
        return {e.event_id for e in patiently("reading events", self.store.events, fleet=self.fleet,
                                              since=self.record.started_at - EVENT_CLOCK_LAG, limit=100_000)}  # fmt: skip

    def _error_events(self, devices: list[str]) -> str | None:
        """An error event a watched device sent after its wave's commands went out (also while the wave still waited for
        slower devices, or during a later wave's deploy), less those stored before: events by the device's clock, which
        may lag the host's (read from EVENT_CLOCK_LAG before the rollout's start)."""
        waves = {d: self.record.device_results.get(d, {}).get("wave") for d in devices}
        for event in patiently("reading events", self.store.events, fleet=self.fleet,
                               since=self.record.started_at - EVENT_CLOCK_LAG, limit=100_000):  # fmt: skip
            wave = waves.get(event.device)
            if wave is not None and event.level == "error" and event.event_id not in self._events_before[wave - 1]:
                return f"device {event.device} reported an error event ({event.kind}): {event.message}"
        return None

    def _roll_back(self, reason: str, switched: list[str]) -> RolloutRecord:
        """Stop: send rollback to every device this rollout switched; devices of later waves stay untouched."""
        self.record = self.record.untouched_not_started()
        switched = [*switched, *self._late_switches(switched)]
        logger.warning("rollout %s stopped: %s; rolling back %d device(s)", self.record.rollout_id, reason, len(switched))
        if not switched:
            return self._save(self.record.with_state("stopped", reason=reason))
        self._save(self.record.with_state("rolling_back", reason=reason))
        if self.models:
            answers = self._roll_back_models(switched)
        else:
            command_ids: dict[str, str] = {}
            for device in switched:
                previous = self.record.previous_bundles.get(device)
                command = build_command("rollback", {"bundle_id": previous} if previous else {})
                self.publisher.send(self.fleet, device, command)
                command_ids[command["id"]] = device
                self._keep_alive()
            answers = self._await_results(command_ids, "rollback_result", self.policy.deploy_timeout_s)
        outcomes, results = {}, {}
        for device in switched:
            answer = answers.get(device)
            if answer is not None and answer["outcome"] == "succeeded":
                outcomes[device] = "rolled_back"
                results[device] = {"rollback": "succeeded", "reason": f"rolled back: {reason}"}
            else:
                outcomes[device] = "rollback_failed" if answer is not None else "rollback_timeout"
                results[device] = {"rollback": outcomes[device], "reason": (answer or {}).get("reason") or
                                   f"no rollback_result within {self.policy.deploy_timeout_s:g} s",
                                   "hint": "the device still runs the new bundle: send `rollback` again or deploy the old bundle"}  # fmt: skip
        self._update_devices(outcomes, results)
        back = sum(1 for o in outcomes.values() if o == "rolled_back")
        if back < len(switched):  # the state names what was attempted; the reason says what worked
            reason += f"; rolled back {back} of {len(switched)} device(s), the others still run the new bundle"
        return self._save(self.record.with_state("rolled_back", reason=reason))

    def _late_switches(self, switched: list[str]) -> list[str]:  # timed out, switched after all: sent back too
        found = late_switches(self.store, self.record, switched)
        self._update_devices({d: a["outcome"] for d, a in found.items()}, found)
        return sorted(found)

    def _answered_again(self, devices: list[str]) -> list[str]:
        """Devices whose newest answer is now a failure, taken into the record (rollout_answers.py)."""
        changed = later_failures(self.store, self.record, devices)
        self._update_devices({d: a["outcome"] for d, a in changed.items()}, changed)
        return sorted(changed)

    def _roll_back_models(self, switched: list[str]) -> dict[str, dict[str, Any]]:
        """Each deployed model back to its previous bundle (``rollback`` with ``args.model``), one model at a time;
        a device's answer is its first failed one, else its last."""
        answers: dict[str, dict[str, Any]] = {}
        for deploy in self.models:
            command_ids = {}
            for device in switched:
                command = build_command("rollback", {"model": deploy.model})
                self.publisher.send(self.fleet, device, command)
                command_ids[command["id"]] = device
                self._keep_alive()
            for device, answer in self._await_results(command_ids, "rollback_result", self.policy.deploy_timeout_s).items():
                if answers.get(device, {}).get("outcome", "succeeded") == "succeeded":
                    answers[device] = answer
        return answers


def _weighted_p99(rows: Sequence[Any]) -> float | None:
    weighted = [(r.p99_ms, r.inferences) for r in rows if r.p99_ms is not None and r.inferences > 0]
    total = sum(n for _, n in weighted)
    return sum(p * n for p, n in weighted) / total if total else None


def run_rollout(artifact: BundleArtifact, *, broker_url: str, store_url: str, devices: Sequence[str] | None = None,
                target: str | None = None, fleet: str | None = None, policy: RolloutPolicy = RolloutPolicy(),
                mqtt_version: str = "5", on_update: Callable[[RolloutRecord], None] | None = None,
                publisher_options: dict[str, Any] | None = None, models: Sequence[ModelDeploy] = (),
                pipeline: bool = False) -> RolloutRecord:  # fmt: skip
    """Select devices in the store at ``store_url``, check their targets, then run a :class:`Rollout`
    through ``broker_url``. Selection, target and wave errors are raised before anything is sent."""
    from edgekit.fleet.rollout_state import StoreRolloutLog
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store:
        selected = select_devices(store, devices=devices, target=target, fleet=fleet)
        online = [d for d in selected if policy.include_offline or d.state == "online"]
        for checked in [artifact] + [m.artifact for m in models[1:]]:
            check_targets(online, checked.target, bundle=checked.bundle_id, force=policy.force)
        if online:
            policy.plan(sorted(d.device for d in online))
        signed = bool((publisher_options or {}).get("signing_key"))
        with CommandPublisher(broker_url, mqtt_version=mqtt_version, **(publisher_options or {})) as publisher:  # type: ignore[arg-type]
            return Rollout(store, publisher, StoreRolloutLog(store), artifact, selected, policy, on_update=on_update,
                           signed_commands=signed, models=models, pipeline=pipeline).run()  # fmt: skip


__all__ = ["FAILURE_HINTS", "NoDevicesMatchError", "Rollout", "RolloutPolicy", "TargetMismatchError", "UnknownDeviceError",
           "check_targets", "failure_hint", "parse_waves", "run_rollout", "select_devices"]  # fmt: skip
