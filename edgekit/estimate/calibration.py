"""Fitted efficiency factors per target and power mode: the file ``edgekit fleet calibrate`` writes and
estimates read (``--calibration FILE``, else :func:`default_calibration_path` when it exists).

The fit: each observation is a graph's per-class roofline time (efficiency 1) and a measured p50. Latency is
``sum_c roofline_c / e_c + nodes x overhead`` (:mod:`edgekit.estimate.roofline`); the factors minimise the
log error (robust loss), bounded, pulled weakly towards the priors (:data:`PRIOR_WEIGHT`) so a class that
the observed graphs barely use keeps its prior.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.estimate.graph_cost import ALL_CLASSES, EstimateError
from edgekit.estimate.roofline import DEFAULT_POWER_FRACTION, Factors, latency_from_classes

SCHEMA_VERSION = 1
FILE_KIND = "edgekit-estimate-calibration"
#: weight of the pull towards the prior factors, relative to one observation's relative error
PRIOR_WEIGHT = 0.05


def default_calibration_path() -> Path:
    """``$EDGEKIT_CACHE_DIR/estimate-calibration.json`` (default ``~/.cache/edgekit``)."""
    return Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "estimate-calibration.json"


@dataclass(frozen=True)
class Observation:
    """A graph's per-class roofline ms (efficiency 1) and node count, with its measured p50 on the target."""

    label: str
    class_ms: dict[str, float]
    nodes: int
    measured_ms: float
    power_mean_w: float | None = None  # the fleet's mean power draw while running this bundle
    watts: float | None = None  # the power mode's budget
    fixed_ms: float = 0.0  # measured costs no factor scales (If subgraph invocations on a measured host)


@dataclass(frozen=True)
class CalibrationEntry:
    target: str
    power_mode: str | None
    factors: Factors
    observations: int
    error_before_pct: float  # median absolute error of the prior factors on the observations
    error_after_pct: float  # the same with the fitted factors (in-sample)
    labels: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "power_mode": self.power_mode, **self.factors.to_json(),
                "observations": self.observations, "error_before_pct": self.error_before_pct,
                "error_after_pct": self.error_after_pct, "labels": list(self.labels)}  # fmt: skip


def median_error_pct(observations: Sequence[Observation], factors: Factors) -> float:
    errors = [abs(latency_from_classes(o.class_ms, o.nodes, factors, o.fixed_ms) / o.measured_ms - 1.0) * 100.0 for o in observations]
    return float(np.median(errors)) if errors else float("nan")


def fit_factors(observations: Sequence[Observation], prior: Factors, *, source: str, per_class: bool | None = None) -> Factors:
    """Factors that minimise the log latency error over ``observations`` (robust soft-L1 loss, so one odd
    measurement does not drag every class; bounded: efficiency in (0, 1], overhead 0..10 ms a node).

    Two fits: one efficiency per op class (``per_class=True``), or the priors times one common scale
    (``False``: two parameters, for few or noisy observations). ``None`` picks by leave-one-out error
    (from 4 observations; below that, per class only with more observations than parameters)."""
    from scipy.optimize import least_squares

    if not observations:
        raise EstimateError("no observations to calibrate from", hint="the store needs telemetry of bundles whose graphs you pass")
    classes = [c for c in ALL_CLASSES if any(o.class_ms.get(c, 0.0) > 0 for o in observations)]
    k = len(classes)
    if per_class is None:
        if len(observations) < 4:
            per_class = len(observations) > k + 1
        else:
            scores = {}
            for choice in (True, False):
                errors = [median_error_pct([held], fit_factors([o for o in observations if o is not held], prior, source="", per_class=choice))
                          for held in observations]  # fmt: skip
                scores[choice] = float(np.median(errors))
            per_class = scores[True] <= scores[False]
        source += "; one efficiency per op class" if per_class else "; the default factors times one common scale (chosen by leave-one-out error)"
    x = np.array([[o.class_ms.get(c, 0.0) for c in classes] for o in observations])
    nodes = np.array([float(o.nodes) for o in observations])
    fixed = np.array([o.fixed_ms for o in observations])
    measured = np.array([o.measured_ms for o in observations])
    log_prior = np.log([1.0 / prior.efficiency.get(c, 1.0) for c in classes])
    overhead_prior = prior.node_overhead_us / 1e3

    def inverse_efficiency(theta: np.ndarray) -> np.ndarray:
        return np.asarray(np.exp(theta[:k]) if per_class else np.exp(log_prior + theta[0]), dtype=float)

    def residuals(theta: np.ndarray) -> np.ndarray:
        predicted = x @ inverse_efficiency(theta) + nodes * theta[-1] + fixed
        fit = np.log(np.maximum(predicted, 1e-12) / measured)
        log_scale = theta[:k] - log_prior if per_class else theta[:1]
        pull = PRIOR_WEIGHT * np.append(log_scale, (theta[-1] - overhead_prior) / max(overhead_prior, 1e-3))
        return np.concatenate([fit, pull])

    overhead_start = min(max(overhead_prior, 0.0), 10.0)
    if per_class:
        start = np.append(np.clip(log_prior, 0.0, math.log(1e4)), overhead_start)
        bounds = (np.zeros(k + 1), np.append(np.full(k, math.log(1e4)), 10.0))
    else:  # the common scale keeps every efficiency at most 1
        lowest = -float(np.min(log_prior)) if k else 0.0
        start, bounds = np.array([max(0.0, lowest), overhead_start]), (np.array([lowest, 0.0]), np.array([math.log(1e4), 10.0]))
    solution = least_squares(residuals, start, bounds=bounds, loss="soft_l1", f_scale=0.1).x
    inverse = inverse_efficiency(solution)
    efficiency = dict(prior.efficiency)
    for cls, value in zip(classes, inverse):
        efficiency[cls] = round(min(1.0, 1.0 / float(value)), 5)
    power_fraction = prior.power_fraction
    # the fleet's mean power over the mode's watts: it includes idle time between inferences, so it is a lower
    # bound of the draw while inferring (telemetry has no busy-only power); capped at the whole budget
    shares = [min(1.0, o.power_mean_w / o.watts) for o in observations if o.power_mean_w and o.watts]
    if shares:
        power_fraction = round(float(np.median(shares)), 4)
    return Factors(efficiency, round(float(solution[-1]) * 1e3, 4), power_fraction, source)


