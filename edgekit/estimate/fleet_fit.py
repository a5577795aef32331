"""Fit the estimate's efficiency factors from a fleet's telemetry: ``edgekit fleet calibrate``.

The store holds per-bundle latency windows; the bundles' graphs come from directories you point at
(each a bundle, or a folder of bundles), matched to the store's ``bundle_id`` by manifest name or folder
name. For every (bundle, target, power mode) with enough inferences, the graph's per-class roofline at
the bundle's benchmark shape and the fleet's p50 make one observation; the factors of each target and
mode are fitted (:func:`edgekit.estimate.calibration.fit_factors`) and the error is reported before (the
prior factors) and after (in-sample, and leave-one-out where there are at least three bundles).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.estimate.calibration import CalibrationEntry, Observation, calibrate_entry, fit_factors, median_error_pct
from edgekit.estimate.estimate import EstimateInput, bundle_input, resolve_factors
from edgekit.estimate.graph_cost import EstimateError, GraphCost, graph_costs
from edgekit.estimate.hardware import Hardware, hardware_for
from edgekit.estimate.inputs import needs_measured_peak
from edgekit.estimate.roofline import roofline
from edgekit.target import TargetProfile, get_target

#: A (bundle, target, mode) needs at least this many inferences in the store to count as an observation.
MIN_INFERENCES = 20


@dataclass(frozen=True)
class KnownBundle:
    """A bundle whose graph is known: its ids (manifest name, folder name) and its work at the benchmark shape."""

    ids: tuple[str, ...]
    source: EstimateInput
    cost: GraphCost


@dataclass(frozen=True)
class TargetCalibration:
    entry: CalibrationEntry
    loo_error_pct: float | None  # leave-one-out median error of the fitted factors (None under 3 observations)


def find_bundles(paths: Iterable[Path]) -> list[KnownBundle]:
    """Every bundle under ``paths`` (each a bundle directory or a folder of them), with its graph's work."""
    found: list[KnownBundle] = []
    for root in paths:
        root = Path(root)
        if not root.is_dir():
            raise EstimateError(f"--bundles {root}: not a directory", hint="pass a bundle directory or a folder of bundle directories")
        candidates = [root] if (root / "manifest.json").is_file() else sorted(p.parent for p in root.glob("*/manifest.json"))
        for directory in candidates:
            source = bundle_input(directory)
            found.append(KnownBundle(tuple(dict.fromkeys((source.name, directory.name))), source, graph_costs(source.model_path, source.dims)))
    if not found:
        raise EstimateError(f"no bundles (folders with manifest.json) under {', '.join(str(p) for p in paths)}",
                            hint="point --bundles at the folders `edgekit build` wrote")  # fmt: skip
    return found


def _hardware(target: TargetProfile, power_mode: str | None, cache: dict[Any, Hardware]) -> Hardware:
    key = (target.name, power_mode)
    if key not in cache:
        measured = None
        if needs_measured_peak(target):
            from edgekit.estimate.host_peak import host_threads, measure_host_peak

            measured = measure_host_peak(host_threads(target.cpu.cores))
        mode = power_mode if power_mode in target.power_modes else None
        cache[key] = hardware_for(target, mode, measured=measured)
    return cache[key]


def observation(bundle: KnownBundle, hardware: Hardware, measured_ms: float, label: str, *,
                power_mean_w: float | None = None) -> Observation:  # fmt: skip
    line = roofline(bundle.cost, hardware)
    return Observation(label, line.class_roofline_ms(), line.counted_nodes, measured_ms, power_mean_w, hardware.watts,
                       fixed_ms=line.fixed_ms)  # the measured control-flow and split costs the estimate adds unscaled


def cost_on(bundle: KnownBundle, target: TargetProfile, cache: dict[Any, GraphCost]) -> KnownBundle:
    """``bundle`` with the graph the estimate costs on ``target``: on a host whose peak is measured, the graph ONNX
    Runtime optimises at the host's threads (as :func:`~edgekit.estimate.estimate.estimate` with a measured peak),
    else the exported graph (:func:`find_bundles`'s)."""
    if not needs_measured_peak(target):
        return bundle
    from edgekit.estimate.host_peak import host_threads
    from edgekit.estimate.runtime_graph import runtime_graph_costs

    threads = host_threads(target.cpu.cores)
    key = (str(bundle.source.model_path), threads)
    if key not in cache:
        cache[key] = runtime_graph_costs(bundle.source.model_path, threads, dims=bundle.source.dims)
    return replace(bundle, cost=cache[key])


def observations_from_store(store: Any, bundles: Sequence[KnownBundle], *, fleet: str | None = None,
                            since: dt.datetime | None = None) -> dict[tuple[str, str | None], list[Observation]]:  # fmt: skip
    """(target, power mode) -> observations, from the store's aggregates of the known bundles."""
    by_id = {i: b for b in bundles for i in b.ids}
    hardware_cache: dict[Any, Hardware] = {}
    runtime_costs: dict[Any, GraphCost] = {}
    out: dict[tuple[str, str | None], list[Observation]] = defaultdict(list)
    for row in store.aggregate(("bundle_id", "target", "power_mode"), fleet=fleet, since=since):
        bundle = by_id.get(row.bundle_id or "")
        if bundle is None or row.target is None or row.p50_ms is None or row.inferences < MIN_INFERENCES:
            continue
        target = get_target(row.target)
        hardware = _hardware(target, row.power_mode, hardware_cache)
        out[(target.name, row.power_mode)].append(observation(cost_on(bundle, target, runtime_costs), hardware, row.p50_ms, f"{row.bundle_id}@{target.name}",
                                                              power_mean_w=row.power_mean_mw / 1000.0 if row.power_mean_mw else None))  # fmt: skip
    return dict(out)


def leave_one_out_error_pct(observations: Sequence[Observation], prior: Any) -> float | None:
    if len(observations) < 3:
        return None
    errors = []
    for index, held in enumerate(observations):
        rest = [o for i, o in enumerate(observations) if i != index]
        fitted = fit_factors(rest, prior, source="leave-one-out")
        errors.append(median_error_pct([held], fitted))
    return float(np.median(errors))


def calibrate(observations: Mapping[tuple[str, str | None], Sequence[Observation]],
              calibration: Path | Mapping[str, Any] | None = None) -> list[TargetCalibration]:  # fmt: skip
    """Fit each (target, mode): the prior is what estimates use today (``calibration`` or the defaults)."""
    results = []
    for (target_name, mode), rows in sorted(observations.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        target = get_target(target_name)
        hardware = _hardware(target, mode, {})
        prior, _ = resolve_factors(replace(hardware, power_mode=mode), calibration)
        entry = calibrate_entry(target_name, mode, rows, prior)
        results.append(TargetCalibration(entry, leave_one_out_error_pct(rows, prior)))
    return results


def report_json(results: Sequence[TargetCalibration], out: Path | None) -> dict[str, Any]:
    return {"kind": "estimate-calibration", "file": str(out) if out else None,
            "targets": [{**r.entry.to_json(), "loo_error_pct": r.loo_error_pct} for r in results]}  # fmt: skip


def dump(results: Sequence[TargetCalibration]) -> str:
    return json.dumps(report_json(results, None), indent=2)
