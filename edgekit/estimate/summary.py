"""The estimate a build shows beside the host's measurement when the target is another device (build
summary, ``report.html``, ``edgekit sweep``): computed from the bundle's manifest and graph, never raising
(a target without the figures an estimate needs gives ``None`` and the reason)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.estimate.estimate import Estimate, estimate
from edgekit.estimate.hardware import needs_measured_peak

logger = logging.getLogger(__name__)


def estimate_for_bundle(manifest: Mapping[str, Any], bundle_dir: Path) -> tuple[Estimate | None, str | None]:
    """(the estimate of the bundle on its own target, or None with the reason it could not be made)."""
    from edgekit.target import TargetProfile

    try:
        target = TargetProfile.model_validate(manifest["target"])
        if needs_measured_peak(target):
            return None, "the target is this host: its numbers are measured, not estimated"
        bench = manifest.get("benchmark") or {}
        dims = {str(k): int(v) for k, v in (bench.get("shape") or {}).items()}
        model = Path(bundle_dir) / manifest["model"]["path"]
        return estimate(model, target, dims=dims, batch=bench.get("batch")), None
    except EdgekitError as exc:
        logger.info("no estimate for %s: %s", bundle_dir, exc.message)
        return None, exc.message
    except Exception as exc:  # an estimate beside a build must never fail the build; the log keeps the trace
        logger.warning("no estimate for %s: %s: %s", bundle_dir, type(exc).__name__, exc, exc_info=True)
        return None, f"{type(exc).__name__}: {exc}"


def estimate_summary_line(manifest: Mapping[str, Any], bundle_dir: Path) -> str | None:
    """``  estimate   p50 3.2 ms on jetson-orin-nano-8gb at 15W (...)`` for the build summary, or None."""
    result, _ = estimate_for_bundle(manifest, bundle_dir)
    if result is None:
        return None
    mode = f" at {result.power_mode}" if result.power_mode else ""
    calibrated = "calibrated factors" if result.calibration.get("calibrated") else "default factors"
    return (f"  estimate   p50 {result.p50_ms:.2f} ms, {result.throughput_text(0)} on {result.target}{mode}: ESTIMATE "
            f"(roofline, {calibrated}; `edgekit estimate` lists the factors)")
