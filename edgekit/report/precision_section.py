"""The report's precision section: the quantization plan, what stayed in higher precision and why, the
``auto`` search's candidates, the sensitivity ranking plot, and the pruning report."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from edgekit.report.formatting import dig, fmt_value


def _sensitivity_plot(auto: dict[str, Any]) -> Markup | None:
    data = auto.get("sensitivity")
    if not isinstance(data, dict):
        return None
    try:
        from edgekit.quantize.sensitivity import SensitivityReport, sensitivity_svg

        svg = sensitivity_svg(SensitivityReport.from_manifest(data), kept=list((auto.get("kept_in_higher_precision") or {}).keys()))
    except Exception:  # a plot must never break the report; the tables below carry the numbers
        return None
    return Markup(svg) if svg else None


def precision_section(manifest: dict[str, Any]) -> dict[str, Any]:
    quantization = dig(manifest, "quantization") if isinstance(dig(manifest, "quantization"), dict) else {}
    prune = dig(manifest, "prune") if isinstance(dig(manifest, "prune"), dict) else None
    decision = dig(manifest, "precision_decision") or {}
    plan = quantization.get("plan") or {}
    auto = quantization.get("auto") if isinstance(quantization.get("auto"), dict) else None
    calibration = quantization.get("calibration") or {}
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
    kept = dict(plan.get("excluded") or {})
    if auto:
        kept.update(auto.get("kept_in_higher_precision") or {})
    candidates = []
    for row in (auto or {}).get("candidates", []):
        candidates.append((row.get("name"), row.get("status"), fmt_value(row.get("latency_ratio")), fmt_value(row.get("value")),
                           fmt_value(row.get("cosine_min")), row.get("detail") or ""))
    prune_rows = []
    if prune:
        for layer in prune.get("layers") or []:
            prune_rows.append((layer.get("name"), layer.get("action"), fmt_value(layer.get("weight_shape_before")),
                               fmt_value(layer.get("weight_shape_after")), fmt_value(layer.get("sparsity"))))
    return {
        "available": bool(quantization or prune or decision),
        "facts": facts,
        "kept": sorted(kept.items()),
        "candidates": candidates,
        "plot": _sensitivity_plot(auto) if auto else None,
        "notes": list(plan.get("notes") or []) + list((auto or {}).get("notes") or []),
        "prune": None if not prune else {
            "facts": [("method", fmt_value(prune.get("method"))), ("target sparsity", fmt_value(prune.get("target_sparsity"))),
                      ("achieved sparsity", fmt_value(prune.get("achieved_sparsity"))), ("parameters before", fmt_value(prune.get("params_before"))),
                      ("parameters after", fmt_value(prune.get("params_after"))), ("2:4 sparse", fmt_value(prune.get("sparse_2_4"))),
                      ("fine-tune", fmt_value(bool(prune.get("fine_tune"))))],
            "layers": prune_rows,
            "notes": list(prune.get("notes") or []),
        },
    }
