"""How a rollout goes: :class:`RolloutPolicy` (the waves, the health gate's limits, the timeouts) and
:func:`parse_waves`, each value checked when the policy is made, so a bad one is refused before anything is sent."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.fleet.commands import CommandName, build_command
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.rollout_state import DEFAULT_DEPLOY_TIMEOUT_S, DEFAULT_PROGRESS_S
from edgekit_runtime.schemas import SchemaValidationError

if TYPE_CHECKING:
    from edgekit.fleet.rollout_models import ModelDeploy


def _count(spec: str, total: int, option: str) -> int:
    text = str(spec).strip()
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
        raise RolloutError(f"{option} {spec!r} is neither a share like '10%' nor a device count like '2'",
                           hint=f"e.g. {option} 10% (at least one device) or {option} 1") from None  # fmt: skip


def parse_waves(text: str) -> tuple[str, ...]:
    """``"1,10%,50%,100%"`` -> ``("1", "10%", "50%", "100%")``, each checked (sizes are resolved later)."""
    specs = tuple(part.strip() for part in str(text).split(","))
    if not specs or any(not s for s in specs):
        raise RolloutError(f"--waves {text!r} has an empty wave", hint="e.g. --waves 1,10%,50%,100%")
    for spec in specs:
        _count(spec, 100, "--waves")
    return specs


_SECONDS = "it must be a finite number of seconds above 0"
#: The policy's numbers: field, lowest, whether the lowest itself is refused, highest (or None), what it must be.
_LIMITS = (
    ("health_window_s", 0.0, True, None, _SECONDS),
    ("deploy_timeout_s", 0.0, True, None, _SECONDS),
    ("max_error_rate", 0.0, False, 1.0, "it must be a share of inferences from 0 to 1 (0.02 is 2 %)"),
    ("max_p99_ratio", 0.0, True, None, "it must be a finite ratio above 0 (1.5: p99 may grow by half)"),
    ("baseline_s", 0.0, True, None, _SECONDS),
    ("poll_s", 0.0, True, None, _SECONDS),
    ("progress_s", 0.0, True, None, _SECONDS),
)
_OPTIONS = {"health_window_s": "--health-window-s", "deploy_timeout_s": "--deploy-timeout-s",
            "max_error_rate": "--max-error-rate", "max_p99_ratio": "--max-p99-ratio"}  # fmt: skip
_EXAMPLES = {"health_window_s": "60", "deploy_timeout_s": "180", "max_error_rate": "0.02", "max_p99_ratio": "1.5",
             "baseline_s": "900", "poll_s": "0.5", "progress_s": "5"}  # fmt: skip


@dataclass(frozen=True)
class RolloutPolicy:
    """How to roll out, when to go on and when to stop.

    ``waves``: cumulative sizes, each a share (``"10%"``) or a device count (``"2"``) of the devices
    deployed to; the last must reach all of them. Without ``waves``, ``(canary, "100%")``.
    """

    canary: str = "10%"
    waves: tuple[str, ...] | None = None
    health_window_s: float = 60.0
    deploy_timeout_s: float = DEFAULT_DEPLOY_TIMEOUT_S
    max_error_rate: float = 0.02
    max_p99_ratio: float = 1.5
    baseline_s: float = 900.0
    poll_s: float = 0.5
    progress_s: float = DEFAULT_PROGRESS_S
    include_offline: bool = False
    force: bool = False
    allow_downgrade: bool = False
    allow_signature_change: bool = False

    def __post_init__(self) -> None:
        """Refuse a limit or a duration that would disable the gate or break the rollout after its first wave went out
        (NaN compares false with every limit, so ``max_error_rate=nan`` let any error rate pass)."""
        for name, low, low_refused, high, what in _LIMITS:
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < low or (low_refused and value == low) or (high is not None and value > high):
                option = _OPTIONS.get(name)
                raise RolloutError(f"{f'{option} ({name})' if option else f'RolloutPolicy.{name}'} is {value!r}: {what}; "
                                   "nothing was sent", hint=f"e.g. {option} {_EXAMPLES[name]}" if option else
                                   f"e.g. RolloutPolicy({name}={_EXAMPLES[name]})")  # fmt: skip

    def canary_count(self, total: int) -> int:
        return _count(self.canary, total, "--canary")

    def wave_specs(self) -> tuple[str, ...]:
        return tuple(self.waves) if self.waves else (self.canary, "100%")

    def plan(self, devices: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
        """(spec, devices) per wave, in order: each wave adds the devices up to its cumulative size; a
        wave that adds none (``1,10%`` of 5 devices) is left out."""
        total, specs = len(devices), self.wave_specs()
        option = "--waves" if self.waves else "--canary"
        sizes = [_count(spec, total, option) if self.waves else (self.canary_count(total) if i == 0 else total)
                 for i, spec in enumerate(specs)]  # fmt: skip
        for index in range(1, len(sizes)):
            if sizes[index] < sizes[index - 1]:
                raise RolloutError(
                    f"--waves {','.join(specs)}: waves are cumulative, but wave {index + 1} ({specs[index]} = {sizes[index]} "
                    f"device(s)) is smaller than wave {index} ({specs[index - 1]} = {sizes[index - 1]})",
                    hint="list growing sizes, e.g. --waves 1,10%,50%,100%",
                )  # fmt: skip
        if sizes[-1] < total:
            raise RolloutError(f"--waves {','.join(specs)}: the last wave reaches {sizes[-1]} of the {total} device(s)",
                               hint="end the waves with 100%, or select fewer devices with --devices")  # fmt: skip
        plan, done = [], 0
        for spec, size in zip(specs, sizes):
            if size > done:
                plan.append((spec, tuple(devices[done:size])))
                done = size
        return plan

    def dropped_waves(self, devices: Sequence[str]) -> list[dict[str, Any]]:
        """The waves :meth:`plan` leaves out because they add no device (``1,10%`` of 5 devices: 10 % is one
        device, which wave 1 already has), each with its spec and why, so the rollout can say so."""
        total, kept = len(devices), {spec for spec, _ in self.plan(devices)}
        option = "--waves" if self.waves else "--canary"
        dropped, reached = [], 0
        for index, spec in enumerate(self.wave_specs()):
            size = _count(spec, total, option) if self.waves else (self.canary_count(total) if index == 0 else total)
            if size <= reached and spec not in kept:
                dropped.append({"index": index + 1, "spec": spec,
                                "reason": f"{spec} of {total} device(s) is {size}, which earlier waves already reach"})
            reached = max(reached, size)
        return dropped


#: The option that sets each field of a deploy command's args, and how to fix a value the command schema refuses.
_COMMAND_FIELDS = {
    "url": ("--url-base", "devices download over https://, http:// or file://: give --url-base https://HOST/PATH, or --inbox DIR"),
    "bundle_id": ("--bundle-id", "give --bundle-id of 1 to 128 characters, or leave it out (default <name>-<12 hex of the manifest hash>)"),
    "model": ("--model", "a model name is a letter or digit, then up to 63 letters, digits, '_', '.' or '-'"),
}  # fmt: skip


def deploy_command(artifact: BundleArtifact, models: Sequence[ModelDeploy], policy: RolloutPolicy, *,
                   pipeline: bool) -> tuple[CommandName, dict[str, Any]]:  # fmt: skip
    """The name and args of the deploy command a rollout sends every device, one built and checked against the command
    schema: a value no device would take (an ``ftp://`` URL, a 300-character bundle id) is a :class:`RolloutError`
    naming the option, before anything is saved or sent."""
    flags = {"allow_downgrade": policy.allow_downgrade, "allow_signature_change": policy.allow_signature_change}
    name: CommandName = "deploy"
    args = artifact.deploy_args(**flags)
    if pipeline:
        name, args = "deploy_pipeline", {"deploys": [{**m.artifact.deploy_args(**flags), "model": m.model} for m in models]}
    elif models:
        args = {**args, "model": models[0].model}
    try:
        build_command(name, args)
    except SchemaValidationError as exc:
        problem = exc.problems[0] if exc.problems else exc.message
        found = re.match(r"args(?:\.deploys\[\d+\])?\.(\w+)", problem)
        option, fix = _COMMAND_FIELDS.get(found.group(1) if found else "", ("the bundle", exc.hint or ""))
        raise RolloutError(f"{option}: devices would refuse the {name} command: {problem}; nothing was sent", hint=fix) from None
    return name, args


__all__ = ["RolloutPolicy", "deploy_command", "parse_waves"]
