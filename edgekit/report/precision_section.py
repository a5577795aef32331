"""The report's precision section: the quantization plan, what stayed in higher precision and why, the
``auto`` search's candidates, the sensitivity ranking plot, and the pruning report."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from edgekit.report.formatting import NA, as_dict, as_list, dig, fmt_value


def _sensitivity_plot(auto: dict[str, Any]) -> Markup | None:
    data = auto.get("sensitivity")
    if not isinstance(data, dict):
        return None
    try:
        from edgekit.quantize.sensitivity import SensitivityReport, sensitivity_svg

        svg = sensitivity_svg(SensitivityReport.from_manifest(data), kept=list(as_dict(auto.get("kept_in_higher_precision"))))
    except Exception:  # a plot must never break the report; the tables below carry the numbers
        return None
    return Markup(svg) if svg else None


def _notes(value: Any) -> list[str]:
    """Notes as a list of texts: a list's entries (nulls left out), one text as one note (not one per character)."""
    if isinstance(value, str):
        return [value] if value else []
    return [fmt_value(v) for v in as_list(value) if v is not None]


def _kept_nodes(value: Any) -> dict[str, Any]:
    """Node -> why it stayed in higher precision: a mapping as it is, a list of node names with no reason (n/a)."""
    if isinstance(value, list):
        return {fmt_value(node): NA for node in value if node is not None}
    return {fmt_value(node): fmt_value(why) for node, why in as_dict(value).items()}


def precision_section(manifest: dict[str, Any]) -> dict[str, Any]:
    """The precision section's figures; every field may be missing, null or of another type (then left out or n/a)."""
    quantization = as_dict(dig(manifest, "quantization"))
    prune = as_dict(dig(manifest, "prune")) or None
    decision = as_dict(dig(manifest, "precision_decision"))
    plan = as_dict(quantization.get("plan"))
    auto = as_dict(quantization.get("auto")) or None
    calibration = as_dict(quantization.get("calibration"))
    facts = [
        ("precision", fmt_value(dig(manifest, "precision"))),
        ("requested", fmt_value(decision.get("requested"))),
        ("decision", fmt_value(decision.get("policy"))),
    ]
    if decision.get("refused_because"):
        facts.append(("refused because", fmt_value(decision["refused_because"])))
    for key in ("activation_type", "weight_type", "per_channel", "calibrator"):
        if key in plan:
            facts.append((key.replace("_", " "), fmt_value(plan[key])))
    for key in ("calibrator", "samples", "tensors", "from_cache", "file"):
        if key in calibration:
            facts.append((f"calibration {key.replace('_', ' ')}", fmt_value(calibration[key])))
    kept = _kept_nodes(plan.get("excluded"))
    if auto:
        kept.update(_kept_nodes(auto.get("kept_in_higher_precision")))
    candidates = []
    for row in as_list((auto or {}).get("candidates")):
        if isinstance(row, dict):  # a null or mistyped row is left out
            detail = fmt_value(row.get("detail")) if row.get("detail") else ""
            candidates.append(tuple(fmt_value(row.get(key)) for key in ("name", "status", "latency_ratio", "value", "cosine_min"))
                              + (detail,))  # fmt: skip
    prune_rows = []
    for layer in as_list((prune or {}).get("layers")):
        if isinstance(layer, dict):  # a null or mistyped row is left out
            prune_rows.append(tuple(fmt_value(layer.get(key))
                                    for key in ("name", "action", "weight_shape_before", "weight_shape_after", "sparsity")))
    return {
        "available": bool(quantization or prune or decision),
        "facts": facts,
        "kept": sorted(kept.items()),
        "candidates": candidates,
        "plot": _sensitivity_plot(auto) if auto else None,
        "notes": _notes(plan.get("notes")) + _notes((auto or {}).get("notes")),
        "prune": None if not prune else {
            "facts": [("method", fmt_value(prune.get("method"))), ("target sparsity", fmt_value(prune.get("target_sparsity"))),
                      ("achieved sparsity", fmt_value(prune.get("achieved_sparsity"))),
                      *((("weights this pass zeroed", fmt_value(prune.get("newly_zeroed"))),) if prune.get("newly_zeroed") is not None else ()),
                      ("parameters before", fmt_value(prune.get("params_before"))),
                      ("parameters after", fmt_value(prune.get("params_after"))), ("2:4 sparse", fmt_value(prune.get("sparse_2_4"))),
                      ("fine-tune", fmt_value(bool(prune.get("fine_tune"))))],
            "layers": prune_rows,
            "notes": _notes(prune.get("notes")),
        },
    }
