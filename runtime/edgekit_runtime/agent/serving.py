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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, TypeVar

import numpy as np

from edgekit_runtime.agent.batching import BatchPlan, BatchQueue, PendingRequest, plan_batching
from edgekit_runtime.agent.config import BatchingConfig
from edgekit_runtime.agent.errors import NoModelError
from edgekit_runtime.agent.serving_stats import COUNTERS, LifetimeStats, ServingWindow, WindowAccumulator, stamp_table
from edgekit_runtime.backends.base import CompiledCall, Recovery, Runner
from edgekit_runtime.errors import InputSignatureError
from edgekit_runtime.signature import FeedCounter, IOSignature, compile_feed_counter
from edgekit_runtime.timing import LatencyStats

logger = logging.getLogger(__name__)

_NS_PER_MS = 1_000_000
_clock_ns = time.perf_counter_ns
T = TypeVar("T")

#: What the direct path reads per request, in one tuple (one attribute read, then locals): the served runner's
#: compiled feed check returning the items (:func:`compile_feed_counter`), its :class:`CompiledRun` (the run,
#: the output names, the output name when there is only one, and recover), the run lock, the stamp list and
#: its bound.
_DirectPath = tuple[
    FeedCounter,
    CompiledCall,
    list[str],
    "str | None",
    Recovery,
    threading.Lock,
    list["RequestTiming"],
    int,
]


class RequestTiming(NamedTuple):
    """When one request arrived, started and finished running, as ``time.perf_counter_ns`` stamps;
    ``runner_items`` is the size of the call that served it. ``queue_ms`` (arrival to start, waiting
    for the runner or for a batch to fill) and ``compute_ms`` (the runner call) derive from them.

    A named tuple, like :class:`InferenceResult`: immutable, and made in one allocation. The direct
    serving path makes one per request and keeps that same tuple as the request's statistics sample, so
    a request costs two allocations and no arithmetic there (the milliseconds are computed when read;
    computing them and a second tuple per request cost 1 % of digits-cnn's throughput at batch 1, and a
    frozen dataclass 2 µs more per request, measured in the agent benchmark's loop).
    """

    submitted_ns: int
    started_ns: int
    finished_ns: int
    items: int
    runner_items: int

    @property
    def queue_ms(self) -> float:
        return (self.started_ns - self.submitted_ns) / _NS_PER_MS

    @property
    def compute_ms(self) -> float:
        return (self.finished_ns - self.started_ns) / _NS_PER_MS

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.compute_ms

    def to_dict(self) -> dict[str, float | int]:
        return {"queue_ms": self.queue_ms, "compute_ms": self.compute_ms, "total_ms": self.total_ms,
                "items": self.items, "runner_items": self.runner_items}  # fmt: skip


class InferenceResult(NamedTuple):
    outputs: dict[str, np.ndarray]
    timing: RequestTiming


_new_tuple = tuple.__new__  # NamedTuple(...) without its keyword-handling __new__: the hot path's constructor


