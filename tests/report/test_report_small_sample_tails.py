"""p90 / p99 from few timed calls are flagged (review: a time-bounded build timed 10 calls and the report showed their
p99, NumPy's interpolation between the two largest samples, as an ordinary tail percentile)."""

from __future__ import annotations

import copy

import pytest

from edgekit.report import render_report
from edgekit.report.sections import percentile_label
from tests.report.test_report import _parse, _visible_text, realistic_manifest


@pytest.mark.parametrize(("name", "calls", "label"), [
    ("p99", 10, "p99 (n=10: interpolated, not a measured tail)"),
    ("p99", 99, "p99 (n=99: interpolated, not a measured tail)"),
    ("p99", 100, "p99"),
    ("p90", 10, "p90"),
    ("p90", 5, "p90 (n=5: interpolated, not a measured tail)"),
    ("p99", None, "p99"),  # no count recorded: nothing to flag
    ("p99", 10**400, "p99"),  # a hostile count
])  # fmt: skip
def test_percentile_label(name: str, calls: object, label: str) -> None:
    assert percentile_label(name, calls) == label


def test_the_report_flags_a_p99_of_ten_calls() -> None:
    manifest = copy.deepcopy(realistic_manifest())
    manifest["benchmark"]["iterations"] = 10
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert "p99 (n=10: interpolated, not a measured tail)" in text  # the benchmark table
    assert "p99 of 10 timed calls: interpolated, not a measured tail" in text  # the latency card
    manifest["benchmark"]["iterations"] = 200
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert "interpolated" not in text
