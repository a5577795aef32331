"""When a spooled message may leave the spool: on the broker's PUBACK, or once the collector has stored it.

Two modes (the agent's ``telemetry.delivery``):

* ``collector_ack`` (the agent's default): a telemetry window stays in the spool after the broker's
  PUBACK, *awaiting* the collector. The collector publishes an ``ack.v1`` message on the device's
  ``.../ack`` topic after each batch it commits, naming the seqs it holds; the windows named there
  are removed. A broker that crashes (``kill -9``), runs without persistence or restarts from an old
  snapshot therefore loses nothing: what it lost is still in the spools and is published again.
  Events still leave on the PUBACK (they carry no seq to acknowledge).
* ``broker_ack`` (the behaviour before issue 28, and :class:`~edgekit_runtime.agent.mqtt.MqttLink`'s
  default): every message leaves on its PUBACK. Use it with a collector that publishes no acks (one
  older than ``ack.v1``); with ``collector_ack`` such a collector's windows would wait in the spool
  until its bound drops the oldest, and be published again and again meanwhile.

Publishing again: a window the broker has acknowledged but the collector has not confirmed is
published again

* ``hole_grace_s`` after it was last sent (doubling with each send up to ``resend_max_s``) once the
  collector has confirmed a *later* window of this device: the collector is there, so this one went
  missing (a broker crash, a broker restarted without the collector's session, ...);
* the newest such window alone, ``resend_after_s`` after it was last sent (doubling the same way), as a
  probe for an agent that publishes nothing new: once the collector confirms it, the older ones are a
  hole and follow.

A reconnect sends again only what the broker had not acknowledged, as before. So while the collector
is away an agent publishes one probe per ``resend_max_s`` at most, not its whole spool again and again
into the broker's queue for the collector. After an agent restart the whole spool goes out once (the
tracker starts empty). The collector stores each (fleet, device, seq) once, so publishing again costs
bandwidth, never a duplicate. While the collector is away nothing is confirmed and the spool grows to its bound
(``telemetry.spool.max_messages`` / ``max_bytes``); past it the oldest windows are dropped and
counted in the spool's ``dropped`` counter (the next window's ``spool.dropped``), exactly as when
the broker is away.

The tracker is used from the link's network thread only (:meth:`DeliveryTracker.counters` may be
read from any thread).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from edgekit_runtime.agent.spool import Spool, SpoolEntry
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.agent.topics import DeviceTopics, TelemetryError
from edgekit_runtime.agent.wire import JsonLimitError, loads_limited
from edgekit_runtime.schemas import schema_problems

logger = logging.getLogger(__name__)

DeliveryMode = Literal["collector_ack", "broker_ack"]
DELIVERY_MODES: tuple[DeliveryMode, ...] = ("collector_ack", "broker_ack")
DEFAULT_RESEND_AFTER_S = 30.0
DEFAULT_RESEND_MAX_S = 300.0
DEFAULT_HOLE_GRACE_S = 5.0
#: Largest ack payload parsed (256 ranges of two 20-digit numbers are under 11 KB).
MAX_ACK_BYTES = 16 * 1024
_MAX_ACK_DEPTH = 4
#: Confirmed seqs kept for windows not (yet) tracked, as merged ranges; the oldest go first.
_REMEMBERED_RANGES = 64
#: Least time between two looks for windows older than the newest confirmed one.
_HOLE_SCAN_EVERY_S = 0.5
#: How often the "no confirmation from the collector" warning may repeat.
_SILENCE_WARNING_S = 1800.0


@dataclass(frozen=True)
class DeliveryCounters:
    """What the tracker has seen since the link started. ``awaiting``: windows sent, not yet confirmed
    by the collector; ``confirmed``: windows removed on a collector ack; ``resent``: windows published
    again after a timeout or a hole (reconnects not counted)."""

    mode: str
    awaiting: int
    confirmed: int
    resent: int
    acks_received: int
    acks_refused: int
    last_ack_at: str | None  # when the last valid ack came (UTC)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "awaiting": self.awaiting, "confirmed": self.confirmed, "resent": self.resent,
                "acks_received": self.acks_received, "acks_refused": self.acks_refused,
                "last_ack_at": self.last_ack_at}  # fmt: skip


@dataclass
class _Sent:
    seq: int
    sent_at: float
    sends: int


def check_delivery_mode(mode: object) -> DeliveryMode:
    if mode not in DELIVERY_MODES:
        raise TelemetryError(f"delivery must be one of {', '.join(DELIVERY_MODES)}, got {mode!r}",
                             hint="collector_ack keeps windows until the collector stored them; broker_ack is for "
                                  "a collector that publishes no acks")  # fmt: skip
    return mode  # type: ignore[return-value]


class DeliveryTracker:
    """Decides which spool entries leave, and which are published again; see the module docstring."""

    def __init__(
        self,
        topics: DeviceTopics,
        spool: Spool,
        mode: DeliveryMode = "broker_ack",
        *,
        resend_after_s: float = DEFAULT_RESEND_AFTER_S,
        resend_max_s: float = DEFAULT_RESEND_MAX_S,
        hole_grace_s: float = DEFAULT_HOLE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = check_delivery_mode(mode)
        for label, value in (("resend_after_s", resend_after_s), ("resend_max_s", resend_max_s),
                             ("hole_grace_s", hole_grace_s)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise TelemetryError(f"delivery {label} must be a number > 0, got {value!r}")
        self.topics, self.spool = topics, spool
        self._resend_after_s, self._resend_max_s = float(resend_after_s), float(max(resend_max_s, resend_after_s))
        self._hole_grace_s = float(hole_grace_s)
        self._clock = clock
        self._sent: dict[int, _Sent] = {}  # spool id -> the window's seq and sends, in spool order
        self._by_seq: dict[int, int] = {}  # seq -> spool id
        self._remembered: list[tuple[int, int]] = []  # confirmed seqs not tracked when the ack came
        self._highest_confirmed = 0
        self._hole_check = False
        self._next_hole_scan = 0.0
        self._last_confirmation = clock()
        self._warned_at: float | None = None
        self._counts = {"confirmed": 0, "resent": 0, "acks_received": 0, "acks_refused": 0}
        self._last_ack_at: str | None = None

    @property
    def waits_for_collector(self) -> bool:
        return self.mode == "collector_ack"

    def counters(self) -> DeliveryCounters:
        counts = dict(self._counts)
        return DeliveryCounters(mode=self.mode, awaiting=len(self._sent), last_ack_at=self._last_ack_at, **counts)

    # -- publishing ---------------------------------------------------------------------------

    def already_confirmed(self, entry: SpoolEntry) -> bool:
        """Whether the collector confirmed ``entry`` before it was (re)sent; the caller then removes it."""
        if not self.waits_for_collector or entry.topic != self.topics.telemetry:
            return False
        seq = _seq_of(entry.payload)
        return seq is not None and any(first <= seq <= last for first, last in self._remembered)

    def sent(self, entry: SpoolEntry, *, resend: bool = False) -> None:
        """``entry`` was handed to the broker (again)."""
        if not self.waits_for_collector or entry.topic != self.topics.telemetry:
            return
        known = self._sent.get(entry.id)
        seq = known.seq if known is not None else _seq_of(entry.payload)
        if seq is None:
            return  # no seq to be confirmed by: it leaves on its PUBACK
        now = self._clock()
        sends = known.sends + 1 if known is not None else 1
        self._sent[entry.id] = _Sent(seq, now, sends)
        self._by_seq[seq] = entry.id
        if known is None and len(self._sent) > self.spool.max_messages:
            # the spool holds no more than this: the oldest tracked windows were dropped by its bound
            self.forget(list(self._sent)[: len(self._sent) - self.spool.max_messages])
        if resend:
            self._counts["resent"] += 1

    def take_due(self, limit: int) -> list[SpoolEntry]:
        """Up to ``limit`` awaiting windows to publish again now, oldest first."""
        if not self.waits_for_collector or limit <= 0 or not self._sent:
            return []
        now = self._clock()
        due: set[int] = set()
        newest_id = next(reversed(self._sent))  # the probe
        newest = self._sent[newest_id]
        if now - newest.sent_at >= self._delay(newest.sends, self._resend_after_s):
            due.add(newest_id)
        if self._hole_check and len(due) < limit and now >= self._next_hole_scan:
            self._hole_check, self._next_hole_scan = False, now + _HOLE_SCAN_EVERY_S
            for entry_id, known in self._sent.items():
                if known.seq >= self._highest_confirmed or len(due) >= limit:
                    break
                self._hole_check = True  # still below the newest confirmed window: look again later
                if now - known.sent_at >= self._delay(known.sends, self._hole_grace_s):
                    due.add(entry_id)
        self._warn_if_silent(now)
        if not due:
            return []
        entries = self.spool.entries(sorted(due))
        self.forget(due - {entry.id for entry in entries})  # dropped by the spool's bound meanwhile
        return entries

    def settle(self, delivered: Iterable[tuple[int, str]], refused: Iterable[int]) -> None:
        """The broker acknowledged ``delivered`` (spool id, topic) and refused ``refused``: remove what
        does not wait for the collector, and everything refused."""
        leaving = list(refused)
        self.forget(leaving)
        for entry_id, topic in delivered:
            if entry_id not in self._sent:
                leaving.append(entry_id)
        self.spool.ack_many(leaving)

    def forget(self, entry_ids: Iterable[int]) -> None:
        for entry_id in entry_ids:
            known = self._sent.pop(entry_id, None)
            if known is not None and self._by_seq.get(known.seq) == entry_id:
                del self._by_seq[known.seq]

    # -- acks from the collector --------------------------------------------------------------

    def ack_received(self, payload: bytes) -> int:
        """Apply one ``ack.v1`` message: remove the confirmed windows; returns how many were removed."""
        ranges = self._checked_ranges(payload)
        if ranges is None:
            return 0
        self._counts["acks_received"] += 1
        self._last_ack_at = utc_timestamp()
        confirmed: list[int] = []
        for first, last in ranges:
            if last - first + 1 <= len(self._by_seq):
                seqs: Iterable[int] = range(first, last + 1)
            else:
                seqs = [seq for seq in self._by_seq if first <= seq <= last]
            for seq in seqs:
                entry_id = self._by_seq.pop(seq, None)
                if entry_id is not None:
                    self._sent.pop(entry_id, None)
                    confirmed.append(entry_id)
            self._remember(first, last)
            self._highest_confirmed = max(self._highest_confirmed, last)
        self._hole_check = True
        if confirmed:
            self._last_confirmation = self._clock()
            self.spool.ack_many(confirmed)  # while the disk is full the spool defers the removal itself
            self._counts["confirmed"] += len(confirmed)
        return len(confirmed)

    def _checked_ranges(self, payload: bytes) -> list[tuple[int, int]] | None:
        """The ranges of a valid ack for this device, else None (logged and counted)."""
        try:
            ack = loads_limited(payload, what="ack payload", max_bytes=MAX_ACK_BYTES, max_depth=_MAX_ACK_DEPTH)
        except JsonLimitError as err:
            return self._refuse(err.message)
        problems = schema_problems(ack, "ack.v1", limit=3)
        if problems:
            return self._refuse(f"does not match schema ack.v1: {'; '.join(problems)}")
        if ack["fleet"] != self.topics.fleet or ack["device"] != self.topics.device:
            return self._refuse(f"names {ack['fleet']!r}/{ack['device']!r}, not this device")
        ranges = [(int(first), int(last)) for first, last in ack["stored"]]
        if any(first > last for first, last in ranges):
            return self._refuse(f"has a range whose first seq is past its last: {ranges[:5]}")
        return ranges

    def _refuse(self, problem: str) -> None:
        self._counts["acks_refused"] += 1
        refused = self._counts["acks_refused"]
        if refused <= 10 or refused % 1000 == 0:
            logger.warning("ignored an ack on %s (%d so far): %s", self.topics.ack, refused, problem[:300])
        return None

    def _remember(self, first: int, last: int) -> None:
        merged: list[tuple[int, int]] = []
        for low, high in sorted([*self._remembered, (first, last)]):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        self._remembered = merged[-_REMEMBERED_RANGES:]

    # -- helpers ------------------------------------------------------------------------------

    def _delay(self, sends: int, base_s: float) -> float:
        return float(min(base_s * 2 ** min(sends - 1, 30), self._resend_max_s))

    def _warn_if_silent(self, now: float) -> None:
        if not self._sent or now - self._last_confirmation < self._resend_max_s:
            return
        if self._warned_at is not None and now - self._warned_at < _SILENCE_WARNING_S:
            return
        self._warned_at = now
        logger.warning(
            "%d telemetry window(s) wait for the collector's ack on %s; none came for %.0f s. If the collector is "
            "running it may predate ack.v1: set telemetry.delivery: broker_ack (the spool keeps at most its "
            "bound and drops the oldest past it)", len(self._sent), self.topics.ack, now - self._last_confirmation,
        )  # fmt: skip


def _seq_of(payload: bytes) -> int | None:
    try:
        seq = json.loads(payload).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1 else None


__all__ = [
    "DEFAULT_HOLE_GRACE_S", "DEFAULT_RESEND_AFTER_S", "DEFAULT_RESEND_MAX_S", "DELIVERY_MODES", "DeliveryCounters",
    "DeliveryMode", "DeliveryTracker", "MAX_ACK_BYTES", "check_delivery_mode",
]  # fmt: skip
