"""The in-process inference server: one runner, timed requests, windows of statistics, optional batching.

Every request is timed twice: ``queue_ms`` from arrival until its runner call starts (waiting for the
runner, or for a batch to fill) and ``compute_ms`` for the runner call itself. Without batching a
lock serialises the runner; with :class:`~edgekit_runtime.agent.config.BatchingConfig` a worker
thread gathers requests whose non-batch dimensions agree, up to ``max_batch`` items or
``max_delay_ms`` after the first one, concatenates them along the batch dimension, runs them once and
splits the outputs again (see :mod:`edgekit_runtime.agent.batching`).

Requests that fail the signature check count as ``rejected`` (the caller's fault); failures inside
the runner count as ``errors`` (the model's or the device's fault, which health watching looks at).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgekit_runtime.agent.batching import BatchPlan, BatchQueue, PendingRequest, plan_batching
from edgekit_runtime.agent.config import BatchingConfig
from edgekit_runtime.agent.errors import NoModelError
from edgekit_runtime.backends.base import Runner
from edgekit_runtime.errors import InputSignatureError
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.timing import LatencyStats

logger = logging.getLogger(__name__)

_NS_PER_MS = 1_000_000
_clock_ns = time.perf_counter_ns
T = TypeVar("T")


@dataclass(frozen=True)
class RequestTiming:
    """How long one request waited and ran; ``runner_items`` is the size of the call that served it."""

    queue_ms: float
    compute_ms: float
    items: int
    runner_items: int

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.compute_ms

    def to_dict(self) -> dict[str, float | int]:
        return {"queue_ms": self.queue_ms, "compute_ms": self.compute_ms, "total_ms": self.total_ms,
                "items": self.items, "runner_items": self.runner_items}  # fmt: skip


@dataclass(frozen=True)
class InferenceResult:
    outputs: dict[str, np.ndarray]
    timing: RequestTiming


# The serving hot path makes one RequestTiming and one InferenceResult per request. A frozen dataclass's
# __init__ sets each field through object.__setattr__ (about 0.55 us for RequestTiming's four); these set the
# instance dict in one call, giving instances equal, hashable and frozen exactly like the __init__'s.
_new_instance = object.__new__
_set_attribute = object.__setattr__


def _timing(queue_ms: float, compute_ms: float, items: int, runner_items: int) -> RequestTiming:
    timing = _new_instance(RequestTiming)
    _set_attribute(timing, "__dict__", {"queue_ms": queue_ms, "compute_ms": compute_ms, "items": items, "runner_items": runner_items})
    return timing


def _result(outputs: dict[str, np.ndarray], timing: RequestTiming) -> InferenceResult:
    result = _new_instance(InferenceResult)
    _set_attribute(result, "__dict__", {"outputs": outputs, "timing": timing})
    return result


@dataclass(frozen=True)
class ServingTotals:
    """Counters since the server started; health watching compares two of them."""

    requests: int
    errors: int
    rejected: int
    runner_calls: int
    items: int


@dataclass(frozen=True)
class ServingWindow:
    """Statistics of the requests completed in one window of time.

    ``latency`` is queue + compute per request; ``throughput_per_s`` counts successful requests,
    ``items_per_s`` the items (batch rows) in them; ``error_rate`` is errors / (requests + errors).
    """

    started_at_s: float
    duration_s: float
    requests: int
    errors: int
    rejected: int
    items: int
    runner_calls: int
    latency: LatencyStats | None
    queue: LatencyStats | None
    compute: LatencyStats | None
    model: str | None

    @property
    def throughput_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def error_rate(self) -> float | None:
        attempts = self.requests + self.errors
        return self.errors / attempts if attempts else None

    def to_dict(self) -> dict[str, Any]:
        def stats(value: LatencyStats | None) -> dict[str, Any] | None:
            return None if value is None else value.to_dict()

        return {
            "started_at_s": self.started_at_s,
            "duration_s": self.duration_s,
            "model": self.model,
            "requests": self.requests,
            "errors": self.errors,
            "rejected": self.rejected,
            "items": self.items,
            "runner_calls": self.runner_calls,
            "throughput_per_s": self.throughput_per_s,
            "items_per_s": self.items_per_s,
            "error_rate": self.error_rate,
            "latency": stats(self.latency),
            "queue": stats(self.queue),
            "compute": stats(self.compute),
        }


#: The counters of a window, and of the totals since the server started.
_COUNTERS = ("requests", "errors", "rejected", "runner_calls", "items")


class _WindowAccumulator:
    """Samples and counters of the open window; bounded so a flood of requests cannot eat memory."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.reset(time.time(), time.monotonic())

    def reset(self, wall_s: float, monotonic_s: float) -> None:
        self.started_at_s = wall_s
        self.started_monotonic_s = monotonic_s
        self.samples: list[tuple[float, float]] = []  # (queue_ms, compute_ms): one append per request
        self.requests = self.errors = self.rejected = self.items = self.runner_calls = 0

    def record(self, queue_ms: float, compute_ms: float, items: int, runner_calls: int = 0) -> None:
        self.requests += 1
        self.items += items
        self.runner_calls += runner_calls
        if len(self.samples) < self.max_samples:  # the counts stay exact; percentiles use the first samples
            self.samples.append((queue_ms, compute_ms))

    def counters(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in _COUNTERS}

    def summary(self, monotonic_s: float, model: str | None) -> ServingWindow:
        def stats(samples: list[float]) -> LatencyStats | None:
            return LatencyStats.from_samples(samples) if samples else None

        return ServingWindow(
            started_at_s=self.started_at_s,
            duration_s=max(monotonic_s - self.started_monotonic_s, 0.0),
            requests=self.requests,
            errors=self.errors,
            rejected=self.rejected,
            items=self.items,
            runner_calls=self.runner_calls,
            latency=stats([queue_ms + compute_ms for queue_ms, compute_ms in self.samples]),
            queue=stats([queue_ms for queue_ms, _ in self.samples]),
            compute=stats([compute_ms for _, compute_ms in self.samples]),
            model=model,
        )


