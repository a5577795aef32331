"""The sweep's Pareto plot: latency against accuracy, marker area by model size, the Pareto front joined."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgekit.report.plots import BLUE, GREY, RED, _figure, _styled, _to_svg


def pareto_front(points: Sequence[tuple[float, float]], higher_is_better: bool) -> list[int]:
    """Indices of points no other point beats on both latency (lower) and metric."""
    front = []
    for i, (lat_i, met_i) in enumerate(points):
        dominated = False
        for j, (lat_j, met_j) in enumerate(points):
            better_metric = met_j >= met_i if higher_is_better else met_j <= met_i
            strictly = lat_j < lat_i or (met_j > met_i if higher_is_better else met_j < met_i)
            if j != i and lat_j <= lat_i and better_metric and strictly:
                dominated = True
                break
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda k: points[k][0])


@_styled
def sweep_pareto_svg(rows: Sequence[dict[str, Any]], metric: str, higher_is_better: bool) -> str | None:
    """``rows``: sweep rows with ``variant``, ``p50_ms``, ``metric_value``, ``size_bytes``, ``status``."""
    measured = [r for r in rows if r.get("p50_ms") and r.get("metric_value") is not None and r.get("status") == "built"]
    if not measured:
        return None
    figure, axes = _figure(3.6)
    points = [(float(r["p50_ms"]), float(r["metric_value"])) for r in measured]
    largest = max(float(r["size_bytes"]) for r in measured) or 1.0
    front = pareto_front(points, higher_is_better)
    for index, (row, (latency, value)) in enumerate(zip(measured, points)):
        color = BLUE if index in front else GREY
        axes.scatter([latency], [value], s=40 + 400 * float(row["size_bytes"]) / largest, color=color, alpha=0.7, edgecolors="white")
        axes.annotate(row["variant"], (latency, value), textcoords="offset points", xytext=(6, 4), fontsize=8)
    axes.plot([points[i][0] for i in front], [points[i][1] for i in front], color=BLUE, linewidth=1, linestyle="--", label="Pareto front")
    budget_rows = [r for r in measured if r.get("budget_line") is not None]
    if budget_rows:
        axes.axhline(float(budget_rows[0]["budget_line"]), color=RED, linestyle=":", linewidth=1, label="accuracy budget")
    axes.set_xlabel("p50 latency on this host (ms)")
    axes.set_ylabel(metric)
    axes.set_title("Sweep: latency × accuracy (marker area ∝ model size)")
    axes.legend(loc="best", fontsize=8)
    axes.grid(True, alpha=0.3)
    return _to_svg(figure, "sweep", "Pareto plot of latency against accuracy per variant")
