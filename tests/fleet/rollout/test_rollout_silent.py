"""A rollout whose ``fleet deploy`` was killed outright (``kill -9``, a lost host) cannot record that it stopped; its
record keeps "deploying" or "watching". It is said to be silent once it has gone without an update for longer than
a running deploy ever does (its deploy timeout, plus a minute): in ``fleet report`` and the dashboard's JSON."""

from __future__ import annotations

import datetime as dt
import io

from rich.console import Console

from edgekit.cli.fleet_deploy import print_record
from edgekit.fleet.rollout_state import RolloutRecord

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)


def _record(state: str, updated_ago: dt.timedelta, deploy_timeout_s: float = 180.0) -> RolloutRecord:
    started = NOW - updated_ago - dt.timedelta(seconds=30)
    return RolloutRecord("r1", "lab", "digits-cnn-v2-88d81029cc31", "file:///b.tar", "0" * 64, state, ("dev-1",), ("dev-1",),
                         started, NOW - updated_ago, outcomes={"dev-1": "deploying"},
                         options={"deploy_timeout_s": deploy_timeout_s, "progress_s": 5.0})  # fmt: skip


def test_a_rollout_in_progress_that_stopped_saving_is_silent_and_said_so() -> None:
    assert _record("deploying", dt.timedelta(seconds=200)).silent_s(NOW) is None  # within 180 s + a minute: running
    assert _record("deploying", dt.timedelta(hours=2)).silent_s(NOW) == 7200.0
    assert _record("watching", dt.timedelta(minutes=10), deploy_timeout_s=900.0).silent_s(NOW) is None  # its own timeout
    assert _record("stopped", dt.timedelta(hours=2)).silent_s(NOW) is None  # a final state is never silent

    out = io.StringIO()
    print_record(_record("deploying", dt.timedelta(hours=2)), Console(file=out, width=200))
    assert "no update for" in out.getvalue() and "has most likely ended" in out.getvalue()
    real = _record("deploying", dt.timedelta(hours=2) + (NOW - dt.datetime.now(dt.timezone.utc)))  # saved 2 h before now
    assert real.to_json()["silent_s"] >= 7200 and _record("completed", dt.timedelta(hours=2)).to_json()["silent_s"] is None
