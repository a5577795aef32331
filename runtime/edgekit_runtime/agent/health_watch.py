"""Step 6 of a deploy, the health watch, with its probation on disk (see :mod:`~edgekit_runtime.agent.probation`):
watch the new bundle, then keep it, roll it back, or (the agent stopping) answer ``interrupted`` and leave the
probation for the next start, which watches again or, after the bundle crashed the agent twice, rolls back.

:class:`HealthWatch` is the part of :class:`~edgekit_runtime.agent.ota.Deployer` that does this; it uses the
deployer's store, server, events and rollback.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from edgekit_runtime.agent.deploy_checks import signature_changes
from edgekit_runtime.agent.deploy_request import DeployRequest
from edgekit_runtime.agent.loading import LoadedBundle
from edgekit_runtime.agent.probation import (
    MAX_CRASHES,
    Probation,
    ProbationFile,
    counted_start,
    mark_stopped,
    unknown_watch,
)
from edgekit_runtime.bundle import self_check
from edgekit_runtime.errors import EdgekitError

if TYPE_CHECKING:
    from pathlib import Path

    from edgekit_runtime.agent.config import HealthConfig
    from edgekit_runtime.agent.deploy_state import ServedBundle, StagedDeploy
    from edgekit_runtime.agent.serving import InferenceServer
    from edgekit_runtime.agent.store import BundleStore


class HealthWatch:
    """The health watch and the probation of :class:`~edgekit_runtime.agent.ota.Deployer`."""

    store: BundleStore
    server: InferenceServer
    health: HealthConfig
    probation: ProbationFile
    last_self_check_passed: bool | None
    _stop: threading.Event
    _lock: threading.Lock
    _served: ServedBundle | None
    _resume: tuple[Probation, LoadedBundle] | None
    _pending_crash_result: Probation | None

    if TYPE_CHECKING:
        def _event(self, kind: str, message: str, *, level: str = "info", command_id: str | None = None,
                   **details: Any) -> None: ...
        def _remember_version(self, loaded: LoadedBundle) -> None: ...
        def _rollback_locked(self) -> ServedBundle: ...
        def _load(self, path: Path) -> LoadedBundle: ...

    def _probation_at_start(self) -> Probation | None:
        """The interrupted health watch of ``current``, counting this start; at :data:`MAX_CRASHES` crashes
        within it, roll the links back (before anything is loaded) and return None. Never None because the record
        could not be read or written: that would accept a bundle nobody watched (see :func:`unknown_watch`)."""
        current = self.store.current
        try:
            probation = counted_start(self.probation, current)
        except (EdgekitError, OSError) as err:
            problem = err.message if isinstance(err, EdgekitError) else f"{self.probation.path}: {err.strerror or err}"
            if current is None:
                self._event("probation_unreadable", f"the interrupted health watch cannot be resumed: {problem}; there "
                            "is no current bundle to watch", level="error", path=str(self.probation.path), error=str(err))  # fmt: skip
                return None
            probation = unknown_watch(current, self.store.previous, self.health.window_s)
            self._event("probation_unreadable", f"the interrupted health watch cannot be resumed: {problem}; watching "
                        f"{current.name} again for {probation.window_s:g} s before it counts as accepted (the record "
                        "exists only while a watch runs)", level="error", path=str(self.probation.path), error=str(err),
                        crashes=probation.crashes)  # fmt: skip
        if probation is not None:
            self._save_probation(probation)
        if probation is None or probation.crashes < MAX_CRASHES:
            return probation
        previous = self.store.previous
        why_not = "there is no previous bundle to roll back to" if previous is None else self._unloadable(previous)
        if why_not is not None:
            self._event("deploy_result", f"{probation.bundle} crashed the agent {probation.crashes} times within its health "
                        f"watch, but {why_not}; it keeps serving", level="error",
                        command_id=probation.command_id, outcome="failed", step="watching", crashes=probation.crashes)  # fmt: skip
            self.probation.clear()
            return None
        self.store.swap_current_and_previous()  # the previous bundle passed its checks first: a broken one moves nothing
        self._pending_crash_result = probation
        return None

    def _save_probation(self, probation: Probation) -> None:
        """Write the probation counted at this start; on a full disk it stays in memory and the watch goes on."""
        try:
            self.probation.write(probation)
        except OSError as err:
            self._event("probation_not_saved", f"the health watch of {probation.bundle} ({probation.crashes} crash(es) "
                        f"counted) could not be saved to {self.probation.path}: {err.strerror or err}; it is watched from "
                        "memory and the record on disk stays as it was", level="warning", path=str(self.probation.path),
                        error=str(err), crashes=probation.crashes, hint="free space on the bundle store's disk")  # fmt: skip

    def _unloadable(self, previous: Path) -> str | None:
        """Why ``previous`` cannot be rolled back to (it fails its checks or its load), or None when it can."""
        try:
            self._load(previous).runner.close()
        except EdgekitError as err:
            return f"the previous bundle at {previous} fails its checks ({err.message}), so it cannot be rolled back to"
        return None

    def _end_probation(self, probation: Probation | None, reason: str) -> None:
        """Say how a probation that is not resumed ended (a crash rollback, or the bundle failing at start)."""
        crashed, self._pending_crash_result = self._pending_crash_result, None
        if crashed is not None:
            restored = self._served.name if self._served else "nothing"
            self._event("deploy_result", f"rolled back to {restored}: {crashed.bundle} crashed the agent {crashed.crashes} "
                        f"times within its {crashed.window_s:g} s health watch", level="error",
                        command_id=crashed.command_id, outcome="rolled_back", bundle=restored, failed_bundle=crashed.bundle,
                        step="watching", crashes=crashed.crashes, url=crashed.url)  # fmt: skip
        elif probation is not None:
            self._event("deploy_result", f"{reason}; serving {self._served.name if self._served else 'nothing'} instead",
                        level="error", command_id=probation.command_id, outcome="rolled_back", failed_bundle=probation.bundle,
                        step="watching", crashes=probation.crashes, url=probation.url)  # fmt: skip
        self.probation.clear()

    @property
    def watch_pending(self) -> bool:
        return self._resume is not None

    def resume_watch(self) -> str | None:
        """Watch again the bundle whose health watch the agent's last run did not finish (see
        :mod:`~edgekit_runtime.agent.probation`); returns the outcome, or None when there was none."""
        with self._lock:
            pending, self._resume = self._resume, None
            if pending is None:
                return None
            probation, loaded = pending
            request = DeployRequest(probation.url, None, command_id=probation.command_id)
            self._event("deploy_progress", f"watching {loaded.name} again for {probation.window_s:g} s: the agent stopped "
                        f"during its health watch ({probation.crashes} crash(es) so far)", command_id=request.command_id,
                        step="watching", resumed=True, crashes=probation.crashes, window_s=probation.window_s)  # fmt: skip
            return self._watch(request, loaded, probation, can_roll_back=self.store.previous is not None,
                               window_s=probation.window_s, signature_changed=False, resumed=True)

    def _watch(self, request: DeployRequest, loaded: LoadedBundle, probation: Probation, *, can_roll_back: bool,
               window_s: float, signature_changed: bool, resumed: bool = False) -> str:
        """Step 6 with its probation on disk: watch ``window_s``, then keep the bundle, roll it back, or (the agent
        stopping) answer ``interrupted`` and leave the probation for the next start."""
        before = self.server.totals()
        started = time.monotonic()
        interrupted = self._stop.wait(window_s)
        healthy, details = self._judge(loaded, before, interrupted=interrupted, signature_changed=signature_changed)
        if details["interrupted"]:
            try:
                mark_stopped(self.probation, probation)
            except OSError as err:  # the record stays 'watching': the next start counts one crash more, never fewer
                self._event("probation_not_saved", f"the stop during the health watch of {loaded.name} could not be "
                            f"saved to {self.probation.path}: {err.strerror or err}", level="warning",
                            path=str(self.probation.path), error=str(err), hint="free space on the bundle store's disk")  # fmt: skip
            watched_s = round(time.monotonic() - started, 3)
            self._event("deploy_result", f"the health watch of {loaded.name} was interrupted by shutdown after {watched_s:g} "
                        f"of {window_s:g} s; it starts again when the agent does", level="warning",
                        command_id=request.command_id, outcome="interrupted", bundle=loaded.name, watched_s=watched_s,
                        health=details)  # fmt: skip
            return "interrupted"
        if not healthy:
            outcome = self._roll_back_after_watch(request, loaded, details, can_roll_back=can_roll_back)
            self.probation.clear()
            return outcome
        self._remember_version(loaded)
        self.store.prune()
        self.probation.clear()
        resumed_details: dict[str, Any] = {"resumed": True, "crashes": probation.crashes} if resumed else {}
        served_as = f" as {self._served.bundle_id}" if self._served else ""
        self._event("deploy_result", f"deployed {loaded.name}{served_as}", command_id=request.command_id, outcome="succeeded",
                    bundle=loaded.name, bundle_id=self._served.bundle_id if self._served else None,
                    **resumed_details)  # fmt: skip
        return "succeeded"

    def judge_health(self, staged: StagedDeploy, before: Any, *, interrupted: bool) -> tuple[bool, dict[str, Any]]:
        """Step 6, after the watch window: the live error rate since ``before`` (the server's totals when the
        window opened) and the self-check on the live runner."""
        signature_changed = staged.old_signature is not None and bool(signature_changes(staged.old_signature, staged.loaded.bundle.io))
        return self._judge(staged.loaded, before, interrupted=interrupted, signature_changed=signature_changed)

    def roll_back_after_watch(self, staged: StagedDeploy, previous_served: ServedBundle | None, details: dict[str, Any]) -> str:
        return self._roll_back_after_watch(staged.request, staged.loaded, details, can_roll_back=previous_served is not None)

    def _judge(self, loaded: LoadedBundle, before: Any, *, interrupted: bool, signature_changed: bool) -> tuple[bool, dict[str, Any]]:
        window_s = self.health.window_s
        after = self.server.totals()
        if interrupted:
            return True, {"interrupted": True, "requests": after.requests - before.requests, "errors": after.errors - before.errors}
        requests, errors = after.requests - before.requests, after.errors - before.errors
        rejected = after.rejected - before.rejected
        if signature_changed:  # the old clients' requests no longer fit: the deploy's fault, not theirs
            errors += rejected
        attempts = requests + errors
        error_rate = errors / attempts if attempts else None
        check = self.server.call_runner(lambda runner: self_check(loaded.bundle, runner, raise_on_failure=False))
        self.last_self_check_passed = check.passed
        details = {"requests": requests, "errors": errors, "error_rate": error_rate, "self_check_passed": check.passed,
                   "window_s": window_s, "interrupted": False, "rejected": rejected,
                   "rejected_count_as_errors": signature_changed}  # fmt: skip
        too_many_errors = error_rate is not None and attempts >= self.health.min_requests and error_rate > self.health.max_error_rate
        return (check.passed and not too_many_errors), details

    def _roll_back_after_watch(self, request: DeployRequest, failed: LoadedBundle, details: dict[str, Any], *,
                               can_roll_back: bool) -> str:  # fmt: skip
        if not details["self_check_passed"]:
            reason = "the self-check failed on the live model"
        else:
            attempts = details["requests"] + details["errors"]
            reason = f"error rate {details['error_rate']:.1%} over {attempts} request(s) is above {self.health.max_error_rate:.1%}"
            if details.get("rejected_count_as_errors") and details.get("rejected"):
                reason += f", counting {details['rejected']} request(s) rejected for not fitting its changed inputs"
        if not can_roll_back or self.store.previous is None:
            self._event("deploy_result", f"{failed.name} is unhealthy ({reason}) but there is no previous bundle to roll back to; "
                        "it keeps serving", level="error", command_id=request.command_id, outcome="failed", step="watching",
                        health=details)  # fmt: skip
            return "failed"
        self._event("deploy_progress", f"{failed.name} is unhealthy ({reason}); rolling back", level="warning",
                    command_id=request.command_id, step="rolling_back", health=details)  # fmt: skip
        try:
            restored = self._rollback_locked()
        except EdgekitError as err:
            self._event("deploy_result", f"{failed.name} is unhealthy ({reason}) and the rollback failed: {err.message}",
                        level="error", command_id=request.command_id, outcome="failed", step="rolling_back", error=str(err),
                        health=details)  # fmt: skip
            return "failed"
        self._event("deploy_result", f"rolled back to {restored.name}: {failed.name} was unhealthy ({reason})", level="warning",
                    command_id=request.command_id, outcome="rolled_back", bundle=restored.name, failed_bundle=failed.name,
                    health=details)  # fmt: skip
        return "rolled_back"
