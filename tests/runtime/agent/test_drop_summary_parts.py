"""A drop summary lists dropped seqs exactly, however scattered: past MAX_SEQ_RANGES runs it is reported in parts
instead of joining runs across stored seqs (the 10-minute small-disk fault run counted 318 stored windows twice)."""

from __future__ import annotations

from edgekit_runtime.agent.spool_space import MAX_SEQ_RANGES, DropSummary


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
