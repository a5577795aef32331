"""The agent's outbox: telemetry windows and events reach the spool through it, in order. While the spool
cannot be written (a full disk) they wait in memory (at most ``telemetry.spool.overflow_messages``; past
that the oldest window is dropped, counted, and takes its ``seq`` once the spool is written again, a gap
the collector sees); events may use the spool's reserve, so they overtake refused windows. A part of
:class:`~edgekit_runtime.agent.service.AgentService`, which supplies the state named below.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from edgekit_runtime.agent.config import AgentConfig
from edgekit_runtime.agent.spool_space import window_start_of
from edgekit_runtime.agent.telemetry import encode_message
from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.schemas import validate_message

logger = logging.getLogger("edgekit_runtime.agent.service")

#: how often messages waiting in memory (the spool could not be written) are tried again
OUTBOX_RETRY_S = 1.0


class SpoolOutbox:
    """The ordered way from :class:`~edgekit_runtime.agent.service.AgentService` to the spool."""

    config: AgentConfig
    _link: Any
    _link_started: bool
    _spool: Any
    _events_lock: threading.Lock
    #: messages not yet on disk, oldest first: ("telemetry" | "event", message); guarded by ``_events_lock``
    _outbox: deque[tuple[str, dict[str, Any]]]
    _outbox_dropped_unrecorded: int
    _outbox_dropped_windows: list[str]
    _outbox_dropped_total: int
    _outbox_retry_at: float

    def _send(self, kind: str, message: dict[str, Any]) -> None:
        """Under ``_events_lock``: queue ``message`` behind any waiting ones and move what can go to the spool."""
        self._outbox.append((kind, message))
        limit = self.config.telemetry.spool.overflow_messages
        if len(self._outbox) > limit:  # the oldest window goes; events (deploy results, answers) only when all are
            index = next((i for i, (waiting, _) in enumerate(self._outbox) if waiting == "telemetry"), 0)
            dropped_kind, dropped = self._outbox[index]
            del self._outbox[index]
            if dropped_kind == "telemetry":  # it takes its seq once the spool is written again: a gap, reported
                self._outbox_dropped_windows.append(window_start_of(dropped) or "")  # "": not known
            else:
                self._outbox_dropped_unrecorded += 1
            self._outbox_dropped_total += 1
            logger.warning("spool not writable and %d messages wait in memory: dropped the oldest (%s; %d dropped so far)",
                           limit, dropped_kind, self._outbox_dropped_total)  # fmt: skip
        if len(self._outbox) == 1 or time.monotonic() >= self._outbox_retry_at:
            self._flush_outbox()

    def _flush_outbox(self) -> bool:
        """Under ``_events_lock``: spool waiting messages, oldest first; False while the spool refuses writes."""
        from edgekit_runtime.agent.spool import SpoolError

        while self._outbox:
            kind, message = self._outbox[0]
            try:
                if self._outbox_dropped_unrecorded:
                    self._spool.add_dropped(self._outbox_dropped_unrecorded)
                    self._outbox_dropped_unrecorded = 0
                if self._outbox_dropped_windows:
                    starts = self._outbox_dropped_windows
                    known: list[str | None] = [start for start in starts if start] or [None]
                    self._spool.drop_windows(len(starts), first_window_start=known[0], last_window_start=known[-1])
                    self._outbox_dropped_windows = []
                if kind == "telemetry":
                    self._store_telemetry(message)
                else:
                    self._link.publish_event(message)
            except SpoolError:
                if kind == "telemetry":  # a refused window: the events behind it may use the room kept for them
                    self._flush_events_behind()
                self._outbox_retry_at = time.monotonic() + OUTBOX_RETRY_S
                return False  # logged by the spool once; retried by the telemetry thread and the next send
            except EdgekitError as err:  # a message that can never be stored (a bug): do not block the rest
                logger.error("%s message dropped: %s", kind, err)
            self._outbox.popleft()
        return True

    def _flush_events_behind(self) -> None:
        """Under ``_events_lock``: spool the events waiting behind refused windows, ahead of them (an event is a
        vital write for the spool: it may use the headroom and reserve that windows may not)."""
        from edgekit_runtime.agent.spool import SpoolError

        for entry in [entry for entry in self._outbox if entry[0] != "telemetry"]:
            try:
                self._link.publish_event(entry[1])
            except SpoolError:
                return
            except EdgekitError as err:
                logger.error("event message dropped: %s", err)
            self._outbox.remove(entry)

    def _store_telemetry(self, message: dict[str, Any]) -> None:
        """Spool a window, taking its ``seq`` in the same commit (a window that is not stored uses no number)."""

        def encode(seq: int) -> bytes:
            message["seq"] = seq
            validate_message(message, "telemetry.v1", what=f"telemetry message seq {seq}")
            return encode_message(message)

        self._spool.append_numbered(self._link.topics.telemetry, encode)

    def retry_outbox(self) -> bool:
        """Try now to spool the messages waiting in memory; True when none wait any more."""
        with self._events_lock:
            return self._flush_outbox() if self._link_started else not self._outbox
