"""The direct serving path's stamps folded into a telemetry window and the lifetime statistics as arrays
(``serving_stats.stamp_table``) give exactly what folding them one request at a time gives."""

from __future__ import annotations

import random

from edgekit_runtime.agent.serving import RequestTiming
from edgekit_runtime.agent.serving_stats import LifetimeStats, WindowAccumulator, stamp_table

_NS_PER_MS = 1_000_000


def stamps(count: int, seed: int) -> list[RequestTiming]:
    rng = random.Random(seed)
    clock = 10**15  # perf_counter_ns stamps of a host up for days: far past float's exact integers once summed
    made = []
    for _ in range(count):
        clock += rng.randrange(1, 90_000)
        submitted = clock
        started = submitted + rng.randrange(0, 5_000_000)
        finished = started + rng.randrange(1, 50_000_000)
        runner_items = rng.choice((1, 1, 1, 4, 11, 64))
        made.append(RequestTiming(submitted, started, finished, rng.randrange(1, runner_items + 1), runner_items))
    return made


def folded_one_by_one(taken: list[RequestTiming], max_samples: int) -> tuple[WindowAccumulator, LifetimeStats]:
    window, lifetime = WindowAccumulator(max_samples), LifetimeStats()
    for submitted, started, finished, items, runner_items in taken:
        window.requests += 1
        window.runner_calls += 1
        window.items += items
        window.batch_sizes[runner_items] = window.batch_sizes.get(runner_items, 0) + 1
        if len(window.samples) < max_samples:
            window.samples.append(((started - submitted) / _NS_PER_MS, (finished - started) / _NS_PER_MS))
        lifetime.add_request(submitted, started, finished, items)
        lifetime.add_call(runner_items, finished - started)
    return window, lifetime


def test_the_array_fold_equals_the_fold_one_request_at_a_time() -> None:
    for count, max_samples, seed in ((1, 10, 0), (5_000, 100_000, 1), (5_000, 1_234, 2)):
        taken = stamps(count, seed)
        expected_window, expected_lifetime = folded_one_by_one(taken, max_samples)
        window, lifetime = WindowAccumulator(max_samples), LifetimeStats()
        for part in (taken[: count // 3], taken[count // 3 :]):  # two drains into one window
            if part:
                table = stamp_table(part)
                window.record_stamps(table)
                lifetime.add_stamps(table)
        assert window.counters() == expected_window.counters()
        assert window.batch_sizes == expected_window.batch_sizes
        assert window.samples == expected_window.samples  # the same floats, bit for bit
        assert lifetime == expected_lifetime
        assert all(type(key) is int for key in lifetime.batches)  # JSON and protobuf take them as they are
        assert lifetime.to_protocol("m", "1") == expected_lifetime.to_protocol("m", "1")


def test_a_stamp_table_keeps_the_fields_in_order() -> None:
    table = stamp_table([RequestTiming(1, 2, 3, 4, 5), RequestTiming(6, 7, 8, 9, 10)])
    assert table.shape == (2, 5) and table.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
