"""How ``auto`` judges candidates on ONNX Runtime (host CPU): :class:`OrtInterleavedTimer` times them interleaved
with the FP32 reference; :class:`RecipeEvaluator` scores them with the recipe's own metric (the function the build's
evaluation stage uses), :class:`OrtMetricEvaluator` with one array metric against an :class:`AccuracyBudget`. The
search's side of judging (ratios to FP32, the bar, the floor) is :mod:`edgekit.quantize.judging`."""

from __future__ import annotations

import math

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.quantize.ort.sessions import shared_session
from edgekit.quantize.sensitivity import Metric
from edgekit.recipe import AccuracyBudget


class OrtInterleavedTimer:
    """``time_models`` for the search: each round runs every model once on ``feeds``; returns the median
    wall-clock latency in ms per model. Sessions of ``keep_loaded`` paths (the references) are reused.

    With ``bar`` (a latency ratio of the last model to the first), timing stops after ``min_rounds`` once
    the candidate is decisively over it (:meth:`_decisively_over`): it is rejected anyway."""

    def __init__(self, feeds: Mapping[str, np.ndarray], *, threads: int | None = None, rounds: int = 11, warmup: int = 2,
                 min_seconds: float = 0.1, max_rounds: int = 200, graph_optimization: str = "all", keep_loaded: Sequence[Path] = (),
                 min_rounds: int = 5, stop_margin: float = 0.15) -> None:
        if rounds < 1 or max_rounds < rounds:
            raise QuantizationError(f"the timer needs 1 <= rounds <= max_rounds, got rounds={rounds}, max_rounds={max_rounds}")
        self.feeds = dict(feeds)
        self.threads, self.rounds, self.warmup, self.graph_optimization = threads, rounds, warmup, graph_optimization
        self.min_seconds, self.max_rounds = min_seconds, max_rounds
        self.keep_loaded = {Path(p).resolve() for p in keep_loaded}
        self.min_rounds, self.stop_margin = min_rounds, stop_margin
        self._sessions: dict[Path, Any] = {}
        self.stopped_early = 0

    def __call__(self, paths: Sequence[Path], bar: float | None = None) -> list[float]:
        sessions = [self._session(Path(path)) for path in paths]
        runs = [(session, {i.name: self.feeds[i.name] for i in session.get_inputs()}) for session in sessions]
        start = time.perf_counter()
        for _ in range(max(self.warmup, 1)):
            for session, feed in runs:
                session.run(None, feed)
        # Fast models get more rounds (at least ``min_seconds`` of timing per model), so that a few
        # scheduler hiccups on a shared machine do not move the median.
        per_round_s = (time.perf_counter() - start) / max(self.warmup, 1) / max(len(runs), 1)
        rounds = min(self.max_rounds, max(self.rounds, int(self.min_seconds / max(per_round_s, 1e-6))))
        samples: list[list[float]] = [[] for _ in runs]
        for done in range(1, rounds + 1):
            for index, (session, feed) in enumerate(runs):
                start = time.perf_counter()
                session.run(None, feed)
                samples[index].append((time.perf_counter() - start) * 1000.0)
            if bar is not None and len(runs) > 1 and done >= self.min_rounds and done < rounds and self._decisively_over(samples, bar):
                self.stopped_early += 1
                break
        return [statistics.median(values) for values in samples]

    def _decisively_over(self, samples: Sequence[Sequence[float]], bar: float) -> bool:
        """The last model is rejected whatever more rounds would say: its median per-round ratio to the first is
        over ``bar * (1 + stop_margin)``, or, after twice ``min_rounds``, three rounds in four are over ``bar``
        (SegFormer's fused int8 at 1.09x FP32 against the FP32 bar ran 66 rounds of 3 models before)."""
        ratios = sorted(last / first for first, last in zip(samples[0], samples[-1]))
        if statistics.median(ratios) > bar * (1 + self.stop_margin):
            return True
        return len(ratios) >= 2 * self.min_rounds and ratios[len(ratios) // 4] > bar

    def _session(self, path: Path) -> Any:
        resolved = path.resolve()
        if resolved in self._sessions:
            return self._sessions[resolved]
        session = shared_session(path, self.threads, self.graph_optimization)
        if resolved in self.keep_loaded:
            self._sessions[resolved] = session
        return session


@dataclass(frozen=True)
class MetricResult:
    value: float
    passed: bool
    reference: float
    cosine_min: float | None
    reasons: tuple[str, ...] = ()


class OrtMetricEvaluator:
    """``evaluate`` for the search: the metric over ``batches`` against FP32 reference outputs, checked
    against an :class:`AccuracyBudget` (and, optionally, a floor on the per-row cosine minimum)."""

    def __init__(self, batches: Sequence[Mapping[str, np.ndarray]], metric: Metric, budget: AccuracyBudget, reference_path: Path, *,
                 output: str | None = None, label_key: str | None = "labels", higher_is_better: bool = True, min_cosine: float | None = None,
                 threads: int | None = None) -> None:
        self.batches = [dict(batch) for batch in batches]
        self.metric, self.budget, self.output = metric, budget, output
        self.labels = [np.asarray(b[label_key]) if label_key and label_key in b else None for b in self.batches]
        self.higher_is_better, self.min_cosine, self.threads = higher_is_better, min_cosine, threads
        self.reference_outputs = self.outputs(Path(reference_path))
        self.reference_value = float(metric(self.reference_outputs, self.reference_outputs, self.labels))

    def outputs(self, path: Path) -> list[np.ndarray]:
        session = shared_session(path, self.threads)
        names = [o.name for o in session.get_outputs()]
        if self.output is not None and self.output not in names:
            raise QuantizationError(f"{path}: no output '{self.output}'", hint=f"its outputs: {', '.join(names)}")
        index = names.index(self.output) if self.output else 0
        inputs = [i.name for i in session.get_inputs()]
        return [session.run(None, {name: batch[name] for name in inputs})[index] for batch in self.batches]

    def __call__(self, path: Path) -> MetricResult:
        from edgekit.evaluate.metrics import cosine_min

        got = self.outputs(path)
        value = float(self.metric(got, self.reference_outputs, self.labels))
        cos_min = cosine_min(got, self.reference_outputs) if got and got[0].dtype.kind == "f" else None
        drop = (self.reference_value - value) if self.higher_is_better else (value - self.reference_value)
        reasons = [] if math.isfinite(value) else [f"the metric is {value}, not a finite number"]
        if self.budget.max_drop is not None and drop > self.budget.max_drop + 1e-12:
            reasons.append(f"drop {drop:.6g} > max_drop {self.budget.max_drop}")
        if self.budget.min_value is not None and value < self.budget.min_value:
            reasons.append(f"{value:.6g} < min_value {self.budget.min_value}")
        if self.budget.max_value is not None and value > self.budget.max_value:
            reasons.append(f"{value:.6g} > max_value {self.budget.max_value}")
        if self.min_cosine is not None and cos_min is not None and cos_min < self.min_cosine:
            reasons.append(f"cosine min {cos_min:.6g} < {self.min_cosine}")
        return MetricResult(value, not reasons, self.reference_value, cos_min, tuple(reasons))


class RecipeEvaluator:
    """``evaluate`` for the search with whatever metric the recipe names (top1, cosine, mse, a task metric
    such as detection or ctc_text, or a callable): :func:`edgekit.evaluate.accuracy.evaluate_accuracy`,
    the function the build's own evaluation stage uses, against the FP32 model's outputs (run once)."""

    def __init__(self, recipe: Any, batches: Sequence[Mapping[str, np.ndarray]], reference_path: Path, *, threads: int | None = None) -> None:
        from edgekit.evaluate.accuracy import run_reference

        self.recipe, self.threads = recipe, threads
        self.batches = [dict(batch) for batch in batches]
        self.reference_outputs = run_reference(recipe, self._runner(Path(reference_path)), self.batches)
        self.reference_source = "onnxruntime-fp32"  # what reference_outputs came from (a pruned build: the unpruned model)

    def _runner(self, path: Path) -> Any:
        session = shared_session(path, self.threads)
        names = [o.name for o in session.get_outputs()]
        inputs = [i.name for i in session.get_inputs()]
        return lambda feeds: dict(zip(names, session.run(None, {name: feeds[name] for name in inputs})))

    def __call__(self, path: Path) -> Any:
        from edgekit.evaluate.accuracy import evaluate_accuracy

        return evaluate_accuracy(self.recipe, self._runner(Path(path)), self.reference_outputs, self.batches, self.reference_source)


def recipe_metric_spec(recipe: Any) -> MetricSpec:
    """The metric the sensitivity ranking uses: the recipe's own when it reads one output array (top1,
    cosine, mse), otherwise (task and callable metrics, which read every output) cosine to FP32 on the
    evaluated output, as a proxy that only orders node groups; candidates are judged by the recipe's metric."""
    from edgekit.evaluate.metrics import METRICS

    spec = recipe.evaluation
    output = spec.output or recipe.outputs[0]
    if spec.metric in METRICS:
        return MetricSpec(METRICS[spec.metric], spec.metric, spec.better_is_higher, output, spec.labels)
    return MetricSpec(METRICS["cosine"], f"cosine (sensitivity proxy for {spec.metric})", True, output, None)


@dataclass(frozen=True)
class MetricSpec:
    metric: Metric
    name: str
    higher_is_better: bool = True
    output: str | None = None
    label_key: str | None = "labels"
