"""Which rejected messages the collector keeps a row for: a bounded sample, so a flood of malformed messages
cannot grow the store (issue 28: about 6 GB an hour when every rejection was kept until retention).

Every rejection is still counted per reason as it arrives (the collector's ``/metrics`` counter
``rejected{reason}``). Rows in the store's rejected table are sampled per reason in fixed windows of
``window_s`` seconds: the first ``rows_per_reason`` rejections of a reason in a window keep their row
(topic, reason, detail, size) while the rows kept in that window, all reasons together, stay under
``max_bytes`` (topic and detail bytes plus :data:`ROW_OVERHEAD_BYTES`). The rest are summed, and when the
window ends one summary row per reason says how many messages (and bytes) were rejected without a row,
with the first and last time. So in one window the table grows by at most ``max_bytes`` plus one summary row
per reason, whatever arrives: with the defaults (10 rows a reason, 64 KiB, a minute) at most about 92 MiB a
day before retention, against about 144 GB at the measured flood.

Besides the ``rows_per_reason`` first rows of a reason, the first rejection of each other topic for that reason
in a window keeps a row too (within ``max_bytes``), so a device flooding a reason hides no other device's rejection.
Log lines are limited the same way by :class:`RejectionLog`.

Known gap: the store's per-reason totals (``FleetStore.rejected_counts``) add one per row, so a summary row
counts once although it stands for many messages; the exact numbers are in the summaries' details and the
collector's metrics until the store takes a count per row (the store's owner has been asked).
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edgekit.fleet.ingest import Rejection
from edgekit.fleet.store.base import RejectedMessage

#: What a stored row costs beyond its topic and detail (reason, size, time, row and index overhead), roughly.
ROW_OVERHEAD_BYTES = 96
#: The topic of a summary row: it stands for many messages, on whatever topics they came.
SUMMARY_TOPIC = "(rejected messages without a row)"
#: Rejections logged per reason and topic before only every LOG_EVERY-th of the reason is (:class:`RejectionLog`).
LOG_FIRST, LOG_EVERY = 10, 1000
#: First-rejection lines a reason may log a minute, over all topics; topics remembered (and characters of each).
LOG_LINES_PER_MINUTE, LOG_TOPICS, LOG_TOPIC_CHARS = 100, 4096, 256


@dataclass(frozen=True)
class RejectedSampling:
    """The bounds of the sample: rows per reason and bytes (all reasons) per window of ``window_s`` seconds."""

    rows_per_reason: int = 10
    max_bytes: int = 64 * 1024
    window_s: float = 60.0

    def __post_init__(self) -> None:
        from edgekit.fleet.errors import CollectorError

        for label, value, minimum in (("rows_per_reason", self.rows_per_reason, 0), ("max_bytes", self.max_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise CollectorError(f"rejected-message sampling: {label} must be an integer >= {minimum}, got {value!r}")
        if not self.window_s > 0:
            raise CollectorError(f"rejected-message sampling: window_s must be > 0, got {self.window_s!r}",
                                 hint="e.g. 60 (a minute)")  # fmt: skip


@dataclass
class _Unkept:
    count: int = 0
    size_bytes: int = 0
    first: dt.datetime | None = None
    last: dt.datetime | None = None


@dataclass
class _Window:
    started: float
    kept: dict[str, int] = field(default_factory=dict)
    kept_topics: set[tuple[str, str]] = field(default_factory=set)  # (reason, topic): at most max_bytes / 96 of them
    kept_bytes: int = 0
    unkept: dict[str, _Unkept] = field(default_factory=dict)


def row_bytes(rejection: Rejection) -> int:
    """What keeping ``rejection``'s row costs the store, roughly."""
    return len(rejection.topic[:1024].encode("utf-8", "replace")) + len(rejection.detail.encode("utf-8", "replace")) + ROW_OVERHEAD_BYTES


