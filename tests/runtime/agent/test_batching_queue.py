"""The dynamic batcher's grouping (agent/batching.py): requests that queued while the runner was busy join
the next group even with no delay to wait for them, within max_items and only with their own key."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np

from edgekit_runtime.agent.batching import BatchQueue, PendingRequest


def pending(items: int, key: str = "a") -> PendingRequest:
    return PendingRequest({"x": np.zeros((items, 2), np.float32)}, items, (key,), time.perf_counter_ns(), Future(), max_items=8)


def test_requests_queued_during_a_run_join_the_next_group_without_a_delay() -> None:
    groups: list[list[int]] = []
    first_running, release = threading.Event(), threading.Event()

    def run_group(group: list[PendingRequest]) -> None:
        groups.append([request.items for request in group])
        if len(groups) == 1:
            first_running.set()
            release.wait(10)
        for request in group:
            request.future.set_result(request.items)

    batcher = BatchQueue(run_group, max_delay_ms=0)
    try:
        first = pending(1)
        batcher.put(first)
        assert first_running.wait(10)
        waiting = [pending(items) for items in (1, 2, 3, 4)] + [pending(1, key="b")]
        for request in waiting:
            batcher.put(request)
        release.set()
        assert [request.future.result(10) for request in waiting] == [1, 2, 3, 4, 1]
    finally:
        batcher.close()
    # 1, then 1+2+3 (4 more would pass max_items 8), then 4 alone; the other key in a group of its own
    assert groups[0] == [1] and sorted(map(tuple, groups[1:])) == [(1,), (1, 2, 3), (4,)]
