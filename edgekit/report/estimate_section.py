"""The report's estimate section: what the bundle will do on its target when the target is another device
(an ESTIMATE from :mod:`edgekit.estimate`, with the factors it rests on) and a plot of the estimated time
per node class. Absent for a target that is this host (its numbers are measured). The report does not run the
estimator: the pipeline passes the estimate in, as data."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from edgekit.report.plots import BLUE, _bar_height, _figure, _label_bars, _percent_text, _styled, _to_svg

if TYPE_CHECKING:
    from edgekit.estimate.estimate import Estimate

logger = logging.getLogger(__name__)


@_styled
def time_by_class_svg(by_class: dict[str, dict[str, float]]) -> str | None:
    """Horizontal bars of estimated ms per node class, largest first."""
    rows = sorted(((cls, float(row["ms"])) for cls, row in by_class.items() if row.get("ms", 0) > 0), key=lambda kv: -kv[1])
    if not rows:
        return None
    total = sum(ms for _, ms in rows)
    figure, axes = _figure(_bar_height(len(rows)))
    values = [ms for _, ms in rows]
    axes.barh(range(len(rows)), values, color=BLUE)
    _label_bars(axes, [cls for cls, _ in rows], [f"{ms:.3g} ms ({_percent_text(int(ms * 1e6), int(total * 1e6))})" for ms in values], max(values))
    axes.set_title(f"Estimated time per node class (total {total:.3g} ms, an estimate)")
    axes.set_xlabel("ms (estimate)")
    return _to_svg(figure, "estimate", "Bar chart of estimated milliseconds per node class on the target")


#: the estimate's layer model -> how the section says the graph was timed
METHOD = {"per-node": "a per-node roofline over the ONNX graph at the benchmark shape with efficiency factors per node class",
          "tensorrt": "a per-layer roofline over the graph fused as TensorRT fuses it (conv / GEMM epilogues, pointwise chains, "
                      "attention), at the benchmark shape, with efficiency factors per layer class and a launch cost per layer"}  # fmt: skip


def estimate_section(result: Estimate | None) -> dict[str, Any]:
    """The section's context from the estimate of the bundle on its target, made by the pipeline
    (:func:`edgekit.estimate.summary.estimate_for_bundle`); None leaves the section out."""
    if result is None:
        return {"available": False, "facts": [], "energy": [], "factors": [], "plot": None}
    try:
        plot = time_by_class_svg(result.by_class)
    except Exception:  # a plot must never break the report; the table carries the numbers
        logger.info("estimate plot failed", exc_info=True)
        plot = None
    mode = f" at {result.power_mode}" if result.power_mode else ""
    facts = [("target", f"{result.target}{mode} ({result.engine})"), ("p50 latency (estimate)", f"{result.p50_ms:.3f} ms"),
             ("throughput (estimate)", f"{result.throughput_text()} at batch {result.batch}"),
             ("peak memory (estimate)", f"{result.peak_memory_mb:.1f} MB: weights {result.weights_mb:.1f} + activations "
                                        f"{result.activations_mb:.1f} + runtime {result.runtime_overhead_mb:.0f}"),
             ("factors", "calibrated" if result.calibration.get("calibrated") else "default (uncalibrated)")]  # fmt: skip
    if not result.energy:
        facts.append(("energy (estimate)", result.no_energy_text()))
    energy = [(e.power_mode, f"{e.watts:g} W", f"{e.latency_ms:.3f} ms", f"{e.energy_per_inference_mj:.3g} mJ per sample"
               + (f" ({e.energy_per_call_mj:.3g} mJ per batch-{e.batch} call)" if e.batch > 1 else "")) for e in result.energy]
    return {"available": True, "facts": facts, "energy": energy, "factors": list(result.factors), "method": METHOD[result.layer_model],
            "plot": Markup(plot) if plot else None}  # fmt: skip