class RejectedSampler:
    """Decides, in the collector's writer thread (one thread: no locking), which rejections keep a row.

    :meth:`rows` takes the rejections of a batch and returns the rows to store: the sampled ones, then the
    summaries of windows that have ended. :meth:`due` returns those summaries alone (the writer asks when idle),
    :meth:`flush` every pending summary (at stop).
    """

    def __init__(self, sampling: RejectedSampling | None = None, *, clock: Callable[[], float] | None = None) -> None:
        import time

        self.sampling = sampling or RejectedSampling()
        self._clock = clock or time.monotonic
        self._window: _Window | None = None
        self.kept_total = 0
        self.unkept_total = 0

    def rows(self, rejections: Iterable[Rejection]) -> list[RejectedMessage]:
        found = []
        for rejection in rejections:
            found += self.due()  # a window that ended (even in the middle of a batch) is summed up first
            window = self._current()
            size = row_bytes(rejection)
            kept, on_topic = window.kept.get(rejection.reason, 0), (rejection.reason, rejection.topic)
            rows_per_reason = self.sampling.rows_per_reason  # 0: no rows at all
            if ((kept < rows_per_reason or (rows_per_reason and on_topic not in window.kept_topics))
                    and window.kept_bytes + size <= self.sampling.max_bytes):  # fmt: skip
                window.kept[rejection.reason] = kept + 1
                window.kept_topics.add(on_topic)
                window.kept_bytes += size
                self.kept_total += 1
                found.append(rejection.to_record())
                continue
            unkept = window.unkept.setdefault(rejection.reason, _Unkept())
            unkept.count += 1
            unkept.size_bytes += rejection.size_bytes
            unkept.first = unkept.first or rejection.received_at
            unkept.last = rejection.received_at
            self.unkept_total += 1
        return found

    def due(self) -> list[RejectedMessage]:
        """The summaries of a window that has ended (it is closed)."""
        window = self._window
        if window is None or self._clock() - window.started < self.sampling.window_s:
            return []
        return self.flush()

    def flush(self) -> list[RejectedMessage]:
        """The summaries of the open window, which is closed."""
        window, self._window = self._window, None
        if window is None:
            return []
        return [self._summary(reason, unkept, window) for reason, unkept in sorted(window.unkept.items())]

    def _current(self) -> _Window:
        if self._window is None or self._clock() - self._window.started >= self.sampling.window_s:
            self._window = _Window(started=self._clock())
        return self._window

    def _summary(self, reason: str, unkept: _Unkept, window: _Window) -> RejectedMessage:
        sampling = self.sampling
        first, last = unkept.first or dt.datetime.now(dt.timezone.utc), unkept.last or dt.datetime.now(dt.timezone.utc)
        detail = (f"{unkept.count} more '{reason}' messages ({unkept.size_bytes} bytes) from {first.isoformat()} to "
                  f"{last.isoformat()} were rejected without a row: {window.kept.get(reason, 0)} kept a row in this "
                  f"{sampling.window_s:g} s window (the first {sampling.rows_per_reason} of a reason and the first of each "
                  f"topic, within {sampling.max_bytes} bytes in all); every one is counted in the collector's rejected{{reason}} metric")  # fmt: skip
        return RejectedMessage(topic=SUMMARY_TOPIC, reason=reason, size_bytes=unkept.size_bytes, at=last,
                               detail=detail[:512], count=unkept.count)  # fmt: skip


class RejectionLog:
    """Which rejections the collector logs (called from its network thread only: no locking).

    The first :data:`LOG_FIRST` of a reason on each topic (so one device flooding a reason hides no other device's),
    at most :data:`LOG_LINES_PER_MINUTE` such lines a reason a minute (a flood on ever new topics cannot flood the
    log), and every :data:`LOG_EVERY`-th of a reason. The :data:`LOG_TOPICS` most recently rejected topics are
    remembered (one forgotten and rejected again is logged as new)."""

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        import time

        self._clock = clock or time.monotonic
        self._seen: dict[str, int] = {}  # reason -> rejections so far
        self._on_topic: OrderedDict[tuple[str, str], int] = OrderedDict()  # (reason, topic) -> rejections, LRU
        self._minute: dict[str, tuple[float, int]] = {}  # reason -> (its minute's start, first lines logged in it)

    def note(self, rejection: Rejection) -> int | None:
        """Count ``rejection``; the rejections of its reason so far when it is to be logged, else None."""
        reason = rejection.reason
        seen = self._seen[reason] = self._seen.get(reason, 0) + 1
        key = (reason, rejection.topic[:LOG_TOPIC_CHARS])
        on_topic = self._on_topic.pop(key, 0) + 1
        self._on_topic[key] = on_topic
        if len(self._on_topic) > LOG_TOPICS:
            self._on_topic.popitem(last=False)
        if seen % LOG_EVERY == 0:
            return seen
        if on_topic > LOG_FIRST:
            return None
        now = self._clock()
        started, lines = self._minute.get(reason, (now, 0))
        if now - started >= 60.0:
            started, lines = now, 0
        if lines >= LOG_LINES_PER_MINUTE:
            return None
        self._minute[reason] = (started, lines + 1)
        return seen


__all__ = ["LOG_EVERY", "LOG_FIRST", "LOG_LINES_PER_MINUTE", "LOG_TOPICS", "ROW_OVERHEAD_BYTES", "SUMMARY_TOPIC",
           "RejectedSampler", "RejectedSampling", "RejectionLog", "row_bytes"]