def calibrate_entry(target: str, power_mode: str | None, observations: Sequence[Observation], prior: Factors) -> CalibrationEntry:
    source = f"fitted to {len(observations)} fleet observation(s) of {target}" + (f" at {power_mode}" if power_mode else "")
    fitted = fit_factors(observations, prior, source=source)
    return CalibrationEntry(target, power_mode, fitted, len(observations), median_error_pct(observations, prior),
                            median_error_pct(observations, fitted), tuple(o.label for o in observations))  # fmt: skip


def write_calibration(path: Path, entries: Sequence[CalibrationEntry], *, merge: bool = True) -> Path:
    """Write (or update: entries of other targets/modes are kept) the calibration file at ``path``."""
    path = Path(path)
    existing: list[dict[str, Any]] = []
    if merge and path.is_file():
        existing = load_calibration(path)["entries"]
    replaced = {(e.target, e.power_mode) for e in entries}
    kept = [e for e in existing if (e["target"], e.get("power_mode")) not in replaced]
    document = {"schema_version": SCHEMA_VERSION, "kind": FILE_KIND,
                "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "entries": kept + [e.to_json() for e in entries]}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)
    return path


def load_calibration(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise EstimateError(f"calibration file {path} does not exist", hint="write one with `edgekit fleet calibrate --out FILE`") from None
    except (OSError, ValueError) as exc:
        raise EstimateError(f"calibration file {path} is not readable JSON: {exc}", hint="write it again with `edgekit fleet calibrate`") from exc
    if not isinstance(document, dict) or document.get("kind") != FILE_KIND or document.get("schema_version") != SCHEMA_VERSION:
        raise EstimateError(f"{path} is not an edgekit calibration file (kind '{FILE_KIND}', schema_version {SCHEMA_VERSION})",
                            hint="pass the file `edgekit fleet calibrate --out` wrote")  # fmt: skip
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise EstimateError(f"{path}: entries must be a list of calibration entries, not {type(entries).__name__}", hint=_rewrite_hint(path))
    for index, entry in enumerate(entries):
        problem = _entry_problem(entry)
        if problem is not None:
            raise EstimateError(f"{path}: entries[{index}].{problem}", hint=_rewrite_hint(path))
    return document


def _rewrite_hint(path: Path) -> str:
    return f"write it again with `edgekit fleet calibrate --out {path}`, or delete it to estimate with the default factors"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one calibration entry ("field must ..."), or None: every field an estimate reads is checked."""
    if not isinstance(entry, dict):
        return f"(the entry itself) must be an object, not {type(entry).__name__}"
    if not isinstance(entry.get("target"), str):
        return "target must be a target name"
    if entry.get("power_mode") is not None and not isinstance(entry.get("power_mode"), str):
        return "power_mode must be a power mode name or null"
    efficiency = entry.get("efficiency")
    if not isinstance(efficiency, dict) or not all(_number(v) and 0 < v <= 1 for v in efficiency.values()):
        return "efficiency must map op classes to numbers in (0, 1]"
    overhead = entry.get("node_overhead_us")
    if not _number(overhead) or overhead < 0:
        return f"node_overhead_us must be a finite number of microseconds >= 0, not {overhead!r}"
    fraction = entry.get("power_fraction", DEFAULT_POWER_FRACTION)
    if not _number(fraction) or not 0 < fraction <= 1:
        return f"power_fraction must be a share in (0, 1], not {fraction!r}"
    return None


def factors_for(document: Mapping[str, Any], target: str, power_mode: str | None) -> Factors | None:
    """The fitted factors of ``target`` at ``power_mode`` (an entry without a mode serves every mode), or None."""
    entries = [e for e in document.get("entries", []) if e.get("target") == target]
    for wanted in (power_mode, None):
        for entry in entries:
            if entry.get("power_mode") == wanted:
                return Factors(dict(entry["efficiency"]), float(entry["node_overhead_us"]),
                               float(entry.get("power_fraction", DEFAULT_POWER_FRACTION)), str(entry.get("source", "calibration")))  # fmt: skip
    return None
