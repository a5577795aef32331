"""The measured sections of the report (export parity, accuracy, benchmark, stage times), each
turned from manifest entries into display-ready text, table rows and a plot.

Every builder returns a plain dict for the template; missing data gives ``available: False`` and a
``note`` saying why, never an exception.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from edgekit.report import plots
from edgekit.report.formatting import (
    NA,
    dig,
    fmt_cosine,
    fmt_mb,
    fmt_ms,
    fmt_number,
    fmt_sci,
    fmt_seconds,
    fmt_value,
    number,
    status,
)

__all__ = ["accuracy_section", "benchmark_section", "parity_section", "stages_section"]

#: Keys of a parity ``shapes`` entry that describe which shape was checked, in display order.
_SHAPE_NAME_KEYS = ("label", "name", "point")
_SHAPE_VALUE_KEYS = ("shape", "shapes", "inputs", "input_shapes", "dims")


def parity_section(manifest: dict[str, Any]) -> dict[str, Any]:
    export = dig(manifest, "export")
    parity = dig(export, "parity")
    section: dict[str, Any] = {
        "exporter": fmt_value(dig(export, "exporter")),
        "opset": fmt_value(dig(export, "opset")),
        "seconds": fmt_seconds(dig(export, "seconds")),
        "available": isinstance(parity, dict),
        "status": status(dig(parity, "passed")),
        "max_abs_diff": fmt_sci(dig(parity, "max_abs_diff")),
        "atol": fmt_sci(dig(parity, "atol")),
        "rtol": fmt_sci(dig(parity, "rtol")),
        "cosine_min": fmt_cosine(dig(parity, "cosine_min")),
        "min_cosine": fmt_cosine(dig(parity, "min_cosine")),
        "worst_output": fmt_value(dig(parity, "worst_output")),
        "rows": [],
        "plot": None,
        "note": "",
    }
    if not isinstance(parity, dict):
        section["note"] = (
            "No PyTorch reference: the model came as an ONNX file, so export parity was not checked."
            if dig(export, "exporter") == "none"
            else "The manifest has no export parity results."
        )
        return section
    shapes = dig(parity, "shapes")
    entries = shapes if isinstance(shapes, list) else []
    section["rows"] = [
        {
            "label": _shape_label(entry, index),
            "max_abs_diff": fmt_sci(dig(entry, "max_abs_diff")),
            "cosine_min": fmt_cosine(dig(entry, "cosine_min")),
            "worst_output": fmt_value(dig(entry, "worst_output")),
            "status": status(dig(entry, "passed")),
        }
        for index, entry in enumerate(entries)
    ]
    checked = []
    for row, entry in zip(section["rows"], entries):
        diff = number(dig(entry, "max_abs_diff"))
        if diff is not None:
            passed = dig(entry, "passed")
            checked.append(plots.ShapeParity(row["label"], diff, passed if isinstance(passed, bool) else None))
    section["plot"] = _markup(plots.parity_svg(checked, number(dig(parity, "atol"))))
    return section


def accuracy_section(manifest: dict[str, Any]) -> dict[str, Any]:
    accuracy = dig(manifest, "accuracy")
    budget = _budget_text(dig(accuracy, "budget"))
    reference = fmt_number(dig(accuracy, "reference"))
    section = {
        "available": isinstance(accuracy, dict),
        "status": status(dig(accuracy, "passed")),
        "metric": fmt_value(dig(accuracy, "metric")),
        "output": fmt_value(dig(accuracy, "output")),
        "value": fmt_number(dig(accuracy, "value")),
        "reference": reference,
        "drop": fmt_number(dig(accuracy, "drop")),
        "budget": budget,
        "samples": fmt_number(dig(accuracy, "samples")),
        "card_note": f"reference {reference}; budget {budget}" if isinstance(accuracy, dict) else "no evaluation",
        "note": "" if isinstance(accuracy, dict) else "The recipe has no evaluation, so accuracy was not measured.",
    }
    return section


def benchmark_section(manifest: dict[str, Any], latency_samples_ms: list[float] | None) -> dict[str, Any]:
    bench = dig(manifest, "benchmark")
    host = dig(bench, "host")
    stats = [
        ("p50", fmt_ms(dig(bench, "p50_ms"))),
        ("p90", fmt_ms(dig(bench, "p90_ms"))),
        ("p99", fmt_ms(dig(bench, "p99_ms"))),
        ("mean", fmt_ms(dig(bench, "mean_ms"))),
        ("min", fmt_ms(dig(bench, "min_ms"))),
        ("max", fmt_ms(dig(bench, "max_ms"))),
    ]
    throughput = number(dig(bench, "throughput_per_s"))
    setup = [
        ("host", fmt_value(host)),
        ("batch", fmt_value(dig(bench, "batch"))),
        ("shape", fmt_value(dig(bench, "shape"))),
        ("warm-up iterations", fmt_value(dig(bench, "warmup"))),
        ("timed iterations", fmt_value(dig(bench, "iterations"))),
        ("intra-op threads", fmt_value(dig(bench, "threads"))),
        ("throughput", f"{fmt_number(throughput, 3)} per second" if throughput is not None else NA),
        ("peak RSS", fmt_mb(dig(bench, "peak_rss_mb"))),
    ]
    percentiles = {name: dig(bench, f"{name}_ms") for name in ("p50", "p90", "p99")}
    plot = plots.latency_histogram_svg(latency_samples_ms, percentiles) if latency_samples_ms else None
    return {
        "available": isinstance(bench, dict),
        "where": f"on {host}" if host else "",
        "stats": stats,
        "setup": setup,
        "plot": _markup(plot),
        "note": "" if plot else "No per-iteration latencies were recorded, so there is no histogram.",
    }


def stages_section(manifest: dict[str, Any]) -> dict[str, Any]:
    stages = dig(manifest, "stages")
    entries = stages if isinstance(stages, list) else []
    timed = [
        (fmt_value(dig(entry, "name")), seconds)
        for entry in entries
        if (seconds := number(dig(entry, "seconds"))) is not None
    ]
    total = sum(seconds for _, seconds in timed)
    return {
        "rows": [(name, fmt_seconds(seconds)) for name, seconds in timed],
        "total": fmt_seconds(total) if timed else NA,
        "plot": _markup(plots.stage_times_svg(timed)),
    }


# ---------------------------------------------------------------- helpers


def _markup(svg: str | None) -> Markup | None:
    """Plot SVG is trusted markup: matplotlib escapes every text it writes into it."""
    return Markup(svg) if svg else None


def _budget_text(budget: Any) -> str:
    if not isinstance(budget, dict):
        return NA
    parts = []
    if number(budget.get("max_drop")) is not None:
        parts.append(f"drop \u2264 {fmt_number(budget['max_drop'])}")
    if number(budget.get("min_value")) is not None:
        parts.append(f"value \u2265 {fmt_number(budget['min_value'])}")
    if number(budget.get("max_value")) is not None:
        parts.append(f"value \u2264 {fmt_number(budget['max_value'])}")
    return ", ".join(parts) or NA


def _shape_label(entry: Any, index: int) -> str:
    """A readable name for one parity ``shapes`` entry, whatever keys the exporter wrote."""
    if not isinstance(entry, dict):
        return fmt_value(entry)
    name = " ".join(str(entry[key]) for key in _SHAPE_NAME_KEYS if isinstance(entry.get(key), (str, int)))
    shapes = []
    for key in _SHAPE_VALUE_KEYS:
        value = entry.get(key)
        if isinstance(value, dict):
            shapes.extend(f"{tensor} {fmt_value(dims)}" for tensor, dims in value.items())
        elif value is not None:
            shapes.append(fmt_value(value))
    detail = "; ".join(shapes)
    if name and detail:
        return f"{name}: {detail}"
    return name or detail or f"shape {index + 1}"
