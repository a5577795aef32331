"""The measured sections of the report (export parity, accuracy, benchmark, stage times), each
turned from manifest entries into display-ready text, table rows and a plot.

Every builder returns a plain dict for the template; missing data gives ``available: False`` and a
``note`` saying why, never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup

from edgekit.report import plots
from edgekit.report.formatting import (
    NA,
    device_applied_precision,
    dig,
    fmt_cosine,
    fmt_host,
    fmt_mib,
    fmt_ms,
    fmt_number,
    fmt_sci,
    fmt_seconds,
    fmt_value,
    measured_on_target,
    number,
    peak_rss_note,
    status,
    where_measured,
)

__all__ = ["accuracy_section", "benchmark_section", "parity_section", "percentile_label", "stages_section"]

#: Keys of a parity ``shapes`` entry that describe which shape was checked, in display order.
_SHAPE_NAME_KEYS = ("label", "name", "point")
_SHAPE_VALUE_KEYS = ("dims", "shape", "shapes", "input_shapes", "inputs")


def parity_section(manifest: dict[str, Any]) -> dict[str, Any]:
    export = dig(manifest, "export")
    parity = dig(export, "parity")
    section: dict[str, Any] = {
        "exporter": fmt_value(dig(export, "exporter")),
        "fallback_reason": fmt_value(dig(export, "fallback_reason")) if dig(export, "fallback_reason") else "",
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
    min_cosine = number(dig(parity, "min_cosine"))
    outputs = {_entry_output(entry) for entry in entries}
    kinds = {dig(entry, "inputs") for entry in entries if isinstance(dig(entry, "inputs"), str)}
    checked = []
    for index, entry in enumerate(entries):
        label, passed, output = _shape_label(entry, index), _entry_passed(entry, min_cosine), _entry_output(entry)
        kind = dig(entry, "inputs") if isinstance(dig(entry, "inputs"), str) else None
        section["rows"].append({
            "label": label,
            "output": fmt_value(output),
            "inputs": fmt_value(kind),
            "max_abs_diff": fmt_sci(dig(entry, "max_abs_diff")),
            "cosine_min": fmt_cosine(dig(entry, "cosine_min")),
            "status": status(passed),
        })
        diff = number(dig(entry, "max_abs_diff"))
        if diff is not None:  # bar names carry the output and input kind only where they vary
            bar = label + (f" {output}" if len(outputs) > 1 and output else "") + (f" ({kind})" if len(kinds) > 1 and kind else "")
            checked.append(plots.ShapeParity(bar, diff, passed))
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
        "reference_source": fmt_value(dig(accuracy, "reference_source") or "FP32 reference"),
        "cosine_min": fmt_cosine(dig(accuracy, "cosine_min")) if dig(accuracy, "cosine_min") is not None else "",
        "drop": fmt_number(dig(accuracy, "drop")),
        "budget": budget,
        "samples": fmt_number(dig(accuracy, "samples")),
        "card_note": (f"reference {reference}; budget {budget}" if isinstance(accuracy, dict) else "no evaluation")
                     + ("; the host FP32 graph's, not the device's " + str(dig(manifest, "precision"))
                        if isinstance(accuracy, dict) and device_applied_precision(manifest) else ""),
        "note": ("The recipe has no evaluation, so accuracy was not measured." if not isinstance(accuracy, dict)
                 else "" if measured_on_target(manifest) else
                 f"Measured {where_measured(manifest)}: the device's own kernels may differ slightly."),
        # The build's own words on what was measured (a TensorRT bundle's FP32 graph) and on how to budget it.
        "measured_note": _text(dig(accuracy, "note")),
        "advice": _text(dig(accuracy, "details", "advice")),
    }
    return section


def _text(value: Any) -> str:
    """A free-text manifest field as shown, or empty where it is missing or not text."""
    return value if isinstance(value, str) else ""


def benchmark_section(manifest: dict[str, Any], latency_samples_ms: Sequence[float] | None) -> dict[str, Any]:
    bench = dig(manifest, "benchmark")
    host = dig(bench, "host")
    stats = [
        ("p50", fmt_ms(dig(bench, "p50_ms"))),
        (percentile_label("p90", dig(bench, "iterations")), fmt_ms(dig(bench, "p90_ms"))),
        (percentile_label("p99", dig(bench, "iterations")), fmt_ms(dig(bench, "p99_ms"))),
        ("mean", fmt_ms(dig(bench, "mean_ms"))),
        ("min", fmt_ms(dig(bench, "min_ms"))),
        ("max", fmt_ms(dig(bench, "max_ms"))),
    ]
    throughput = number(dig(bench, "throughput_per_s"))
    setup = [
        ("host", fmt_host(host)),
        ("batch", fmt_value(dig(bench, "batch"))),
        ("shape", fmt_value(dig(bench, "shape"))),
        ("warm-up iterations", fmt_value(dig(bench, "warmup"))),
        ("timed iterations", fmt_value(dig(bench, "iterations"))),
        ("intra-op threads", fmt_value(dig(bench, "threads"))),
        ("execution providers", fmt_value(dig(bench, "providers"))),
        ("throughput", f"{fmt_number(throughput, 3)} per second" if throughput is not None else NA),
        ("peak RSS of the build process", f"{fmt_mib(dig(bench, 'peak_rss_mb'))} ({peak_rss_note(bench)})"
         if number(dig(bench, "peak_rss_mb")) is not None else fmt_mib(dig(bench, "peak_rss_mb"))),
    ]
    percentiles = {name: dig(bench, f"{name}_ms") for name in ("p50", "p90", "p99")}
    samples = list(latency_samples_ms) if latency_samples_ms is not None else []  # a list, tuple or NumPy array
    plot = plots.latency_histogram_svg(samples, percentiles) if samples else None
    return {
        "available": isinstance(bench, dict),
        "where": where_measured(manifest) if host else "",
        "stats": stats,
        "setup": setup,
        "plot": _markup(plot),
        "note": "" if plot else "No per-iteration latencies were recorded, so there is no histogram.",
    }


def percentile_label(name: str, timed_calls: Any) -> str:
    """``p99`` as a column label, flagged where too few calls were timed for it to be a measured tail: a percentile q
    has a sample beyond it only from 1 / (1 - q) calls on (p99: 100, p90: 10); below that NumPy's linear interpolation
    places it between the largest samples, e.g. ``p99 (n=10: interpolated, not a measured tail)``."""
    calls = number(timed_calls)
    needed = round(100 / (100 - int(name[1:])))
    if calls is None or calls >= needed:
        return name
    return f"{name} (n={calls:.0f}: interpolated, not a measured tail)"


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


def _entry_output(entry: Any) -> str | None:
    output = dig(entry, "output") or dig(entry, "worst_output")
    return output if isinstance(output, str) else None


def _entry_passed(entry: Any, min_cosine: float | None) -> bool | None:
    """A comparison's verdict: its own ``passed``, else ``within_tolerance`` and the cosine floor."""
    passed = dig(entry, "passed")
    if isinstance(passed, bool):
        return passed
    within = dig(entry, "within_tolerance")
    if not isinstance(within, bool):
        return None
    cosine = number(dig(entry, "cosine_min"))
    return within and (cosine is None or min_cosine is None or cosine >= min_cosine)


def _shape_label(entry: Any, index: int) -> str:
    """A readable name for one parity comparison: its point and the dims or input shapes it ran at,
    e.g. ``opt: batch=8, seq=16`` or ``max: pixels [64, 1, 8, 8]``."""
    if not isinstance(entry, dict):
        return fmt_value(entry)
    name = " ".join(str(entry[key]) for key in _SHAPE_NAME_KEYS if isinstance(entry.get(key), (str, int)))
    parts = []
    for key in _SHAPE_VALUE_KEYS:
        value = entry.get(key)
        if isinstance(value, dict):
            parts.extend(_dim_or_shape(dim, size) for dim, size in value.items())
        elif isinstance(value, list):
            parts.append(fmt_value(value))
    detail = ", ".join(parts)
    if name and detail:
        return f"{name}: {detail}"
    return name or detail or f"shape {index + 1}"


def _dim_or_shape(name: Any, value: Any) -> str:
    return f"{name} {fmt_value(value)}" if isinstance(value, list) else f"{name}={fmt_value(value)}"
