"""Exponential reconnect backoff with jitter.

The n-th consecutive failure waits ``min(max_s, initial_s * multiplier**n)`` scaled down by a random
factor in ``[1 - jitter, 1]``, so a fleet that lost its broker at once does not reconnect in lockstep.
:meth:`Backoff.reset` (called once a connection is accepted) starts again from ``initial_s``.
"""

from __future__ import annotations

import random
import threading

from edgekit_runtime.agent.topics import TelemetryError


class Backoff:
    """Delays between reconnect attempts. Thread-safe; ``rng`` makes the jitter reproducible."""

    def __init__(
        self,
        initial_s: float = 1.0,
        max_s: float = 60.0,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if not initial_s > 0:
            raise TelemetryError(f"Backoff initial_s must be > 0 s, got {initial_s!r}", hint="e.g. initial_s=1")
        if not max_s >= initial_s:
            raise TelemetryError(
                f"Backoff max_s ({max_s!r} s) must be >= initial_s ({initial_s!r} s)", hint="e.g. max_s=60"
            )
        if not multiplier >= 1:
            raise TelemetryError(f"Backoff multiplier must be >= 1, got {multiplier!r}", hint="e.g. multiplier=2")
        if not 0 <= jitter < 1:
            raise TelemetryError(f"Backoff jitter must be in [0, 1), got {jitter!r}", hint="e.g. jitter=0.2")
        self.initial_s = float(initial_s)
        self.max_s = float(max_s)
        self.multiplier = float(multiplier)
        self.jitter = float(jitter)
        self._rng = rng or random.Random()
        self._failures = 0
        self._lock = threading.Lock()

    @property
    def failures(self) -> int:
        """Consecutive failures since the last :meth:`reset`."""
        return self._failures

    def base_delay_s(self, failures: int) -> float:
        """The delay before jitter after ``failures`` consecutive failures (``failures >= 1``)."""
        exponent = max(failures - 1, 0)
        # Cap the exponent so the power cannot overflow after days of failures.
        if self.multiplier > 1 and exponent > 64:
            return self.max_s
        return min(self.max_s, self.initial_s * self.multiplier**exponent)

    def next_delay_s(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        with self._lock:
            self._failures += 1
            base_s = self.base_delay_s(self._failures)
            return base_s * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        """A connection was accepted: the next failure waits about ``initial_s`` again."""
        with self._lock:
            self._failures = 0

    def __repr__(self) -> str:
        return (
            f"Backoff(initial_s={self.initial_s}, max_s={self.max_s}, multiplier={self.multiplier}, "
            f"jitter={self.jitter}, failures={self._failures})"
        )
