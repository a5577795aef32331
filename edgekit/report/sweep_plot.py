"""The sweep's page (``sweep.html``): a Pareto plot of latency against accuracy (marker area by model size,
the Pareto front joined, labels placed so they do not overlap) and the table of every variant."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgekit.report.formatting import fmt_bytes, fmt_cosine, fmt_number, number
from edgekit.report.plots import BLUE, GREY, RED, _figure, _styled, _to_svg, literal_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: A missing number in the sweep table (a variant that was skipped, or has no latency here).
MISSING = "—"
#: Where a point's label may go, in points from the marker's edge: right, left, above, below, then diagonals.
_LABEL_PLACES = ((1, 0, "left", "center"), (-1, 0, "right", "center"), (0, 1, "center", "bottom"),
                 (0, -1, "center", "top"), (1, 1, "left", "bottom"), (-1, 1, "right", "bottom"),
                 (1, -1, "left", "top"), (-1, -1, "right", "top"))  # fmt: skip


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


def sweep_title(recipe: str | None, target: str | None, batch: Any) -> str:
    """``digits-cnn on NVIDIA Jetson Orin Nano 8GB, batch 64``: what the sweep measured."""
    parts = [f"{recipe or 'recipe'} on {target or 'target'}"]
    if batch is not None:
        parts.append(f"batch {batch}")
    return ", ".join(parts)


@_styled
def _finite(value: Any) -> bool:
    return number(value) is not None  # number(): a finite float, else None


def sweep_pareto_svg(rows: Sequence[dict[str, Any]], metric: str, higher_is_better: bool, *, title: str = "") -> str | None:
    """``rows``: sweep rows with ``variant``, ``p50_ms``, ``metric_value``, ``size_bytes``, ``status``;
    ``title``: what was swept (:func:`sweep_title`)."""
    measured = [r for r in rows if r.get("status") == "built" and _finite(r.get("p50_ms")) and r["p50_ms"] > 0
                and _finite(r.get("metric_value"))]  # a NaN or infinite figure has no place on the axes: the table has it
    if not measured:
        return None
    figure, axes = _figure(4.2)
    points = [(float(r["p50_ms"]), float(r["metric_value"])) for r in measured]
    largest = max(float(r["size_bytes"]) for r in measured) or 1.0
    areas = [40 + 400 * float(row["size_bytes"]) / largest for row in measured]
    front = pareto_front(points, higher_is_better)
    for index, ((latency, value), area) in enumerate(zip(points, areas)):
        color = BLUE if index in front else GREY
        axes.scatter([latency], [value], s=area, color=color, alpha=0.7, edgecolors="white")
    axes.plot([points[i][0] for i in front], [points[i][1] for i in front], color=BLUE, linewidth=1, linestyle="--", label="Pareto front")
    budget_rows = [r for r in measured if r.get("budget_line") is not None]
    if budget_rows:
        axes.axhline(float(budget_rows[0]["budget_line"]), color=RED, linestyle=":", linewidth=1, label="accuracy budget")
    _pad_limits(axes, points)
    axes.set_xlabel("p50 latency on this host (ms)")
    axes.set_ylabel(literal_text(metric))
    axes.set_title(("Sweep of " + literal_text(title) + "\n" if title else "Sweep\n") + "latency × accuracy, marker area ∝ model size")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # beside the points, never on them
    axes.grid(True, alpha=0.3)
    labels = [literal_text(f"{row['variant']} ({fmt_bytes(row['size_bytes'])})") for row in measured]
    _place_labels(figure, axes, points, areas, labels)
    return _to_svg(figure, "sweep", "Pareto plot of latency against accuracy per variant")


def _pad_limits(axes: "Axes", points: Sequence[tuple[float, float]]) -> None:
    """Room around the points for their labels (and a visible spread when all points coincide)."""
    for values, setter in (([p[0] for p in points], axes.set_xlim), ([p[1] for p in points], axes.set_ylim)):
        low, high = min(values), max(values)
        span = (high - low) or (abs(high) * 0.05 or 1.0)
        setter(low - 0.25 * span, high + 0.25 * span)


def _place_labels(figure: "Figure", axes: "Axes", points: Sequence[tuple[float, float]], areas: Sequence[float],
                  labels: Sequence[str]) -> None:  # fmt: skip
    """Each point's label at the first of :data:`_LABEL_PLACES` where it overlaps no other label, no marker
    and stays inside the axes; the layout is fixed first, so the positions measured are the final ones."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()  # measures text as the SVG writer lays it out
    figure.draw_without_rendering()  # constrained layout settles the axes now
    figure.set_layout_engine("none")
    to_pixels = figure.dpi / 72
    markers = []
    for (x, y), area in zip(points, areas):
        cx, cy = axes.transData.transform((x, y))
        radius = (area**0.5) / 2 * to_pixels
        markers.append((cx - radius, cy - radius, cx + radius, cy + radius))
    frame = axes.get_window_extent(renderer)
    placed: list[tuple[float, float, float, float]] = []
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    for index in order:
        radius_pt = (areas[index] ** 0.5) / 2 + 3
        best = None
        for dx, dy, ha, va in _LABEL_PLACES:
            text = axes.annotate(labels[index], points[index], textcoords="offset points", fontsize=8, ha=ha, va=va,
                                 xytext=(dx * radius_pt, dy * radius_pt))  # fmt: skip
            box = text.get_window_extent(renderer)
            extent = (box.x0, box.y0, box.x1, box.y1)
            inside = box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1
            clashes = sum(_overlap(extent, other) for other in placed) + sum(
                _overlap(extent, marker) for i, marker in enumerate(markers) if i != index)
            score = clashes + (0 if inside else 1)
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, text, extent)
            else:
                text.remove()
            if score == 0:
                break
        if best is not None:
            placed.append(best[2])


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> int:
    """1 when two boxes (x0, y0, x1, y1) in pixels overlap, else 0."""
    return int(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])


