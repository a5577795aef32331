"""Factors fitted on published figures, scored only on figures they were not fitted to (leave one source out).

Each published row is reduced to its TensorRT layers' work at efficiency 1 (compute seconds at the peak the
layer uses, memory seconds at the full bandwidth: :func:`edgekit.estimate.tensorrt_layers.layer_work`). A
parameter set predicts a row's call time as

    sum over layers of max(compute / (prior_efficiency[class] x (int8_scale if INT8 else compute_scale)),
                           memory / memory_share) + layers x launch_us + call_us

with the efficiencies capped at 1. :func:`fit` picks the set on a grid that minimises the absolute log error over
the rows it is given, each SOURCE weighing the same (the mean over a source's rows, then over sources: a source
with 30 rows does not outvote one with 3); where several sets score the same (a parameter the rows do not
constrain, e.g. the FP16 / FP32 scale when every row given is INT8) the one nearest the priors is kept. The
objective may add a pull toward the priors (``weight x`` :func:`prior_distance`), whose weight a nested validation
chooses: :func:`leave_one_source_out` fits on every source but one and predicts the one left out, so no row is scored
by parameters fitted to it, and picks each fold's weight by a leave-one-source-out over that fold's training sources
alone (:func:`choose_prior_weight`). With the defaults (both scales 1, memory_share and launch_us the priors, call_us 0) the
prediction equals `edgekit estimate`'s. ``call_us`` is a fixed cost per call (enqueue, synchronisation, the
harness's own work), which sources time differently.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: the grid searched: wide enough that no fit sits on an edge without the report saying so
COMPUTE_SCALES = tuple(float(x) for x in np.geomspace(0.25, 4.0, 13))  # holds 1 (the prior)
INT8_SCALES = COMPUTE_SCALES
MEMORY_SHARES = (0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0)
LAUNCH_US = (0.0, 2.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 25.0)
CALL_US = (0.0, 100.0, 200.0, 400.0, 800.0, 1500.0)


@dataclass(frozen=True)
class RowWork:
    """One published row as layer work: what the fit needs, nothing else."""

    id: str
    group: str  # the source it came from (left out together)
    metric: str  # latency_ms or throughput_per_s
    value: float  # the published figure
    batch: int
    compute_s: np.ndarray  # per layer, at the peak its precision uses
    memory_s: np.ndarray  # per layer, at the full bandwidth
    efficiency: np.ndarray  # per layer, the prior efficiency of its class
    int8: np.ndarray  # per layer, 1.0 where its GEMM runs INT8


@dataclass(frozen=True)
class Params:
    compute_scale: float  # on the efficiency of FP16 / FP32 (TF32) layers
    int8_scale: float  # on the efficiency of INT8 layers (not multiplied by compute_scale)
    memory_share: float
    launch_us: float
    call_us: float = 0.0

    def describe(self) -> str:
        return (f"FP16/FP32 efficiency x{self.compute_scale:.2f}, INT8 x{self.int8_scale:.2f}, memory at {self.memory_share:g} of "
                f"the bandwidth, {self.launch_us:g} us a layer, {self.call_us:g} us a call")  # fmt: skip


def call_ms(row: RowWork, p: Params) -> float:
    """The predicted time of one call (one batch) of ``row`` in ms."""
    eff = np.minimum(row.efficiency * np.where(row.int8 > 0, p.int8_scale, p.compute_scale), 1.0)
    seconds = np.maximum(row.compute_s / eff, row.memory_s / p.memory_share).sum()
    return float(seconds * 1e3 + len(row.compute_s) * p.launch_us / 1e3 + p.call_us / 1e3)


def predicted(row: RowWork, p: Params) -> float:
    """The prediction in the row's own metric."""
    ms = call_ms(row, p)
    return ms if row.metric == "latency_ms" else row.batch * 1000.0 / ms


def log_error(row: RowWork, p: Params) -> float:
    return abs(math.log(predicted(row, p) / row.value))


def grid() -> list[Params]:
    return [Params(cs, i8, share, launch, call) for share, launch, call, cs, i8 in
            itertools.product(MEMORY_SHARES, LAUNCH_US, CALL_US, COMPUTE_SCALES, INT8_SCALES)]  # fmt: skip


def error_matrix(rows: Sequence[RowWork], params: Sequence[Params]) -> np.ndarray:
    """[parameter set, row] -> absolute log error, every row at every grid point (the layers of all rows stacked)."""
    owner = np.concatenate([np.full(len(r.compute_s), i) for i, r in enumerate(rows)])
    compute = np.concatenate([r.compute_s for r in rows])
    memory = np.concatenate([r.memory_s for r in rows])
    prior = np.concatenate([r.efficiency for r in rows])
    int8 = np.concatenate([r.int8 for r in rows]) > 0
    layers = np.array([len(r.compute_s) for r in rows], dtype=float)
    value = np.array([r.value for r in rows])
    batch = np.array([r.batch for r in rows], dtype=float)
    latency = np.array([r.metric == "latency_ms" for r in rows])
    out = np.empty((len(params), len(rows)))
    for i, p in enumerate(params):
        eff = np.minimum(prior * np.where(int8, p.int8_scale, p.compute_scale), 1.0)
        seconds = np.bincount(owner, np.maximum(compute / eff, memory / p.memory_share), minlength=len(rows))
        ms = seconds * 1e3 + layers * p.launch_us / 1e3 + p.call_us / 1e3
        out[i] = np.abs(np.log(np.where(latency, ms, batch * 1000.0 / ms) / value))
    return out


