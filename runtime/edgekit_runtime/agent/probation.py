"""The health watch that survives the agent: a deploy's probation, kept on disk beside its bundle store.

When a deploy switches to a new bundle and starts its health watch, the deployer writes
``<store>/probation.json`` (:class:`Probation`: which version is on probation, the version before it, the
command and the watch window) with ``state: watching``. The record goes when the watch ends: the deploy
stays (``finish``) or is rolled back.

* SIGTERM (or any stop of the agent) while watching: the deploy answers ``deploy_result`` with outcome
  ``interrupted`` (never ``succeeded``) and the record says ``state: stopped``.
* A crash while watching (``kill -9``, the OOM killer, a segfault in the model's runtime, a power cut)
  leaves ``state: watching``: the process never got to say otherwise.

At the next start (:func:`counted_start`) a record about the bundle ``current`` names is picked up: a record
still ``watching`` counts one crash. Below :data:`MAX_CRASHES` the bundle is served and its watch starts
again with its full window (``Deployer.resume_watch``, spawned by :func:`resume_watches`); at
:data:`MAX_CRASHES` the agent rolls back to the version before it before loading anything, and the
``deploy_result`` (outcome ``rolled_back``) says the bundle crashed the agent that many times within its
watch. A record about another version (the links were moved by hand) is stale and dropped.

The start never accepts a watched bundle without watching it: when the counted record cannot be written back
(a full disk) the watch resumes from the record in memory, and when ``probation.json`` cannot be read at all
``current`` is watched again as if its watch had been cut short once (:func:`unknown_watch`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.agent.store import fsync_dir

logger = logging.getLogger(__name__)

PROBATION_NAME = "probation.json"
#: Crashes within one watch that roll the bundle back at the next start.
MAX_CRASHES = 2
WATCHING, STOPPED = "watching", "stopped"


@dataclass(frozen=True)
class Probation:
    """A deploy under its health watch: ``version`` (the version folder ``current`` names) replaced
    ``previous``; ``crashes`` counts the agent's deaths while watching it."""

    version: str
    bundle: str
    previous: str | None
    url: str
    command_id: str | None
    window_s: float
    state: str = WATCHING
    crashes: int = 0
    started_at_s: float = 0.0

    @classmethod
    def from_dict(cls, data: Any) -> Probation:
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        fields = {name: data.get(name) for name in cls.__dataclass_fields__}
        if not isinstance(fields["version"], str) or not isinstance(fields["bundle"], str) or not isinstance(fields["url"], str):
            raise ValueError("version, bundle and url must be strings")
        if fields["state"] not in (WATCHING, STOPPED):
            raise ValueError(f"state must be {WATCHING!r} or {STOPPED!r}, got {fields['state']!r}")
        crashes, window_s = fields["crashes"], fields["window_s"]
        if isinstance(crashes, bool) or not isinstance(crashes, int) or crashes < 0:
            raise ValueError(f"crashes must be a count, got {crashes!r}")
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or window_s < 0:
            raise ValueError(f"window_s must be a number of seconds, got {window_s!r}")
        started_at_s = fields["started_at_s"]
        if started_at_s is not None and (isinstance(started_at_s, bool) or not isinstance(started_at_s, (int, float))):
            raise ValueError(f"started_at_s must be a time in seconds, got {started_at_s!r}")
        previous, command_id = fields["previous"], fields["command_id"]
        return cls(version=fields["version"], bundle=fields["bundle"], url=fields["url"],
                   previous=previous if isinstance(previous, str) else None,
                   command_id=command_id if isinstance(command_id, str) else None, window_s=float(window_s),
                   state=fields["state"], crashes=crashes, started_at_s=float(fields["started_at_s"] or 0.0))  # fmt: skip


class ProbationFile:
    """``probation.json`` of one bundle store: written atomically (temporary file, fsync, rename, fsync of the
    folder), so a crash leaves the old record or the new one, never half of one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> Probation | None:
        """The record, or None when there is none. An unreadable one raises :class:`DeployError` naming the file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise self._broken(err.strerror or str(err)) from err
        try:  # random bytes are a UnicodeDecodeError, a ValueError
            return Probation.from_dict(json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, RecursionError) as err:  # damaged: any shape, any depth
            raise self._broken(str(err) or type(err).__name__) from err

    def _broken(self, problem: str) -> DeployError:
        return DeployError(f"the deploy probation record '{self.path}' cannot be read: {problem}",
                           hint="it is rewritten by the next deploy; delete it to forget the interrupted health watch")  # fmt: skip

    def write(self, probation: Probation) -> None:
        partial = self.path.with_name(f".{self.path.name}.partial")
        try:
            with partial.open("w", encoding="utf-8") as handle:
                json.dump(asdict(probation), handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, self.path)
        except OSError:  # a full disk: the old record (or none) stays, no partial file left behind
            partial.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)


def begin(file: ProbationFile, *, version_dir: Path, bundle: str, previous: Path | None, url: str,
          command_id: str | None, window_s: float) -> Probation:
    """Record that ``version_dir`` is now watched (state ``watching``, no crash yet)."""
    probation = Probation(version=version_dir.name, bundle=bundle, previous=None if previous is None else previous.name,
                          url=url, command_id=command_id, window_s=window_s, started_at_s=round(time.time(), 3))  # fmt: skip
    file.write(probation)
    return probation


def counted_start(file: ProbationFile, current: Path | None) -> Probation | None:
    """At the agent's start: the probation of ``current`` with this start counted (a record left ``watching``
    means the last process died while watching: one more crash), in state ``watching``, not yet written back;
    None when there is no probation for ``current`` (a stale record about another version is dropped)."""
    probation = file.read()
    if probation is None:
        return None
    if current is None or current.name != probation.version:
        logger.info("dropping the probation record of %s: current is %s", probation.version, current)
        file.clear()
        return None
    crashes = probation.crashes + (1 if probation.state == WATCHING else 0)
    return replace(probation, crashes=crashes, state=WATCHING)


def unknown_watch(current: Path, previous: Path | None, window_s: float) -> Probation:
    """The probation assumed for ``current`` when ``probation.json`` cannot be read: a record exists only while a
    health watch runs, so a watch was cut short, most likely of ``current``; it counts as one crash and is watched
    again for the configured window before its version counts as accepted."""
    return Probation(version=current.name, bundle=current.name, previous=None if previous is None else previous.name,
                     url="", command_id=None, window_s=window_s, crashes=1, started_at_s=round(time.time(), 3))  # fmt: skip


def mark_stopped(file: ProbationFile, probation: Probation) -> None:
    """The agent is stopping while watching: not a crash, and the watch starts again at the next start."""
    file.write(replace(probation, state=STOPPED))


def resume_watches(slots: Iterable[Any], spawn: Callable[[str, Callable[[], object]], None]) -> None:
    """Start the interrupted health watch of every model slot that has one (``spawn(name, work)`` runs it)."""
    for slot in slots:
        if slot.deployer.watch_pending:
            spawn("edgekit-watch", slot.deployer.resume_watch)
