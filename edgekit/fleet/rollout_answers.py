"""What devices answered a rollout's commands: one answer per command, read from the store's events.

A device may answer one command more than once (an agent stopped during its health watch answers ``interrupted``,
then ``succeeded`` or ``rolled_back`` when it starts again), and answers arrive in any order. The answer kept is
the newest final one; ``interrupted`` (the new bundle is switched, its watch not finished) counts only while no final
one has come. An answer counts only from the device the command was sent to, and an outcome this edgekit does not
know is a failure (the device's own word kept as ``reported_outcome``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable

from edgekit.fleet.rollout_hints import failure_hint
from edgekit.fleet.rollout_state import KEPT_OUTCOMES
from edgekit.fleet.store.base import DeviceEvent
from edgekit.fleet.store_patience import patiently

#: The outcomes an agent answers a deploy or rollback with (agent/ota.py, agent/repository.py).
KNOWN_OUTCOMES = ("succeeded", "already_current", "failed", "rejected", "rolled_back", "interrupted")
#: How far a device's clock may lag the host's and its error events still count in a health gate.
EVENT_CLOCK_LAG = dt.timedelta(minutes=5)
#: An answer that leaves the command open: the bundle is switched and its watch will end at the agent's next start.
PROVISIONAL = ("interrupted",)


def answer_seconds(sent_at: str, answered_at: str | None) -> float | None:
    """Seconds from the host sending a command to the device answering it, by the device's clock for the answer:
    None without an answer, or when the answer is stamped before the command was sent (the device's clock lags
    the host's, so the figure would be negative and mean nothing)."""
    if not answered_at:
        return None
    seconds = (dt.datetime.fromisoformat(answered_at) - dt.datetime.fromisoformat(sent_at)).total_seconds()
    return round(seconds, 3) if seconds >= 0 else None


def answer_from(event: DeviceEvent, kind: str) -> dict[str, Any]:
    """What a device's answer to a command says: outcome, its own reason, the failed step and a hint."""
    details = event.payload.get("details") or {}
    step = details.get("step") if event.kind == kind else details.get("reason")
    reported = str(details.get("outcome") or ("rejected" if event.kind != kind else "failed"))
    outcome = reported if reported in KNOWN_OUTCOMES else "failed"
    if outcome == "rolled_back" and not step:
        step = "watching"  # the agent's own health watch rolled it back
    if outcome == "succeeded" and details.get("unchanged") is True:
        outcome = "already_current"  # the device served this bundle already: nothing switched, nothing to roll back
    reason = None if outcome == "succeeded" else event.message
    if outcome != reported and reported != "succeeded":
        reason = f"the device answered outcome {reported[:40]!r}, which this edgekit does not know: {event.message}"
    answer = {"outcome": outcome, "reason": reason, "step": step if isinstance(step, str) else None,
              "hint": failure_hint(step, event.message) if reason and outcome not in KEPT_OUTCOMES else None,
              "answered_at": event.at.isoformat()}  # fmt: skip
    if outcome != reported and not (reported == "succeeded" and outcome == "already_current"):
        answer["reported_outcome"] = reported[:80]
    return answer


def newest_answers(events: Iterable[DeviceEvent], command_ids: dict[str, str], kind: str) -> dict[str, dict[str, Any]]:
    """device -> its answer to the command it was sent (``command_ids``: command id -> device): the newest final
    answer, else the newest provisional one. Answers from another device than the command's are ignored."""
    found: dict[str, tuple[tuple[bool, Any], dict[str, Any]]] = {}
    for event in events:
        device = command_ids.get(event.command_id or "")
        if device is None or event.device != device or event.kind not in (kind, "command_rejected", "command_failed"):
            continue
        answer = answer_from(event, kind)
        rank = (answer["outcome"] not in PROVISIONAL, event.at)
        if device not in found or rank > found[device][0]:
            found[device] = (rank, answer)
    return {device: answer for device, (_, answer) in found.items()}


def answers_to_deploys(store: Any, record: Any, devices: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The newest answers to the deploy commands ``record`` sent ``devices`` (its ``device_results`` keep each
    command id), read again: a slow device's answer after the timeout, an agent's own watch rolling back later."""
    wanted = set(devices)
    ids = {result["command_id"]: device for device, result in record.device_results.items()
           if device in wanted and result.get("command_id")}  # fmt: skip
    if not ids:
        return {}
    events = patiently("reading answers", store.events, fleet=record.fleet, since=record.started_at - dt.timedelta(minutes=5),
                       limit=100_000)  # fmt: skip
    return newest_answers(events, ids, "deploy_result")


def late_switches(store: Any, record: Any, switched: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Devices recorded as ``timeout`` whose deploy answer came after all (a slow download) and switched: device ->
    that answer."""
    skip = set(switched)
    timed_out = [d for d, outcome in record.outcomes.items() if outcome == "timeout" and d not in skip]
    answers = answers_to_deploys(store, record, timed_out)
    return {d: {**a, "reason": "answered after the deploy timeout"} for d, a in answers.items()
            if a["outcome"] in ("succeeded", *PROVISIONAL)}  # fmt: skip


def later_failures(store: Any, record: Any, devices: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Devices on the new bundle whose newest answer is now a failure (an agent's own health watch rolled it back
    after it said succeeded): device -> that answer."""
    answers = answers_to_deploys(store, record, devices)
    return {d: a for d, a in answers.items() if a["outcome"] not in (*KEPT_OUTCOMES, *PROVISIONAL)
            and record.outcomes.get(d) in ("succeeded", "already_current", *PROVISIONAL)}  # fmt: skip


def refuse_a_second_rollout(log: Any, fleet: str) -> None:
    """Refuse to start while another rollout of ``fleet`` is in progress and still saving: two at once each judge
    the other's devices (a canary one of them rolled back is "already current" to the other) and both records lie.
    A rollout whose deploy ended without a word (``silent_s``) does not block."""
    from edgekit.fleet.rollout_bundle import RolloutError
    from edgekit.fleet.rollout_state import FINAL_STATES

    for record in log.recent(limit=20, fleet=fleet):
        if record.state not in FINAL_STATES and record.silent_s() is None:
            raise RolloutError(f"rollout {record.rollout_id} of {record.bundle_id} is {record.state} on fleet {fleet} "
                               f"(started {record.started_at:%Y-%m-%d %H:%M:%S} UTC); one rollout at a time per fleet",
                               hint=f"wait for it to end (edgekit fleet report --fleet {fleet} shows it), or stop its "
                                    "`fleet deploy` (Ctrl-C records it stopped)")  # fmt: skip


def all_final(answers: dict[str, dict[str, Any]], devices: Iterable[str]) -> bool:
    return all(device in answers and answers[device]["outcome"] not in PROVISIONAL for device in devices)


__all__ = ["EVENT_CLOCK_LAG", "KNOWN_OUTCOMES", "PROVISIONAL", "all_final", "answer_from", "answers_to_deploys", "late_switches",
           "later_failures", "newest_answers", "refuse_a_second_rollout"]
