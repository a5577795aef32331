"""A drop summary lists dropped seqs exactly, however scattered: past MAX_SEQ_RANGES runs it is reported in parts
instead of joining runs across stored seqs (the 10-minute small-disk fault run counted 318 stored windows twice)."""

from __future__ import annotations

from edgekit_runtime.agent.spool_space import MAX_SEQ_RANGES, DropSummary, summary_of
from edgekit_runtime.agent.telemetry import encode_message
from tests.runtime.agent.sample_messages import sample_telemetry


def test_scattered_drops_are_reported_in_parts_that_cover_no_stored_seq() -> None:
    runs = tuple((seq, seq) for seq in range(1, 2 * (MAX_SEQ_RANGES + 10), 2))  # every other seq dropped
    one = DropSummary(0, None, None, None, None, ("disk_full",))
    summary = one
    for first, last in runs:
        summary = summary.merged(DropSummary(1, first, last, "2026-11-27T00:00:00Z", "2026-11-27T00:00:00Z", ("disk_full",),
                                             ((first, last),)))  # fmt: skip
    assert summary.seq_ranges == runs and summary.windows == len(runs)  # no run joined across a stored seq
    parts = summary.parts()
    assert [len(part.seq_ranges) for part in parts] == [MAX_SEQ_RANGES, len(runs) - MAX_SEQ_RANGES]
    assert sum(part.windows for part in parts) == summary.windows
    assert [(part.first_seq, part.last_seq) for part in parts] == [(1, runs[MAX_SEQ_RANGES - 1][1]),
                                                                   (runs[MAX_SEQ_RANGES][0], runs[-1][1])]  # fmt: skip
    assert DropSummary(3, 5, 7, None, None, ("bound",), ((5, 7),)).parts() == [DropSummary(3, 5, 7, None, None, ("bound",), ((5, 7),))]


def test_a_dropped_window_is_summarised_with_its_window_start() -> None:
    """telemetry.v1 keeps the start at ``window.start``; the summary read ``window_start``, so a telemetry_dropped
    event never said which period was lost."""
    message = sample_telemetry(5)
    summary = summary_of(encode_message(message), "bound")
    assert (summary.first_seq, summary.last_seq) == (5, 5)
    assert summary.first_window_start == summary.last_window_start == message["window"]["start"]
    assert f"windows from {message['window']['start']}" in summary.describe()
    legacy = summary_of(b'{"seq": 6, "window_start": "2026-01-01T00:00:00Z"}', "bound")  # spooled by an older agent
    assert legacy.first_window_start == "2026-01-01T00:00:00Z"
    assert summary_of(b'{"seq": 7, "window": "not an object"}', "bound").first_window_start is None