def prior_distance(p: Params) -> float:
    """How far ``p`` is from the priors (the defaults `edgekit estimate` uses): the tie-break of :func:`fit`."""
    from edgekit.estimate.roofline import TENSORRT_LAYER_LAUNCH_US, TENSORRT_MEMORY_SHARE

    return (abs(math.log(p.compute_scale)) + abs(math.log(p.int8_scale)) + abs(math.log(p.memory_share / TENSORRT_MEMORY_SHARE))
            + abs(p.launch_us - TENSORRT_LAYER_LAUNCH_US) / TENSORRT_LAYER_LAUNCH_US + p.call_us / 100.0)  # fmt: skip


def source_weights(rows: Sequence[RowWork]) -> np.ndarray:
    """Each row's weight in the fit: 1 / (its source's row count) / (sources), so every source weighs the same."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.group] = counts.get(r.group, 0) + 1
    return np.array([1.0 / counts[r.group] / len(counts) for r in rows])


#: strengths of the pull toward the priors (a penalty of ``weight x prior_distance`` on the fit's objective) that the
#: nested validation chooses from, on the training sources only (:func:`choose_prior_weight`)
PRIOR_WEIGHTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def fit(rows: Sequence[RowWork], errors: np.ndarray | None = None, params: Sequence[Params] | None = None,
        columns: Sequence[int] | None = None, prior_weight: float = 0.0,
        distances: np.ndarray | None = None) -> tuple[Params, list[str]]:  # fmt: skip
    """The grid point with the least source-weighted mean absolute log error over ``rows`` (or the ``columns`` of a
    precomputed :func:`error_matrix`) plus ``prior_weight`` x its :func:`prior_distance`, the one nearest the priors
    among equals, and a note for each parameter that landed on an edge of its grid."""
    params = list(params) if params is not None else grid()
    errors = errors if errors is not None else error_matrix(rows, params)
    distances = distances if distances is not None else np.array([prior_distance(q) for q in params])
    columns = list(columns) if columns is not None else list(range(len(rows)))
    score = errors[:, columns] @ source_weights([rows[i] for i in columns]) + prior_weight * distances
    tied = np.flatnonzero(score <= score.min() * (1 + 1e-9) + 1e-12)
    best = params[int(min(tied, key=lambda i: distances[i]))]
    edges = []
    for name, value, values in (("compute_scale", best.compute_scale, COMPUTE_SCALES), ("int8_scale", best.int8_scale, INT8_SCALES),
                                ("memory_share", best.memory_share, MEMORY_SHARES), ("launch_us", best.launch_us, LAUNCH_US),
                                ("call_us", best.call_us, CALL_US)):  # fmt: skip
        if value in (values[0], values[-1]):
            edges.append(f"{name} at the edge of its grid ({value:g})")
    return best, edges


def choose_prior_weight(rows: Sequence[RowWork], errors: np.ndarray, params: Sequence[Params], distances: np.ndarray,
                        columns: Sequence[int]) -> float:  # fmt: skip
    """The :data:`PRIOR_WEIGHTS` entry whose leave-one-source-out error over the ``columns``' sources alone is least
    (each of them predicted by a fit on the others): the inner loop of a nested validation, so the source being scored
    never takes part in choosing it. 0 when fewer than three sources are given."""
    groups = sorted({rows[i].group for i in columns})
    if len(groups) < 3:
        return 0.0
    best, best_error = 0.0, math.inf
    for weight in PRIOR_WEIGHTS:
        held_out = []
        for group in groups:
            train = [i for i in columns if rows[i].group != group]
            p = fit(rows, errors, params, train, weight, distances)[0]
            held_out.append(float(np.mean([log_error(rows[i], p) for i in columns if rows[i].group == group])))
        error = float(np.mean(held_out))
        if error < best_error - 1e-12:
            best, best_error = weight, error
    return best


def leave_one_source_out(rows: Sequence[RowWork]) -> tuple[dict[str, tuple[Params, list[str]]], tuple[Params, list[str]]]:
    """(source -> the parameters fitted on every OTHER source's rows, with notes; the fit on all rows, in-sample). Each
    fold's pull toward the priors is chosen by an inner leave-one-source-out on that fold's training sources."""
    params = grid()
    errors = error_matrix(rows, params)
    distances = np.array([prior_distance(q) for q in params])
    folds = {}
    for group in sorted({r.group for r in rows}):
        columns = [i for i, r in enumerate(rows) if r.group != group]
        weight = choose_prior_weight(rows, errors, params, distances, columns)
        best, notes = fit(rows, errors, params, columns, weight, distances)
        folds[group] = (best, [f"pull toward the priors {weight:g}, chosen on the other sources", *notes])
    everything = list(range(len(rows)))
    weight = choose_prior_weight(rows, errors, params, distances, everything)
    best, notes = fit(rows, errors, params, everything, weight, distances)
    return folds, (best, [f"pull toward the priors {weight:g}", *notes])
