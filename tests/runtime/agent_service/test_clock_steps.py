"""Telemetry windows across a wall-clock step: a device that booted with its clock a day ahead (no RTC, a stale
fake-hwclock) and had it stepped back by NTP, or one stepped forward by a month. Before, a clock stepped back made
every window end before it started: none was published until the clock caught up again, and their counts were lost.
Now the window is its last seconds by CLOCK_BOOTTIME, with a ``clock.stepped`` problem."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent import service_telemetry
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message


class SteppableClock:
    """``datetime`` for the telemetry module, whose ``now`` is the real time plus ``offset``."""

    offset = dt.timedelta(0)

    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:
        return dt.datetime.now(tz) + cls.offset


def _seconds(message: dict) -> float:
    start, end = (dt.datetime.fromisoformat(message["window"][key].replace("Z", "+00:00")) for key in ("start", "end"))
    return (end - start).total_seconds()


@pytest.mark.parametrize("step", [dt.timedelta(days=-1), dt.timedelta(days=30)], ids=["back-a-day", "forward-a-month"])
def test_a_window_across_a_clock_step_is_published_with_its_true_length(agent_config: Callable[..., Path],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        step: dt.timedelta) -> None:  # fmt: skip
    monkeypatch.setattr(service_telemetry, "datetime", SteppableClock)
    monkeypatch.setattr(SteppableClock, "offset", dt.timedelta(0))
    with AgentService(load_config(agent_config())) as agent:
        agent.build_telemetry_window()  # a fresh window, opened by the clock as it was
        agent.server.take_window()
        monkeypatch.setattr(SteppableClock, "offset", step)  # NTP steps the clock
        message = agent.build_telemetry_window()
        validate_message(message, "telemetry.v1")
        assert 0 <= _seconds(message) < 60  # its length by CLOCK_BOOTTIME, not a day less or a month more
        stepped = [e for e in message["errors"] if e["code"] == "clock.stepped"]
        assert len(stepped) == 1 and f"the wall clock was stepped {step.total_seconds():+.1f} s" in stepped[0]["message"]
        following = agent.build_telemetry_window()  # the next one chains on as before, with no problem
        assert following["window"]["start"] == message["window"]["end"]
        assert not any(e["code"] == "clock.stepped" for e in following["errors"])
        assert np.isclose(_seconds(following), 0, atol=5)
