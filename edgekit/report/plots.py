"""The report's plots, each returned as an inline ``<svg>`` string.

Figures are drawn with matplotlib's object API (``matplotlib.figure.Figure``), never through
``pyplot``: no GUI backend is ever selected (so no ``matplotlib.use("Agg")`` is needed), and
importing or calling this module changes no global matplotlib state; settings apply inside an
``rc_context`` only. Text stays text in the SVG (``svg.fonttype: none``), which keeps each plot to
a few tens of kilobytes; element ids are prefixed per plot so several SVGs can share one HTML page.
Each function returns ``None`` when it has nothing to draw.
"""

from __future__ import annotations

import functools
import io
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from edgekit.report.formatting import number

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_IN = 7.0
BLUE = "#3b6ea5"
GREEN = "#2e7d32"
RED = "#c62828"
GREY = "#9e9e9e"
PERCENTILE_STYLES = {"p50": ("#1b5e20", "-"), "p90": ("#e65100", "--"), "p99": ("#b71c1c", ":")}
MAX_BINS = 60
#: matplotlib settings while drawing: text stays text in the SVG, clip-path ids are reproducible.
_RC_PARAMS = {"svg.fonttype": "none", "svg.hashsalt": "edgekit", "font.size": 9.5, "axes.titlesize": 10.5}

P = ParamSpec("P")
R = TypeVar("R")


