"""The records between the collector's network thread and its writer thread (:mod:`edgekit.fleet.collector`)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, NamedTuple

from edgekit.fleet.ingest import Rejection
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus, TelemetryWindow


class HandoffItem(NamedTuple):
    """A record from the network thread with what its acknowledgement needs (MQTT message id, QoS, connection)."""

    record: TelemetryWindow | DeviceStatus | DeviceEvent | Rejection
    mid: int
    qos: int
    generation: int


class Handoff:
    """The records between the network thread and the writer, with the writer woken once per batch.

    ``queue.Queue`` wakes a waiting consumer on every put, which at thousands of messages a second
    passes the GIL back and forth once per message. Here the writer says how many items it waits
    for (:meth:`take`); a put wakes it only when that many are queued, or for a control item (a
    flush's event, the stop marker), which it must see at once.
    """

    def __init__(self, maxsize: int) -> None:
        self._items: deque[Any] = deque()
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)
        self._drained = threading.Condition(self._lock)
        self._wanted = 1  # queued items that wake the writer
        self._controls = 0  # control items queued

    def put(self, item: Any, timeout: float | None = None) -> bool:
        """Queue ``item``, waiting up to ``timeout`` s (None: forever) while full; False if still full."""
        with self._lock:
            if len(self._items) >= self._maxsize and not self._drained.wait_for(
                    lambda: len(self._items) < self._maxsize, timeout):  # fmt: skip
                return False
            self._items.append(item)
            if not isinstance(item, HandoffItem):
                self._controls += 1
                self._filled.notify()
            elif len(self._items) >= self._wanted:
                self._filled.notify()
            return True

    def take(self, max_items: int, wanted: int, timeout: float) -> list[Any]:
        """Up to ``max_items`` items, in order, once ``wanted`` are queued (or a control item is), or after
        ``timeout`` s with what there is (maybe nothing)."""
        wanted = min(wanted, self._maxsize)  # a full queue wakes the writer whatever it asked for
        with self._lock:
            if len(self._items) < wanted and not self._controls and timeout > 0:
                self._wanted = wanted
                self._filled.wait(timeout)
                self._wanted = 1
            items = self._items
            taken = [items.popleft() for _ in range(min(max_items, len(items)))]
            if taken:
                if self._controls:
                    self._controls -= sum(1 for item in taken if not isinstance(item, HandoffItem))
                self._drained.notify_all()
            return taken

    def qsize(self) -> int:
        return len(self._items)


__all__ = ["Handoff", "HandoffItem"]
