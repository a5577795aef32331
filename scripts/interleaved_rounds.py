"""Variants of one call taking turns in interleaved rounds, for benchmarks on a shared, noisy machine: each round runs
every pair's two variants back to back (order swapped every other round), so that their ratio compares the same
moment of the machine; a round is a tight loop of the variant's call (throughput), optionally followed by calls
timed one by one (wall times, and the overhead over the compute time the server measured). Used by
scripts/bench_agent.py (and through it scripts/bench_oip_grpc.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the fewest interleaved rounds a comparison runs, whatever its time budget
MIN_ROUNDS = 8
#: each round times one call in this many one by one, after its throughput loop
TIMED_SHARE = 4
_NS_PER_US = 1_000

#: One request; returns the compute time the server measured (ms), or None for the bare loop.
Call = Callable[[], "float | None"]


@dataclass(frozen=True)
class Variant:
    """One way to serve a request: ``run`` for the throughput loop (a ``functools.partial`` of the very
    call, so every variant's loop costs the same), ``timed`` for the per-request timings."""

    run: Callable[[], object]
    timed: Call


@dataclass
class VariantSamples:
    iterations_per_round: int = 0
    items: int = 0
    seconds: float = 0.0
    round_items_per_s: list[float] = field(default_factory=list)
    wall_us: list[float] = field(default_factory=list)
    overhead_us: list[float] = field(default_factory=list)  # wall - server compute

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "iterations_per_round": self.iterations_per_round,
            "rounds": len(self.round_items_per_s),
            "items_per_s_median": statistics.median(self.round_items_per_s),
            "items_per_s_pooled": self.items / self.seconds,
            "items_per_s_max": max(self.round_items_per_s),
        }
        if self.wall_us:  # calls timed one by one (not in the short-round pair phase)
            out["wall_us_median"] = statistics.median(self.wall_us)
            out["wall_us_p90"] = float(np.percentile(self.wall_us, 90))
        if self.overhead_us:
            out["overhead_us_median"] = statistics.median(self.overhead_us)
        return out


def calibrate(variant: Variant, round_s: float, *, warmup_s: float = 0.3) -> tuple[int, float]:
    """Warm ``variant`` up for about ``warmup_s``; returns the iteration count of a ``round_s`` round (at
    least 1) and the seconds such a round takes."""
    call = variant.run
    variant.timed()
    started_s, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - started_s < warmup_s:
        call()
        calls += 1
    per_call_s = (time.perf_counter() - started_s) / calls
    iterations = max(1, round(round_s / per_call_s))
    return iterations, iterations * per_call_s


def run_loop(variant: Variant, iterations: int, items: int, samples: VariantSamples) -> None:
    """A tight loop of ``iterations`` calls (only the call in the loop, the same for every variant): one
    throughput sample."""
    clock, run = time.perf_counter_ns, variant.run
    started_ns = clock()
    for _ in range(iterations):
        run()
    round_s = (clock() - started_ns) / 1e9
    samples.round_items_per_s.append(iterations * items / round_s)
    samples.items += iterations * items
    samples.seconds += round_s


def run_round(variant: Variant, iterations: int, items: int, samples: VariantSamples) -> None:
    """One round of one variant: a tight loop of ``iterations`` calls for throughput (only the call in the
    loop, the same for every variant), then a quarter as many calls timed one by one for wall times and
    overheads (kept out of the throughput, so that the per-call bookkeeping of the agent's variant, which
    also reads the server's compute time, is not charged to the agent)."""
    run_loop(variant, iterations, items, samples)
    clock, timed = time.perf_counter_ns, variant.timed
    for _ in range(max(1, iterations // TIMED_SHARE)):
        before_ns = clock()
        compute_ms = timed()
        wall_ns = clock() - before_ns
        samples.wall_us.append(wall_ns / _NS_PER_US)
        if compute_ms is not None:
            samples.overhead_us.append(wall_ns / _NS_PER_US - compute_ms * 1000.0)


def interleave(calls: Mapping[str, Variant], pairs: Sequence[tuple[str, str]], items: int, *, timed: bool,
               max_rounds: int, round_s: float, budget_s: float) -> dict[str, VariantSamples]:  # fmt: skip
    """Rounds of ``round_s`` per variant, as many as fit in ``budget_s`` (``MIN_ROUNDS`` to ``max_rounds``): each
    round runs every pair's two variants back to back, so that their ratio compares the same moment of a
    noisy machine, swapping the order within each pair every other round. With ``timed``, each variant's
    loop is followed by calls timed one by one (:func:`run_round`)."""
    names = [name for pair in pairs for name in pair]
    samples = {name: VariantSamples() for name in names}
    share = 1 + 1 / TIMED_SHARE if timed else 1.0
    one_round_s = 0.0
    for name in names:
        samples[name].iterations_per_round, variant_round_s = calibrate(calls[name], round_s)
        one_round_s += variant_round_s * share
    rounds = max(MIN_ROUNDS, min(max_rounds, int(budget_s / one_round_s)))
    step = run_round if timed else run_loop
    for index in range(rounds):
        for pair in pairs:
            for name in pair if index % 2 == 0 else pair[::-1]:
                step(calls[name], samples[name].iterations_per_round, items, samples[name])
    return samples


def median_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of ``values``."""
    rng = np.random.default_rng(seed)
    data = np.asarray(values)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)