@dataclass(frozen=True)
class ServingTotals:
    """Counters since the server started; health watching compares two of them."""

    requests: int
    errors: int
    rejected: int
    runner_calls: int
    items: int


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
        self._run_lock = threading.Lock()  # serialises runner calls (without batching) and swaps
        self._instances = 1 if batching is None else batching.instances
        # Runner calls with batching at once: instances, or 1 for a runner whose calls share state (_slots_for).
        self._open_slots = self._slots_for(runner)
        self._run_slots = threading.Semaphore(self._open_slots)
        self._compiled: _DirectPath | None = None  # the served runner's compiled call (both paths)
        self._stats_lock = threading.Lock()
        self._items_dim = "batch" if batching is None else batching.dim  # the dim whose size counts as items
        self._window = WindowAccumulator(max_window_samples)
        # The direct path's requests, appended under the run lock and moved into the window by _drain_stamps.
        self._stamps: list[RequestTiming] = []
        self._max_stamps = max_window_samples
        self._direct: _DirectPath | None = None
        self._taken = dict.fromkeys(COUNTERS, 0)  # counters of the windows taken so far; totals add the open one
        self._lifetime = LifetimeStats()  # what the statistics extension reports; never reset
        self._plan: BatchPlan | None = None
        self._queue: BatchQueue | None = None
        if batching is not None:
            self._queue = BatchQueue(self._run_batch, max_delay_ms=batching.max_delay_ms, workers=self._instances,
                                     run_slots=self._run_slots)  # fmt: skip
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

    @property
    def batching(self) -> BatchingConfig | None:
        """The agent's dynamic batching settings (``batching_active`` says whether this model batches)."""
        return self._batching

    @property
    def max_batch_items(self) -> int:
        """The most items one batched runner call holds (0 when this model does not batch)."""
        plan = self._plan
        return 0 if plan is None else plan.max_items

    @property
    def instances(self) -> int:
        """How many runner calls of this model may run at once: ``batching.instances``, or 1 for a runner whose
        calls are not safe to run concurrently (:attr:`Runner.concurrent_calls_safe`)."""
        return self._open_slots

    @property
    def providers(self) -> tuple[str, ...]:
        """What runs the served model (ONNX Runtime's execution providers); ``()`` with none served."""
        runner = self._runner
        return () if runner is None else tuple(runner.providers)

    def swap(self, runner: Runner | None, *, model_name: str | None) -> Runner | None:
        """Serve ``runner`` (already loaded) from now on; returns the previous runner for the caller to close."""
        with self._exclusive():
            previous, self._runner, self._model_name = self._runner, runner, model_name
            self._open_slots = self._slots_for(runner)  # _exclusive gives back this many slots
            self._replan()
        logger.info("now serving %s", model_name)
        return previous

    def call_runner(self, fn: Callable[[Runner], T]) -> T:
        """Run ``fn(runner)`` with the runner to itself (for a self-check on the live model)."""
        with self._exclusive():
            runner = self._require_runner()
            return fn(runner)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The runner to the caller alone: the run lock and every open slot. The caller may change
        ``_open_slots`` meanwhile (a swap): as many slots as it then says are given back."""
        with self._run_lock:
            for _ in range(self._open_slots):
                self._run_slots.acquire()
            try:
                yield
            finally:
                for _ in range(self._open_slots):
                    self._run_slots.release()

    def _slots_for(self, runner: Runner | None) -> int:
        """How many calls of ``runner`` may run at once: ``batching.instances``, unless its calls share state (an
        IOBinding's buffers, a TensorRT stream), which run one at a time whatever the configuration says."""
        if runner is None or self._instances == 1 or runner.concurrent_calls_safe:
            return self._instances
        runs_on = ", ".join(runner.providers) if runner.is_loaded else runner.backend_name
        logger.warning("%s: batching.instances is %d, but the calls of its runner (%s) share state and must not run at "
                       "once: serving it on one instance", self._model_name or "the model", self._instances, runs_on)  # fmt: skip
        return 1

    def _replan(self) -> None:
        """Decide how requests reach the runner; the caller holds the run lock (or is the constructor)."""
        runner, self._plan, self._direct, self._compiled = self._runner, None, None, None
        if runner is None:
            return
        if self._batching is not None:
            self._plan = plan_batching(runner.signature, self._batching)
        count_items = compile_feed_counter(runner.signature, self._items_dim)
        run, names, recover = runner.compiled_run()
        single = names[0] if len(names) == 1 else None
        self._compiled = (count_items, run, names, single, recover, self._run_lock, self._stamps, self._max_stamps)
        if self._plan is None:
            self._direct = self._compiled

    def _require_runner(self) -> Runner:
        if self._runner is None:
            raise NoModelError(
                "no bundle is loaded, so there is no model to run",
                hint="deploy a bundle (edgekit-agent install, or a deploy command from the fleet)",
            )
        return self._runner

    # -- inference ----------------------------------------------------------------------------------

    def infer(self, feeds: Mapping[str, np.ndarray], submitted_ns: int = 0) -> InferenceResult:
        """Validate ``feeds`` against the served signature, run them and time them (from ``submitted_ns``, a
        ``time.perf_counter_ns`` stamp of the request's arrival, when given)."""
        # The hot path of every request. For a small model each tenth of a microsecond here costs a quarter of
        # a percent of throughput, and code after a runner call runs with cold caches, so this path is as short
        # as it can be: one tuple read for everything it needs (_replan keeps it), the items straight from the
        # feed check, the runner's compiled call made from here (no frame of the runner in between), the lock
        # taken with acquire/release, the clock stamps in one RequestTiming that is both the statistics sample
        # (appended under the run lock; _drain_stamps moves them into the window) and the result's timing.
        submitted_ns = submitted_ns or _clock_ns()
        while True:
            direct = self._direct
            if direct is None:  # no model, or batching: the general path
                return self._infer_queued(feeds, submitted_ns)
            count_items, run, names, single, recover, run_lock, stamps, max_stamps = direct
            try:
                items = count_items(feeds)
            except InputSignatureError:
                self._count("rejected")
                raise
            if type(feeds) is not dict:  # any mapping passes the check; the compiled call takes a dict
                feeds = dict(feeds)
            run_lock.acquire()
            try:
                if self._direct is not direct:  # a deploy swapped the model meanwhile: validate against the new one
                    continue
                started_ns = _clock_ns()
                try:
                    outputs = run(names, feeds, None)
                except Exception as err:
                    outputs = self._recover_locked(recover, feeds, err)
                timing = _new_tuple(RequestTiming, (submitted_ns, started_ns, _clock_ns(), items, items))
                if len(stamps) < max_stamps:
                    stamps.append(timing)
                else:
                    self._count_unsampled(timing)
            finally:
                run_lock.release()
            named = {single: outputs[0]} if single is not None else dict(zip(names, outputs, strict=True))
            return _new_tuple(InferenceResult, (named, timing))

    def infer_together(self, requests: Sequence[tuple[dict[str, np.ndarray], int]]) -> list[InferenceResult | Exception]:
        """Requests that arrived together (the API's event loop reads every ready connection in one pass), each
        with its arrival stamp; each one's result or error, in order. With batching, those whose non-batch
        dims agree run as one runner call (up to the model's max batch), in this thread: no hand-off to a
        batching worker, no future. Without it, or for one request, each runs as :meth:`infer` runs it."""
        plan, runner = self._plan, self._runner
        if plan is None or runner is None or len(requests) == 1:
            return [self._infer_or_error(feeds, submitted_ns) for feeds, submitted_ns in requests]
        results: list[InferenceResult | Exception | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray], int, int]]] = {}
        validate, dim, key = runner.signature.feed_validator, plan.dim, plan.key
        for index, (feeds, submitted_ns) in enumerate(requests):
            try:
                items = validate(feeds).get(dim, 1)
            except InputSignatureError as err:
                self._count("rejected")
                results[index] = err
                continue
            groups.setdefault(key(feeds), []).append((index, feeds, items, submitted_ns))
        for members in groups.values():
            chunk: list[tuple[int, dict[str, np.ndarray], int, int]] = []
            total = 0
            for member in members:
                if chunk and total + member[2] > plan.max_items:
                    self._run_chunk(runner, plan, chunk, results)
                    chunk, total = [], 0
                chunk.append(member)
                total += member[2]
            self._run_chunk(runner, plan, chunk, results)
        return results  # type: ignore[return-value]

    def _run_chunk(self, runner: Runner, plan: BatchPlan, chunk: list[tuple[int, dict[str, np.ndarray], int, int]],
                   results: list[Any]) -> None:  # fmt: skip
        """One runner call for ``chunk`` (index, feeds, items, arrival) of :meth:`infer_together`; fills ``results``."""
        with self._run_slots:
            swapped = self._runner is not runner
            if not swapped:
                try:
                    started_ns = _clock_ns()
                    outputs = runner.infer(plan.concatenate([member[1] for member in chunk]))  # the batch validated again
                    finished_ns = _clock_ns()
                    pieces = plan.split(outputs, [member[2] for member in chunk])
                except Exception as err:
                    self._count("errors", amount=1 if len(chunk) == 1 else 0, runner_calls=1)  # many: counted alone
                    for member, outcome in zip(chunk, self._each_alone(runner, [(m[1], m[2], m[3]) for m in chunk], err)):
                        results[member[0]] = outcome
                    return
        if swapped:  # a deploy swapped the model meanwhile: each request on its own, the run slot given back first
            for index, feeds, _, submitted_ns in chunk:  # (infer may queue for a slot: holding one here deadlocked)
                results[index] = self._infer_or_error(feeds, submitted_ns)
            return
        total = sum(member[2] for member in chunk)
        timings = [_new_tuple(RequestTiming, (member[3], started_ns, finished_ns, member[2], total)) for member in chunk]
        self._record(timings)
        for member, piece, timing in zip(chunk, pieces, timings):
            results[member[0]] = _new_tuple(InferenceResult, (piece, timing))

    def _infer_or_error(self, feeds: dict[str, np.ndarray], submitted_ns: int) -> InferenceResult | Exception:
        try:
            return self.infer(feeds, submitted_ns)
        except Exception as err:  # the caller words it per request
            return err

    def _recover_locked(self, recover: Recovery, feeds: dict[str, np.ndarray], err: Exception) -> Sequence[np.ndarray]:
        """The runner's compiled call raised ``err``: the runner recovers (an execution-provider fallback,
        after which its compiled call is a new one, so the direct path is planned again) or explains the
        failure, which counts as an error. The caller holds the run lock or a run slot."""
        try:
            outputs = recover(feeds, err)
        except Exception:
            self._count("errors", runner_calls=1)
            raise
        self._replan()
        return outputs

    def _infer_queued(self, feeds: Mapping[str, np.ndarray], submitted_ns: int) -> InferenceResult:
        runner = self._require_runner()  # raises NoModelError
        try:
            bound = runner.signature.feed_validator(feeds)
        except InputSignatureError:
            self._count("rejected")
            raise
        plan, queue = self._plan, self._queue
        if plan is None or queue is None:  # swapped to a model that runs directly since infer looked
            return self.infer(feeds, submitted_ns)
        compiled = self._compiled
        if compiled is not None and queue.idle and self._run_slots.acquire(blocking=False):
            try:  # nothing waits and an instance is free: run now, without the hand-off to a batching worker
                if self._compiled is compiled:
                    return self._run_now(compiled, feeds, bound.get(plan.dim, 1), submitted_ns)
            finally:
                self._run_slots.release()
        future: Future[InferenceResult] = Future()
        queue.put(PendingRequest(dict(feeds), bound.get(plan.dim, 1), plan.key(feeds), submitted_ns, future, plan.max_items))
        return future.result()

    def _run_now(self, compiled: _DirectPath, feeds: Mapping[str, np.ndarray], items: int, submitted_ns: int) -> InferenceResult:
        """A validated request of a batching model run at once; the caller holds a run slot. The same steps as
        the locked part of :meth:`infer`, which keeps them inline on purpose (see the comment there)."""
        _, run, names, single, recover, _, stamps, max_stamps = compiled
        feeds = feeds if type(feeds) is dict else dict(feeds)
        started_ns = _clock_ns()
        try:
            outputs = run(names, feeds, None)
        except Exception as err:
            outputs = self._recover_locked(recover, feeds, err)
        timing = _new_tuple(RequestTiming, (submitted_ns, started_ns, _clock_ns(), items, items))
        if len(stamps) < max_stamps:
            stamps.append(timing)
        else:
            self._count_unsampled(timing)
        named = {single: outputs[0]} if single is not None else dict(zip(names, outputs, strict=True))
        return _new_tuple(InferenceResult, (named, timing))

    def _run_batch(self, group: list[PendingRequest]) -> None:
        """Called by a batching worker with requests that share a key; resolves their futures."""
        with self._run_slots:
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
            except Exception as err:
                self._count("errors", amount=1 if len(group) == 1 else 0, runner_calls=1)  # many: counted alone
                each = self._each_alone(self._runner, [(r.feeds, r.items, r.submitted_ns) for r in group], err)
                for request, outcome in zip(group, each):
                    if isinstance(outcome, Exception):
                        request.future.set_exception(outcome)
                    else:
                        request.future.set_result(outcome)
                return
        total_items = sum(request.items for request in group)
        timings = [RequestTiming(request.submitted_ns, started_ns, finished_ns, request.items, total_items) for request in group]
        self._record(timings)
        for request, piece, timing in zip(group, pieces, timings):
            request.future.set_result(InferenceResult(piece, timing))

    def _each_alone(self, runner: Runner | None, members: list[tuple[dict[str, np.ndarray], int, int]],
                    err: Exception) -> list[InferenceResult | Exception]:  # fmt: skip
        """A batched call failed with ``err``: run each member (feeds, items, arrival) on its own, so that one
        request the model cannot run (a token id past its table) fails alone and the others get their answers;
        each failure counts as an error once. The caller holds a run slot. One member, or no runner: ``err``."""
        if len(members) == 1 or runner is None:  # nothing to retry on: every member gets the batch's error, counted
            if len(members) > 1:
                self._count("errors", amount=len(members))
            return [err] * len(members)
        outcomes: list[InferenceResult | Exception] = []
        for feeds, items, submitted_ns in members:
            started_ns = time.perf_counter_ns()
            try:
                outputs = runner.infer(feeds)
            except Exception as alone:  # noqa: BLE001 - this request's own failure
                self._count("errors", runner_calls=1)
                outcomes.append(alone)
                continue
            timing = RequestTiming(submitted_ns, started_ns, time.perf_counter_ns(), items, items)
            self._record([timing])
            outcomes.append(InferenceResult(outputs, timing))
        return outcomes

    def _run_one_locked(self, runner: Runner, request: PendingRequest) -> None:
        started_ns = time.perf_counter_ns()
        try:
            outputs = runner.infer(request.feeds)
        except Exception as err:
            self._count("errors", runner_calls=1)
            request.future.set_exception(err)
            return
        finished_ns = time.perf_counter_ns()
        timing = RequestTiming(request.submitted_ns, started_ns, finished_ns, request.items, request.items)
        self._record([timing])
        request.future.set_result(InferenceResult(outputs, timing))

    # -- statistics -----------------------------------------------------------------------------------

    def _count_unsampled(self, timing: RequestTiming) -> None:
        """A direct-path request once the stamp list is full: left out of the window's percentiles, but counted
        exactly, and its times added to the lifetime statistics (the protocol's counts and times agree)."""
        with self._stats_lock:
            self._window.requests += 1
            self._window.items += timing.items
            self._window.record_call(timing.items)
            self._lifetime.add_request(timing.submitted_ns, timing.started_ns, timing.finished_ns, timing.items)
            self._lifetime.add_call(timing.items, timing.finished_ns - timing.started_ns)

    def _drain_stamps(self) -> None:
        """Move the direct path's stamps into the open window; the caller holds the stats lock. Requests append
        to the end of the list meanwhile (under the GIL), so copying and deleting the first n loses none."""
        stamps = self._stamps
        count = len(stamps)
        if count:
            table = stamp_table(stamps[:count])
            del stamps[:count]
            self._window.record_stamps(table)
            self._lifetime.add_stamps(table)

    def _count(self, key: str, *, amount: int = 1, runner_calls: int = 0) -> None:
        with self._stats_lock:
            setattr(self._window, key, getattr(self._window, key) + amount)
            self._window.runner_calls += runner_calls
            if key == "errors":
                self._lifetime.failures += amount

    def _record(self, timings: list[RequestTiming]) -> None:
        with self._stats_lock:
            for timing in timings:
                self._window.record(timing.queue_ms, timing.compute_ms, timing.items)
                self._lifetime.add_request(timing.submitted_ns, timing.started_ns, timing.finished_ns, timing.items)
            if timings:  # one runner call served them all
                first = timings[0]
                self._window.record_call(first.runner_items)
                self._lifetime.add_call(first.runner_items, first.finished_ns - first.started_ns)

    def totals(self) -> ServingTotals:
        with self._stats_lock:
            self._drain_stamps()
            current = self._window.counters()
            return ServingTotals(**{key: taken + current[key] for key, taken in self._taken.items()})

    def current_window(self) -> ServingWindow:
        """The open window so far, without closing it."""
        with self._stats_lock:
            self._drain_stamps()
            return self._window.summary(time.monotonic(), self._model_name)

    def protocol_statistics(self, name: str, version: str) -> dict[str, Any]:
        """Counts and nanoseconds since the server started, as one entry of the statistics extension's
        ``model_stats`` (:class:`~edgekit_runtime.agent.serving_stats.LifetimeStats`)."""
        with self._stats_lock:
            self._drain_stamps()
            return self._lifetime.to_protocol(name, version)

    def take_window(self) -> ServingWindow:
        """Close the open window, return its statistics and start the next one."""
        with self._stats_lock:
            self._drain_stamps()
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
        with self._exclusive():
            runner, self._runner = self._runner, None
            self._open_slots = self._slots_for(None)
            self._replan()
        if runner is not None:
            runner.close()