def render_sweep_html(rows: Sequence[dict[str, Any]], metric: str | None, higher_is_better: bool, *, recipe: str | None,
                      target: str | None, batch: Any) -> str:  # fmt: skip
    """The whole ``sweep.html``: title, plot, and one table row per variant (sizes with units, a note only
    where a variant has one)."""
    title = sweep_title(recipe, target, batch)
    svg = sweep_pareto_svg(rows, metric or "metric", higher_is_better, title=title)
    plot = svg or "<p class='note'>Nothing to plot: no variant was both built and timed on this host.</p>"
    header: tuple[str, ...] = ("variant", "status", "size", "p50 ms on this host", "× fp32", metric or "metric", "cosine min", "note")
    estimated = any(number(row.get("estimate_p50_ms")) is not None for row in rows)  # a target other than this host
    if estimated:  # the projection for the target beside the host's timing, as the CLI's table has it
        header = (*header, f"estimate p50 ms on {target or 'the target'}")

    def cells(row: dict[str, Any]) -> tuple[str, ...]:
        estimate = number(row.get("estimate_p50_ms"))
        return (*sweep_cells(row), *([MISSING if estimate is None else f"{estimate:.2f}"] if estimated else []))

    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if 2 <= i <= 6 or i == 8 else ''}>{html.escape(cell)}</td>" for i, cell in enumerate(cells(row))) + "</tr>"
        for row in rows
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>edgekit sweep: {html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#1f2933}table{border-collapse:collapse}"
        "td,th{border:1px solid #d9e2ec;padding:4px 8px;text-align:left}td.num{text-align:right;white-space:nowrap}"
        "svg.plot{max-width:100%;height:auto}.note{color:#616e7c;font-style:italic}</style>"
        f"</head><body><h1>Sweep of {html.escape(title)}</h1>{plot}<table><thead><tr>"
        + "".join(f"<th>{html.escape(name)}</th>" for name in header)
        + f"</tr></thead><tbody>{body}</tbody></table></body></html>"
    )


def sweep_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """One variant as the sweep table shows it (the CLI and sweep.html): missing numbers as an em dash, an
    empty note when there is nothing to say."""

    def maybe(value: Any, write: Any) -> str:
        return MISSING if number(value) is None else write(value)

    return (
        str(row.get("variant", "")),
        str(row.get("status", "")),
        maybe(row.get("size_bytes"), fmt_bytes),
        maybe(row.get("p50_ms"), lambda v: f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"),  # 12.10, 0.00763
        maybe(row.get("latency_vs_fp32"), lambda v: f"{v:.2f}×"),
        maybe(row.get("metric_value"), lambda v: fmt_number(v, 4)),
        maybe(row.get("cosine_min"), fmt_cosine),
        str(row.get("reason") or ""),
    )


__all__ = ["pareto_front", "render_sweep_html", "sweep_cells", "sweep_pareto_svg", "sweep_title"]
