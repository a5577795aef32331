"""Evaluate the recipe metric for a built model against the FP32 reference, and check the budget."""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from edgekit.data import Batch, run_batches
from edgekit.errors import AccuracyBudgetError, EvaluationError
from edgekit.evaluate.metrics import METRICS, Metric, cosine_min
from edgekit.evaluate.task_metrics import TASK_METRICS
from edgekit.recipe import Recipe
from edgekit.sources._util import import_callable

RunFn = Callable[[Batch], dict[str, np.ndarray]]


@dataclass(frozen=True)
class AccuracyResult:
    metric: str
    output: str
    reference: float
    value: float
    drop: float
    budget: dict[str, float | None]
    passed: bool
    samples: int
    cosine_min: float | None = None
    reference_source: str = "pytorch-fp32"
    note: str | None = None
    details: dict[str, Any] | None = None  # a task metric's other numbers (detections, per-class IoU, CER and line agreement)

    def to_manifest(self) -> dict[str, Any]:
        return asdict(self)


def _metric(recipe: Recipe) -> Metric:
    spec = recipe.evaluation
    assert spec is not None
    if spec.metric == "callable":
        assert spec.callable is not None
        return import_callable(spec.callable, EvaluationError, f"{recipe.path}: evaluation.callable", recipe.base_dir)
    return METRICS[spec.metric]


def run_reference(recipe: Recipe, reference: RunFn, batches: list[Batch]) -> list[dict[str, np.ndarray]]:
    """The FP32 reference's outputs over the evaluation batches (sequences call by call, with state, for a stateful recipe)."""
    return run_batches(recipe, reference, batches)[1]


def evaluate_accuracy(recipe: Recipe, candidate: RunFn, reference_outputs: list[dict[str, np.ndarray]], batches: list[Batch], reference_source: str) -> AccuracyResult:
    """Run ``candidate`` over the evaluation batches and score it; ``reference_outputs`` are FP32's.

    A stateful recipe's sequences run call by call, the candidate carrying its own state (as on the device)."""
    spec = recipe.evaluation
    assert spec is not None, "evaluate_accuracy needs a recipe with an evaluation section"
    output = spec.output or recipe.outputs[0]
    labels = [batch.get(spec.labels) for batch in batches]
    feeds, got_all = run_batches(recipe, candidate, batches)
    non_finite = non_finite_counts(got_all, reference_outputs)
    got = [g[output] for g in got_all]
    ref = [r[output] for r in reference_outputs]
    details = None
    try:
        if spec.metric in TASK_METRICS:
            task = TASK_METRICS[spec.metric](spec, output)
            value, details = task(got_all, reference_outputs)
            reference = task(reference_outputs, reference_outputs)[0]
        else:
            metric = _metric(recipe)
            value = float(metric(got, ref, labels))
            reference = float(metric(ref, ref, labels))
    except EvaluationError as exc:
        if recipe.path is None or str(recipe.path) in exc.message:
            raise
        raise EvaluationError(f"{recipe.path}: {exc.message}", hint=exc.hint) from None
    except Exception as exc:
        bad = f" (the candidate's outputs hold {_non_finite_text(non_finite)})" if non_finite else ""
        raise EvaluationError(f"{recipe.path}: evaluation metric '{spec.metric}' failed: {type(exc).__name__}: {exc}{bad}") from exc
    drop = (reference - value) if spec.better_is_higher else (value - reference)
    budget = spec.budget
    passed = True
    if budget.max_drop is not None and drop > budget.max_drop + 1e-12:
        passed = False
    if budget.min_value is not None and value < budget.min_value:
        passed = False
    if budget.max_value is not None and value > budget.max_value:
        passed = False
    if not (math.isfinite(value) and math.isfinite(reference)):
        passed = False  # every comparison with NaN is false: without this a NaN metric met any budget
    note = None
    if non_finite:  # NaN rows score as cosine 0, argmax 0, "no detection": a metric over them can still meet the budget
        passed = False
        details = {**(details or {}), "non_finite_outputs": non_finite}
        note = f"the candidate's outputs hold {_non_finite_text(non_finite)} where the FP32 reference's are finite"
    return AccuracyResult(
        metric=spec.metric,
        output=output,
        reference=reference,
        value=value,
        drop=drop,
        budget=budget.model_dump(),
        passed=passed,
        samples=sample_count(recipe, feeds, got, details),
        cosine_min=cosine_min(got, ref) if got and got[0].dtype.kind == "f" else None,
        reference_source=reference_source,
        note=note,
        details=details,
    )