class InferenceServer:
    """Owns the serving runner; thread-safe. ``swap`` replaces the runner (deploy, rollback)."""

    def __init__(
        self,
        runner: Runner | None = None,
        *,
        model_name: str | None = None,
        batching: BatchingConfig | None = None,
        max_window_samples: int = 100_000,
    ) -> None:
        self._runner = runner
        self._model_name = model_name
        self._batching = batching
        self._run_lock = threading.Lock()  # serialises runner calls and swaps
        self._stats_lock = threading.Lock()
        self._items_dim = "batch" if batching is None else batching.dim  # the dim whose size counts as items
        self._window = _WindowAccumulator(max_window_samples)
        self._taken = dict.fromkeys(_COUNTERS, 0)  # counters of the windows taken so far; totals add the open one
        self._plan: BatchPlan | None = None
        self._queue: BatchQueue | None = None
        if batching is not None:
            self._queue = BatchQueue(self._run_batch, max_delay_ms=batching.max_delay_ms)
        self._replan()

    # -- model ----------------------------------------------------------------------------------------

    @property
    def model_name(self) -> str | None:
        return self._model_name

    @property
    def signature(self) -> IOSignature | None:
        runner = self._runner
        return None if runner is None else runner.signature

    @property
    def batching_active(self) -> bool:
        return self._plan is not None

    def swap(self, runner: Runner | None, *, model_name: str | None) -> Runner | None:
        """Serve ``runner`` (already loaded) from now on; returns the previous runner for the caller to close."""
        with self._run_lock:
            previous, self._runner, self._model_name = self._runner, runner, model_name
            self._replan()
        logger.info("now serving %s", model_name)
        return previous

    def call_runner(self, fn: Callable[[Runner], T]) -> T:
        """Run ``fn(runner)`` with the runner to itself (for a self-check on the live model)."""
        with self._run_lock:
            runner = self._require_runner()
            return fn(runner)

    def _replan(self) -> None:
        self._plan = None
        if self._batching is not None and self._runner is not None:
            self._plan = plan_batching(self._runner.signature, self._batching)

    def _require_runner(self) -> Runner:
        if self._runner is None:
            raise NoModelError(
                "no bundle is loaded, so there is no model to run",
                hint="deploy a bundle (edgekit-agent install, or a deploy command from the fleet)",
            )
        return self._runner

    # -- inference ----------------------------------------------------------------------------------

    def infer(self, feeds: Mapping[str, np.ndarray]) -> InferenceResult:
        """Validate ``feeds`` against the served signature, run them and time them."""
        # The hot path of every request: for a small model each microsecond here costs a percent of
        # throughput, so it reads each attribute once, builds messages only on failure, and takes its
        # locks with acquire/release (a ``with`` block costs twice as much).
        submitted_ns = _clock_ns()
        runner = self._runner
        if runner is None:
            runner = self._require_runner()  # raises NoModelError
        try:
            bound = runner.signature.feed_validator(feeds)  # validate_feeds, compiled once per signature
        except InputSignatureError:
            self._count("rejected")
            raise
        plan = self._plan
        if plan is not None and self._queue is not None:
            items = bound.get(plan.dim, 1)
            future: Future[InferenceResult] = Future()
            self._queue.put(PendingRequest(dict(feeds), items, plan.key(feeds), submitted_ns, future, plan.max_items))
            return future.result()
        validated_by = runner
        run_lock = self._run_lock
        run_lock.acquire()
        try:
            runner = self._runner
            if runner is not validated_by:  # a deploy swapped the model meanwhile: check against the new one
                runner = self._require_runner()
                try:
                    runner.signature.feed_validator(feeds)
                except InputSignatureError:
                    self._count("rejected")
                    raise
            started_ns = _clock_ns()
            try:
                outputs = runner.infer(feeds, validate=False)
            except Exception:
                self._count("errors", runner_calls=1)
                raise
            finished_ns = _clock_ns()
        finally:
            run_lock.release()
        items = bound.get(self._items_dim, 1)
        queue_ms = (started_ns - submitted_ns) / _NS_PER_MS
        compute_ms = (finished_ns - started_ns) / _NS_PER_MS
        stats_lock = self._stats_lock
        stats_lock.acquire()
        try:
            self._window.record(queue_ms, compute_ms, items, 1)
        finally:
            stats_lock.release()
        return _result(outputs, _timing(queue_ms, compute_ms, items, items))

    def _run_batch(self, group: list[PendingRequest]) -> None:
        """Called by the batching worker with requests that share a key; resolves their futures."""
        with self._run_lock:
            plan = self._plan
            try:
                runner = self._require_runner()
                if plan is None:  # the model changed to one that cannot batch: run one by one
                    for request in group:
                        self._run_one_locked(runner, request)
                    return
                started_ns = time.perf_counter_ns()
                feeds = plan.concatenate([request.feeds for request in group])
                outputs = runner.infer(feeds)  # validated again: the batch, and perhaps a model swapped in meanwhile
                finished_ns = time.perf_counter_ns()
                pieces = plan.split(outputs, [request.items for request in group])
            except Exception as err:  # every waiting caller gets the error
                self._count("errors", amount=len(group), runner_calls=1)
                for request in group:
                    request.future.set_exception(err)
                return
        total_items = sum(request.items for request in group)
        compute_ms = (finished_ns - started_ns) / _NS_PER_MS
        timings = [
            RequestTiming((started_ns - request.submitted_ns) / _NS_PER_MS, compute_ms, request.items, total_items)
            for request in group
        ]
        self._record(timings, runner_calls=1)
        for request, piece, timing in zip(group, pieces, timings):
            request.future.set_result(InferenceResult(piece, timing))

    def _run_one_locked(self, runner: Runner, request: PendingRequest) -> None:
        started_ns = time.perf_counter_ns()
        try:
            outputs = runner.infer(request.feeds)
        except Exception as err:
            self._count("errors", runner_calls=1)
            request.future.set_exception(err)
            return
        finished_ns = time.perf_counter_ns()
        timing = RequestTiming(
            (started_ns - request.submitted_ns) / _NS_PER_MS, (finished_ns - started_ns) / _NS_PER_MS, request.items, request.items
        )
        self._record([timing], runner_calls=1)
        request.future.set_result(InferenceResult(outputs, timing))

    # -- statistics -----------------------------------------------------------------------------------

    def _count(self, key: str, *, amount: int = 1, runner_calls: int = 0) -> None:
        with self._stats_lock:
            setattr(self._window, key, getattr(self._window, key) + amount)
            self._window.runner_calls += runner_calls

    def _record(self, timings: list[RequestTiming], *, runner_calls: int) -> None:
        with self._stats_lock:
            for timing in timings:
                self._window.record(timing.queue_ms, timing.compute_ms, timing.items)
            self._window.runner_calls += runner_calls

    def totals(self) -> ServingTotals:
        with self._stats_lock:
            current = self._window.counters()
            return ServingTotals(**{key: taken + current[key] for key, taken in self._taken.items()})

    def current_window(self) -> ServingWindow:
        """The open window so far, without closing it."""
        with self._stats_lock:
            return self._window.summary(time.monotonic(), self._model_name)

    def take_window(self) -> ServingWindow:
        """Close the open window, return its statistics and start the next one."""
        with self._stats_lock:
            now = time.monotonic()
            window = self._window.summary(now, self._model_name)
            for key, count in self._window.counters().items():
                self._taken[key] += count
            self._window.reset(time.time(), now)
        return window

    def close(self) -> None:
        """Stop the batching worker and close the runner; pending requests fail."""
        if self._queue is not None:
            self._queue.close()
        with self._run_lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
