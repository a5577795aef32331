"""Whether a device is alive, judged the same way by every reader (status, report, dashboard, Prometheus, alerts).

A device reports telemetry every ``interval_s`` seconds (the length of its newest window). Its state is

=============  ======================================================================================
``online``     its agent said so (retained status) and it was heard from within 3 intervals
``stale``      3 intervals or more without a word: maybe a network hiccup, maybe worse
``offline``    its last will arrived (the broker saw the connection drop), or 10 intervals of silence
``unknown``    never reported a status nor a window
=============  ======================================================================================

A state the agent itself reported other than ``online`` (``offline``, ``updating`` ...) is kept while the
device is heard from; silence turns any of them into ``stale`` and then ``offline``. Silence is judged on
telemetry: a device that never sent a window (so its interval is unknown) keeps the state it reported.
"""

from __future__ import annotations

import datetime as dt

#: Missed telemetry intervals after which a device is ``stale``.
STALE_AFTER_INTERVALS = 3
#: Missed telemetry intervals after which a device is ``offline`` even without its last will.
OFFLINE_AFTER_INTERVALS = 10
#: The telemetry interval assumed for a device whose window length is unknown (the agent's default).
DEFAULT_INTERVAL_S = 10.0
#: Every state a device summary can have, in the order tables and charts list them (worst last).
STATES = ("online", "stale", "offline", "unknown")


def liveness_state(reported: str | None, last_seen: dt.datetime | None, interval_s: float | None,
                   now: dt.datetime) -> str:  # fmt: skip
    """The state to show for a device whose agent last ``reported`` this state (None: never), last heard from at
    ``last_seen`` (its newest window's arrival or status), reporting every ``interval_s`` seconds."""
    if reported == "offline":
        return "offline"
    if last_seen is None or interval_s is None:
        return reported or "unknown"
    interval = interval_s if interval_s > 0 else DEFAULT_INTERVAL_S
    silent_s = (now - last_seen).total_seconds()
    if silent_s >= OFFLINE_AFTER_INTERVALS * interval:
        return "offline"
    if silent_s >= STALE_AFTER_INTERVALS * interval:
        return "stale"
    return reported or "online"


#: How bad each state is, for "worst first" orders (a state an agent reported that is not listed sits with unknown).
STATE_RANK = {"offline": 0, "stale": 1, "unknown": 2, "online": 4}


def worst_first(state: str, p99_ms: float | None) -> tuple[int, float]:
    """Sort key putting offline devices first, then stale, then the slowest (highest p99) of the rest."""
    return (STATE_RANK.get(state, 3), -(p99_ms if p99_ms is not None else -1.0))


def state_counts(states: "list[str]") -> dict[str, int]:
    """How many devices are in each of :data:`STATES` (zero included), plus any other state reported."""
    counts = dict.fromkeys(STATES, 0)
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return counts


__all__ = ["DEFAULT_INTERVAL_S", "OFFLINE_AFTER_INTERVALS", "STALE_AFTER_INTERVALS", "STATES", "STATE_RANK", "liveness_state",
           "state_counts", "worst_first"]