def _styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Run a plot function under the report's matplotlib settings, leaving the global ones alone."""

    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib

        with matplotlib.rc_context(_RC_PARAMS):
            return draw(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class ShapeParity:
    """One checked input shape of the export parity check."""

    label: str
    max_abs_diff: float
    passed: bool | None = None


@_styled
def latency_histogram_svg(latencies_ms: Sequence[float], percentiles_ms: Mapping[str, float] | None = None) -> str | None:
    """Histogram of per-iteration latencies with p50/p90/p99 marked.

    ``percentiles_ms`` (keys ``p50``, ``p90``, ``p99``) lets the plot show the same numbers as the
    report's tables; missing ones are computed from the samples.
    """
    import numpy as np

    values = np.asarray([float(v) for v in latencies_ms if _finite(v)], dtype=float)
    if values.size == 0:
        return None
    marks = {name: float(np.percentile(values, int(name[1:]))) for name in PERCENTILE_STYLES}
    for name, value in (percentiles_ms or {}).items():
        if name in marks and _finite(value):
            marks[name] = float(value)
    # A few very slow iterations (a GC pause, a page fault) would squash the rest into one bar:
    # past 2x p99 they are left off the chart and counted in the title instead.
    shown = values[values <= 2 * marks["p99"]] if values.max() > 2 * marks["p99"] > 0 else values
    edges = np.histogram_bin_edges(shown, bins="auto")
    if len(edges) - 1 > MAX_BINS:
        edges = np.histogram_bin_edges(shown, bins=MAX_BINS)
    figure, axes = _figure(3.0)
    axes.hist(shown, bins=edges, color=BLUE, alpha=0.85, edgecolor="white", linewidth=0.5)
    for name, (color, style) in PERCENTILE_STYLES.items():
        axes.axvline(marks[name], color=color, linestyle=style, linewidth=1.6, label=f"{name} {marks[name]:.3g} ms")
    title = f"Latency per iteration ({values.size} iterations)"
    if shown.size < values.size:
        title += f"\n{values.size - shown.size} slower than {2 * marks['p99']:.3g} ms not shown (max {values.max():.3g} ms)"
    axes.set_title(title)
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("iterations")
    axes.legend(loc="best", framealpha=0.85, edgecolor="none")
    axes.grid(axis="y", alpha=0.3)
    return _to_svg(figure, "latency", "Histogram of per-iteration latency in milliseconds")


@_styled
def stage_times_svg(stages: Sequence[tuple[str, float]]) -> str | None:
    """Horizontal bars of seconds per pipeline stage, in pipeline order from the top."""
    rows = [(name, float(seconds)) for name, seconds in stages if _finite(seconds) and seconds >= 0]
    if not rows:
        return None
    total_s = sum(seconds for _, seconds in rows)
    figure, axes = _figure(_bar_height(len(rows)))
    labels = [name for name, _ in rows]
    values = [seconds for _, seconds in rows]
    axes.barh(range(len(rows)), values, color=BLUE)
    _label_bars(axes, labels, [_seconds_text(v) for v in values], max(values) or 1.0)
    axes.set_title(f"Time per pipeline stage (total {_seconds_text(total_s)})")
    axes.set_xlabel("seconds")
    return _to_svg(figure, "stages", "Bar chart of seconds spent per pipeline stage")


@_styled
def size_by_op_type_svg(size_bytes_by_op_type: Mapping[str, int], top: int = 12) -> str | None:
    """Horizontal bars of weight bytes per consuming op type, largest first; the tail past ``top``
    is folded into one ``other`` bar."""
    rows = sorted(((k, int(v)) for k, v in size_bytes_by_op_type.items() if v and v > 0), key=lambda kv: -kv[1])
    if not rows:
        return None
    if len(rows) > top:
        tail = rows[top - 1 :]
        rows = [*rows[: top - 1], (f"other ({len(tail)} op types)", sum(v for _, v in tail))]
    total = sum(v for _, v in rows)
    from edgekit.report.formatting import BYTE_UNITS, fmt_bytes

    unit, scale = [(name, size) for name, size in BYTE_UNITS if rows[0][1] >= size or size == 1.0][-1]  # the largest bar's unit
    values = [v / scale for _, v in rows]
    figure, axes = _figure(_bar_height(len(rows)))
    axes.barh(range(len(rows)), values, color=BLUE)
    texts = [f"{fmt_bytes(b)} ({_percent_text(b, total)})" for _, b in rows]
    _label_bars(axes, [name for name, _ in rows], texts, max(values))
    axes.set_title(f"Weight size by consuming op type (total {fmt_bytes(total)})")
    axes.set_xlabel(f"initializer data ({unit})")
    return _to_svg(figure, "size", f"Bar chart of weight {unit} per ONNX op type")


@_styled
def parity_svg(shapes: Sequence[ShapeParity], atol: float | None) -> str | None:
    """Max absolute ONNX-vs-PyTorch difference per checked shape on a log axis, with the atol line.
    Bars start a decade below the smallest difference; an exact match is a stub labelled so."""
    rows = [s for s in shapes if _finite(s.max_abs_diff) and s.max_abs_diff >= 0]
    if not rows:
        return None
    has_atol = atol is not None and _finite(atol) and atol > 0
    reference = [s.max_abs_diff for s in rows if s.max_abs_diff > 0] + ([atol] if has_atol else [])
    start = min(reference) / 10 if reference else 1e-12
    ends = [max(s.max_abs_diff, start * 2) for s in rows]
    figure, axes = _figure(_bar_height(len(rows)))
    axes.barh(range(len(rows)), [end - start for end in ends], left=start, color=[_parity_color(s, atol) for s in rows])
    axes.set_xscale("log")
    _plain_log_ticks(axes)
    texts = [f"{s.max_abs_diff:.2e}" if s.max_abs_diff > 0 else "0 (exact)" for s in rows]
    _label_bars(axes, [s.label for s in rows], texts, max(ends), log=True)
    axes.set_xlim(start, max([*ends, *([atol] if has_atol else [])]) * 30)
    if has_atol:
        axes.axvline(atol, color=RED, linestyle="--", linewidth=1.4)
        axes.annotate(f" atol {atol:.0e}", xy=(atol, 1.0), xycoords=("data", "axes fraction"), va="bottom",
                      color=RED, fontsize=8.5)
    axes.set_title("Export parity: max |ONNX - PyTorch| per checked shape", pad=14)
    axes.set_xlabel("max absolute difference (log scale)")
    return _to_svg(figure, "parity", "Bar chart of maximum absolute difference per checked shape against atol")


# ---------------------------------------------------------------- drawing helpers


def _finite(value: object) -> bool:
    """A real, finite number (NumPy scalars included, bools not); an integer past any float (a hostile manifest's
    ``p50_ms: 10**400``) is not one, as :func:`~edgekit.report.formatting.number` reads it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return number(float(value)) is not None
    except (OverflowError, ValueError, TypeError):
        return False


def _parity_color(shape: ShapeParity, atol: float | None) -> str:
    passed = shape.passed
    if passed is None and atol is not None and _finite(atol):
        passed = shape.max_abs_diff <= atol
    return GREY if passed is None else (GREEN if passed else RED)


def _percent_text(part: int, total: int) -> str:
    share = 100 * part / total
    return "<1%" if share < 1 else f"{share:.0f}%"


def _bar_height(bars: int) -> float:
    return min(7.0, max(2.2, 1.1 + 0.34 * bars))


def _seconds_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.3g} s"


def _figure(height_in: float) -> "tuple[Figure, Axes]":
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
    axes = figure.add_subplot()
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    return figure, axes


def _label_bars(axes: "Axes", labels: Sequence[str], texts: Sequence[str], largest: float, log: bool = False) -> None:
    """Bar names on the y axis (first at the top) and each bar's value just past its end."""
    axes.set_yticks(range(len(labels)), labels=[_shorten(label) for label in labels])
    axes.invert_yaxis()
    for index, (text, patch) in enumerate(zip(texts, axes.patches)):
        end = patch.get_x() + patch.get_width()
        axes.text(end * (1.15 if log else 1) + (0 if log else largest * 0.01), index, text, va="center", fontsize=8.5)
    if not log:  # log axes set their own limits
        axes.set_xlim(0, largest * 1.3)


def _plain_log_ticks(axes: "Axes") -> None:
    """Decade ticks written ``1e-06`` rather than as mathtext: as readable, and far faster to lay out."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}"))
    axes.xaxis.set_minor_formatter(NullFormatter())


def literal_text(text: str) -> str:
    """``text`` for a matplotlib label with each '$' made literal: names are never parsed as mathtext (an unbalanced
    '$' would raise ValueError, a balanced pair would be drawn as a formula)."""
    return text.replace("$", r"\$")


def _shorten(label: str, limit: int = 32) -> str:
    """A bar name cut to ``limit`` characters, with '$' made literal (not matplotlib mathtext)."""
    label = label if len(label) <= limit else label[: limit - 1] + "\u2026"
    return literal_text(label)


def _to_svg(figure: "Figure", prefix: str, description: str) -> str:
    """The figure as an ``<svg>`` element ready to inline: no XML prolog, no metadata, and every
    element id (and reference to one) prefixed so that plots sharing a page never clash."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="ek-{prefix}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#ek-{prefix}-\1)", svg)
    svg = re.sub(r'href="#([^"]+)"', rf'href="#ek-{prefix}-\1"', svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{description}" class="plot" ', 1)
