"""A hostile manifest's integer past any float (``benchmark.p50_ms: 10**400``) renders as n/a instead of crashing the
report (review: plots' finiteness check raised OverflowError on it while drawing the latency histogram)."""

from __future__ import annotations

import copy

from edgekit.report import render_report
from edgekit.report.plots import latency_histogram_svg
from tests.report.test_report import realistic_manifest


def test_a_huge_integer_percentile_renders() -> None:
    manifest = copy.deepcopy(realistic_manifest())
    manifest["benchmark"].update(p50_ms=10**400, p99_ms=-(10**400))
    page = render_report(manifest, [1.0, 2.0, 3.0], None)  # before: OverflowError: int too large to convert to float
    assert "Latency per iteration" in page


def test_the_histogram_ignores_huge_integers() -> None:
    svg = latency_histogram_svg([1.0, 2.0, 10**400], {"p50": 10**400})
    assert svg is not None and "3 iterations" not in svg and "2 iterations" in svg
