"""The sweep's Pareto plot leaves out points it cannot place (review: an infinite p50 crashed sweep.html)."""

from __future__ import annotations

from edgekit.report.sweep_plot import render_sweep_html, sweep_pareto_svg


def _rows(p50_first: float, metric_second: float = 0.8) -> list[dict]:
    return [{"variant": "fp32", "status": "built", "p50_ms": p50_first, "metric_value": 0.9, "size_bytes": 4000, "budget_line": None},
            {"variant": "int8", "status": "built", "p50_ms": 0.9, "metric_value": metric_second, "size_bytes": 1000, "budget_line": None}]  # fmt: skip


def test_an_infinite_or_nan_figure_is_left_off_the_plot_and_kept_in_the_table() -> None:
    svg = sweep_pareto_svg(_rows(float("inf")), "accuracy", True)
    assert svg is not None and "int8" in svg and "fp32" not in svg
    assert sweep_pareto_svg(_rows(float("inf"), float("nan")), "accuracy", True) is None  # nothing left to place
    page = render_sweep_html(_rows(float("inf")), "accuracy", True, recipe="digits", target="Board", batch=8)
    assert "<svg" in page and "fp32" in page


def test_sweep_html_has_the_targets_estimate_beside_the_hosts_timing_as_the_cli_has() -> None:
    rows = _rows(2.0)
    rows[0]["estimate_p50_ms"], rows[1]["estimate_p50_ms"] = 12.345, None
    page = render_sweep_html(rows, "accuracy", True, recipe="digits", target="jetson-orin-nano", batch=8)
    assert "<th>estimate p50 ms on jetson-orin-nano</th>" in page  # before: only the CLI table and sweep.json had it
    assert "<td class=num>12.35</td>" in page and "<td class=num>—</td></tr>" in page
    assert "estimate p50" not in render_sweep_html(_rows(2.0), "accuracy", True, recipe="digits", target="x86-64-cpu", batch=8)


def test_dollar_signs_in_variant_recipe_and_metric_names_stay_literal_in_the_plot() -> None:
    """'$' in a name is text, not matplotlib mathtext: an unbalanced one raised ValueError, a pair drew a formula."""
    rows = _rows(2.0)
    rows[1]["variant"] = "a$\\frac{$b"
    page = render_sweep_html(rows, "top-1 $acc", True, recipe="price $\\x$", target="t", batch=8)
    svg = page[page.index("<svg"):]
    assert "Sweep of price $\\x$ on t, batch 8" in svg and "a$\\frac{$b (1 KB)" in svg and "top-1 $acc" in svg
