"""The command replay window on a real SQLite file: ids and issued_at checked, kept across reopening."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit_runtime.agent.replay import ReplayError, ReplayPolicy, ReplayWindow, parse_issued_at

NOW = parse_issued_at("2026-03-01T12:00:00Z")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _window(path: Path, clock: Clock, **policy: object) -> ReplayWindow:
    return ReplayWindow(path, ReplayPolicy(**policy), clock=clock)  # type: ignore[arg-type]


def test_an_id_runs_once_even_after_reopening(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "commands.db", clock) as window:
        assert window.admit("c-1", "2026-03-01T11:59:00Z") is None
        again = window.admit("c-1", "2026-03-01T11:59:00Z")
        assert again is not None and again.reason == "replayed"
        assert again.message == ("command id 'c-1' was already received at 2026-03-01T12:00:00Z; it is not run twice "
                                 "(a replay or a redelivery): send a new command with a fresh id")  # fmt: skip
        for index in range(300):  # far more than the 256 ids the old in-memory list held
            assert window.admit(f"other-{index}", "2026-03-01T11:59:30Z") is None
    clock.now += 3600
    with _window(tmp_path / "commands.db", clock) as reopened:  # an agent restart
        refusal = reopened.admit("c-1", "2026-03-01T11:59:00Z")
        assert refusal is not None and refusal.reason == "replayed"
        assert reopened.admit("c-2", "2026-03-01T12:59:00Z") is None


def test_issued_at_must_lie_inside_the_window(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "commands.db", clock, window_s=3600, max_clock_skew_s=60) as window:
        old = window.admit("c-old", "2026-03-01T10:59:59Z")
        assert old is not None and old.reason == "expired"
        assert old.message == ("command issued at 2026-03-01T10:59:59Z is older than the replay window of 3600 s "
                               "(device time 2026-03-01T12:00:00Z); send a new command, or check the device clock (NTP)")  # fmt: skip
        future = window.admit("c-future", "2026-03-01T12:01:01Z")
        assert future is not None and future.reason == "future"
        assert "is more than 60 s ahead of the device clock (2026-03-01T12:00:00Z)" in future.message
        assert window.admit("c-skewed", "2026-03-01T12:00:59.5Z") is None  # inside the skew allowance
        assert window.admit("c-edge", "2026-03-01T11:00:01Z") is None
        assert len(window) == 2  # refused commands leave no record


def test_a_record_expires_with_the_window_and_then_the_time_check_refuses(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "commands.db", clock, window_s=60) as window:
        assert window.admit("c-1", "2026-03-01T12:00:00Z") is None
        clock.now += 61
        assert window.admit("c-new", "2026-03-01T12:01:00Z") is None
        assert len(window) == 1  # c-1 was pruned on the next write
        refusal = window.admit("c-1", "2026-03-01T12:00:00Z")
        assert refusal is not None and refusal.reason == "expired"


def test_commands_without_issued_at(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "strict.db", clock) as strict:
        refusal = strict.admit("c-1", None)
        assert refusal is not None and refusal.reason == "missing_issued_at"
        assert "set commands.require_issued_at: false" in refusal.message
    with _window(tmp_path / "lenient.db", clock, require_issued_at=False, window_s=60) as lenient:
        assert lenient.admit("c-1", None) is None
        assert lenient.admit("c-1", None) is not None  # remembered for the window from its arrival
        clock.now += 61
        assert lenient.admit("c-1", None) is None  # the documented limit of commands without issued_at


def test_a_full_record_raises_the_floor_instead_of_forgetting_silently(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "commands.db", clock, max_entries=3) as window:
        for second in range(4):
            assert window.admit(f"c-{second}", f"2026-03-01T11:00:0{second}Z") is None
        assert len(window) == 3
        assert window.floor == parse_issued_at("2026-03-01T11:00:00Z")
        refusal = window.admit("c-0", "2026-03-01T11:00:00Z")  # evicted, but still refused
        assert refusal is not None and refusal.reason == "expired"
        assert "is not after 2026-03-01T11:00:00Z, the oldest time this agent still remembers" in refusal.message
        assert window.admit("c-late", "2026-03-01T11:00:00.5Z") is None
    with _window(tmp_path / "commands.db", clock, max_entries=3) as reopened:
        assert reopened.floor > parse_issued_at("2026-03-01T11:00:00Z")  # the floor is persisted too


def test_payload_digests_are_remembered(tmp_path: Path) -> None:
    clock = Clock()
    with _window(tmp_path / "commands.db", clock, window_s=60) as window:
        assert not window.payload_seen("ab" * 32)
        window.remember_payload("ab" * 32)
        assert window.admit("c-1", "2026-03-01T12:00:00Z", payload_digest="cd" * 32) is None  # one commit for both
        assert window.payload_seen("cd" * 32)
    with _window(tmp_path / "commands.db", clock, window_s=60) as reopened:
        assert reopened.payload_seen("ab" * 32)
        clock.now += 61
        assert not reopened.payload_seen("ab" * 32)


def test_bad_dates_and_paths_are_clear_errors(tmp_path: Path) -> None:
    with _window(tmp_path / "commands.db", Clock()) as window:
        with pytest.raises(ReplayError, match=r"issued_at '2026-02-30T00:00:00Z' is not a UTC time"):
            window.admit("c-1", "2026-02-30T00:00:00Z")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(ReplayError) as info:
        ReplayWindow(blocker / "commands.db")
    assert f"cannot open the command replay record {blocker / 'commands.db'}" in str(info.value)
    assert "point commands.replay_path at a writable file" in str(info.value)
    with pytest.raises(ReplayError, match=r"replay max_entries must be an int >= 1, got 0"):
        ReplayPolicy(max_entries=0)
