"""Exponential reconnect backoff: growth, cap, jitter, reset."""

from __future__ import annotations

import random

import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.topics import TelemetryError


def test_delays_double_up_to_the_cap_without_jitter() -> None:
    backoff = Backoff(initial_s=1, max_s=10, jitter=0)
    assert [backoff.next_delay_s() for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff.failures == 6


def test_reset_starts_again_from_initial() -> None:
    backoff = Backoff(initial_s=0.5, max_s=60, jitter=0)
    for _ in range(5):
        backoff.next_delay_s()
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay_s() == 0.5


def test_jitter_stays_within_its_band_and_spreads() -> None:
    backoff = Backoff(initial_s=4, max_s=4, jitter=0.25, rng=random.Random(1))
    delays = [backoff.next_delay_s() for _ in range(200)]
    assert all(3.0 <= d <= 4.0 for d in delays)
    assert max(delays) - min(delays) > 0.5


def test_days_of_failures_do_not_overflow() -> None:
    backoff = Backoff(initial_s=1, max_s=60, jitter=0)
    assert backoff.base_delay_s(10_000) == 60


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"initial_s": 0}, r"initial_s must be > 0 s, got 0"),
        ({"initial_s": 5, "max_s": 1}, r"max_s \(1 s\) must be >= initial_s \(5 s\)"),
        ({"multiplier": 0.5}, r"multiplier must be >= 1, got 0.5"),
        ({"jitter": 1.0}, r"jitter must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_settings_are_named(kwargs: dict, expected: str) -> None:
    with pytest.raises(TelemetryError, match=expected):
        Backoff(**kwargs)
