"""A model's statistics since it started serving, as the Open Inference Protocol's statistics extension
(Triton's ``ModelStatistics``) reports them: counts and nanoseconds that only grow.

:class:`~edgekit_runtime.agent.serving.InferenceServer` keeps windows of statistics for telemetry; every
request that enters a window also enters one :class:`LifetimeStats` (under the server's statistics lock),
which windows never reset. Per request: its whole time (``success``), its wait for the runner or for a
batch to fill (``queue``) and the runner call that served it (``compute_infer``); per runner call, by the
number of items (batch rows) it held: how many calls of that size ran and their time (``batch_stats``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

#: a perf_counter_ns stamp plus this is nanoseconds since the epoch (for ``last_inference``)
_EPOCH_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


@dataclass
class LifetimeStats:
    """Counts and nanoseconds since the model started; not thread-safe (the server's stats lock guards it)."""

    requests: int = 0
    items: int = 0
    runner_calls: int = 0
    failures: int = 0
    request_ns: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    last_finished_ns: int = 0  # a perf_counter_ns stamp; 0 before the first request
    #: items in one runner call -> [calls, their nanoseconds]
    batches: dict[int, list[int]] = field(default_factory=dict)

    def add_request(self, submitted_ns: int, started_ns: int, finished_ns: int, items: int) -> None:
        self.requests += 1
        self.items += items
        self.request_ns += finished_ns - submitted_ns
        self.queue_ns += started_ns - submitted_ns
        self.compute_ns += finished_ns - started_ns
        if finished_ns > self.last_finished_ns:
            self.last_finished_ns = finished_ns

    def add_call(self, items: int, compute_ns: int) -> None:
        """One runner call of ``items`` rows that took ``compute_ns``."""
        self.runner_calls += 1
        entry = self.batches.get(items)
        if entry is None:
            self.batches[items] = [1, compute_ns]
        else:
            entry[0] += 1
            entry[1] += compute_ns

    def add_unsampled(self, items: int) -> None:
        """A request counted without its times (the server's sample list was full)."""
        self.requests += 1
        self.items += items
        self.runner_calls += 1

    def to_protocol(self, name: str, version: str) -> dict[str, Any]:
        """One entry of ``model_stats`` in the protocol's JSON form (the gRPC message's fields, by name)."""
        count = self.requests

        def duration(calls: int, ns: int) -> dict[str, int]:
            return {"count": calls, "ns": ns}

        last_ms = (self.last_finished_ns + _EPOCH_OFFSET_NS) // 1_000_000 if self.last_finished_ns else 0
        return {
            "name": name,
            "version": version,
            "last_inference": last_ms,
            "inference_count": self.items,
            "execution_count": self.runner_calls,
            "inference_stats": {
                "success": duration(count, self.request_ns),
                "fail": duration(self.failures, 0),
                "queue": duration(count, self.queue_ns),
                "compute_input": duration(count, 0),  # inputs go to the runner as they are: no copy to time
                "compute_infer": duration(count, self.compute_ns),
                "compute_output": duration(count, 0),
                "cache_hit": duration(0, 0),
                "cache_miss": duration(0, 0),
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": duration(calls, 0), "compute_infer": duration(calls, ns),
                 "compute_output": duration(calls, 0)}
                for size, (calls, ns) in sorted(self.batches.items())
            ],  # fmt: skip
        }