def non_finite_counts(outputs: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]) -> dict[str, int]:
    """NaN and infinite values in each floating-point output of the candidate, over all batches, leaving out the places
    where the reference's own value is not finite either (a masked ``-inf`` logit); only outputs that have any."""
    counts: dict[str, int] = {}
    for index, batch in enumerate(outputs):
        expected = reference[index] if index < len(reference) else {}
        for name, value in batch.items():
            array = np.asarray(value)
            if array.dtype.kind not in "fc":
                continue
            bad = ~np.isfinite(array)
            other = np.asarray(expected[name]) if name in expected else None
            if other is not None and other.shape == array.shape and other.dtype.kind in "fc":
                bad &= np.isfinite(other)
            if bad.any():
                counts[name] = counts.get(name, 0) + int(bad.sum())
    return counts


def _non_finite_text(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    per_output = ", ".join(f"'{name}': {count}" for name, count in sorted(counts.items()))
    return f"{total} non-finite value{'s' if total != 1 else ''} (NaN or infinity; {per_output})"


def sample_count(recipe: Recipe, feeds: list[Batch], outputs: list[np.ndarray], details: dict[str, Any] | None) -> int:
    """How many samples the evaluation scored: the task metric's own count (CTC lines, detection images) where it has one,
    else the items along the inputs' batch dim (a time-major ``[T, batch, C]`` output's axis 0 is time, not samples), else
    the outputs' leading axis."""
    for key in ("lines", "images"):
        count = (details or {}).get(key)
        if isinstance(count, int) and not isinstance(count, bool):
            return count
    # a dim named batch wherever it sits (a time-major [time, batch, C] input names time at axis 0), else axis 0's
    batch_dim = "batch" if any("batch" in spec.shape for spec in recipe.inputs) else recipe.batch_dim
    if batch_dim is not None:
        for spec in recipe.inputs:
            if batch_dim in spec.shape and all(spec.name in batch for batch in feeds):
                axis = list(spec.shape).index(batch_dim)
                return int(sum(np.asarray(batch[spec.name]).shape[axis] for batch in feeds))
    return int(sum(g.shape[0] if g.ndim else 1 for g in outputs))


def check_budget(recipe: Recipe, result: AccuracyResult, precision: str) -> None:
    """Raise AccuracyBudgetError with the numbers when the result is outside the recipe's budget."""
    if result.passed:
        return
    parts = [f"{k} {v}" for k, v in result.budget.items() if v is not None]
    non_finite = (result.details or {}).get("non_finite_outputs")
    if not (math.isfinite(result.value) and math.isfinite(result.reference)):
        raise AccuracyBudgetError(
            f"{recipe.path}: {precision} model's accuracy cannot be judged: {result.metric} is {result.value:.6g} (reference "
            f"{result.reference:.6g}) over {result.samples} samples, not a finite number"
            + (f" (its outputs hold {_non_finite_text(non_finite)})" if isinstance(non_finite, dict) and non_finite else "")
            + f"; budget: {', '.join(parts)}",
            hint="the model's outputs (or the metric itself) give NaN or infinity on the evaluation data: check the model at "
                 "fp32, the evaluation data, and a custom metric's arithmetic",
        )  # fmt: skip
    if isinstance(non_finite, dict) and non_finite:
        raise AccuracyBudgetError(
            f"{recipe.path}: {precision} model fails the accuracy budget: its outputs hold {_non_finite_text(non_finite)} over "
            f"{result.samples} samples where the FP32 reference's are finite ({result.metric} = {result.value:.6g}, reference "
            f"{result.reference:.6g}); budget: {', '.join(parts) or 'none'}",
            hint="the model overflows or divides by zero at this precision on the evaluation data: use a higher precision (fp16 "
                 "overflows past 65504), or keep the layers that overflow in FP32",
        )  # fmt: skip
    raise AccuracyBudgetError(
        f"{recipe.path}: {precision} model is outside the accuracy budget: {result.metric} = {result.value:.6g} "
        f"(reference {result.reference:.6g}, drop {result.drop:.6g}) over {result.samples} samples; budget: {', '.join(parts)}",
        hint="use a higher precision, or loosen evaluation.budget in the recipe if this accuracy is acceptable",
    )
