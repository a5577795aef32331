"""evaluate_accuracy checks what it scores: NaN or infinite candidate outputs fail the budget with their count (review:
one NaN row of 500 passed cosine 0.998 / top1 / binary_decision / segmentation budgets, since NaN rows score as cosine 0,
argmax 0 or "no detection"), a reference with nothing to find is an error, not a perfect 1.0, and ``samples`` counts
samples, not the time axis of a time-major output."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgekit.data import load_batches
from edgekit.errors import AccuracyBudgetError, EvaluationError
from edgekit.evaluate import check_budget, evaluate_accuracy
from edgekit.evaluate.accuracy import non_finite_counts, run_reference
from edgekit.evaluate.task_metrics import positive_set_scores
from edgekit.recipe import load_recipe


def batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((100, 16)).astype(np.float32), "labels": rng.integers(0, 16, 100)} for _ in range(5)]


def time_major() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((50, 4, 6)).astype(np.float32)} for _ in range(2)]  # [T=50, batch=4, classes=6]


RECIPE = """\
name: checked
model: {kind: onnx, path: m.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 16]}
outputs: [y]
dims:
  batch: {min: 1, opt: 4, max: 128}
data:
  samples: {callable: "tests.evaluate.test_candidate_outputs_checked:batches"}
evaluation:
  metric: %s
  budget: %s
"""


def _evaluate(tmp_path: Path, metric: str, budget: str, candidate):  # type: ignore[no-untyped-def]
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(RECIPE % (metric, budget)))
    recipe = load_recipe(path)
    data = load_batches(recipe, recipe.data.samples, "samples")
    reference = run_reference(recipe, lambda b: {"y": b["x"] * 2.0}, data)
    calls = [0]

    def run(b):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return {"y": candidate(b["x"] * 2.0, calls[0])}

    return recipe, evaluate_accuracy(recipe, run, reference, data, "int8")


def one_nan_row(y: np.ndarray, call: int) -> np.ndarray:
    y = y.copy()
    if call == 1:
        y[0, :] = np.nan  # one row of 500 is all NaN
    return y


@pytest.mark.parametrize(("metric", "budget"), [
    ("cosine", "{max_drop: 0.01}"),
    ("top1", "{max_drop: 0.01}"),
    ("binary_decision\n  binary_decision: {threshold: 0.0, report: f1}", "{max_drop: 0.01}"),
    ("segmentation\n  segmentation: {class_axis: 1}", "{max_drop: 0.01}"),
])  # fmt: skip
def test_nan_outputs_fail_the_budget_with_their_count(tmp_path: Path, metric: str, budget: str) -> None:
    recipe, result = _evaluate(tmp_path, metric, budget, one_nan_row)
    assert result.passed is False  # before: passed, the metric alone within budget
    assert result.details is not None and result.details["non_finite_outputs"] == {"y": 16}
    assert result.note == "the candidate's outputs hold 16 non-finite values (NaN or infinity; 'y': 16) where the FP32 reference's are finite"
    with pytest.raises(AccuracyBudgetError) as info:
        check_budget(recipe, result, "int8")
    assert "int8 model fails the accuracy budget: its outputs hold 16 non-finite values (NaN or infinity; 'y': 16) over 500 samples" in info.value.message
    assert "use a higher precision" in (info.value.hint or "")


def test_infinities_where_the_reference_has_them_are_not_counted() -> None:
    reference = np.array([[0.5, -np.inf, 1.0]], np.float32)  # a masked logit
    candidate = np.array([[np.nan, -np.inf, 1.0]], np.float32)
    assert non_finite_counts([{"y": candidate, "ids": np.array([1])}], [{"y": reference}]) == {"y": 1}
    assert non_finite_counts([{"y": reference}], [{"y": reference}]) == {}


@pytest.mark.parametrize(("metric", "words"), [
    ("detection\n  detection: {boxes: {output: y, channels: [0, 4]}, scores: {output: y, channels: [4, 16]}, score_threshold: 20}",
     "metric detection: the FP32 reference detects nothing in any of the 500 evaluation images (score threshold 20.0), so the "
     "evaluation set cannot judge the model"),
    ("segmentation\n  segmentation: {threshold: 20}",
     "metric segmentation: the FP32 reference's masks of 'y' have no foreground pixels (no value above the threshold 20.0) in "
     "the evaluation set, so it cannot judge the model"),
    ("binary_decision\n  binary_decision: {threshold: 20, report: f1}",
     "metric binary_decision: the FP32 reference has no positive decision in the evaluation set (0 candidate positives), so "
     "it cannot judge the model"),
])  # fmt: skip
def test_a_reference_with_nothing_to_find_cannot_judge_the_model(tmp_path: Path, metric: str, words: str) -> None:
    """x * 2 ~ N(0, 4): nothing passes a threshold of 20, so before, any candidate (here all zeros) scored 1.0."""
    with pytest.raises(EvaluationError) as info:
        _evaluate(tmp_path, metric, "{max_drop: 0.02}", lambda y, call: np.zeros_like(y))
    assert words in info.value.message
    assert "lower evaluation." in (info.value.hint or "") and "evaluate on data" in (info.value.hint or "")


def test_positive_set_scores_refuse_an_empty_reference() -> None:
    assert positive_set_scores(4, 0, 1) == (8 / 9, 0.8)
    with pytest.raises(EvaluationError, match="the FP32 reference has no positive decision in the evaluation set"):
        positive_set_scores(0, 3, 0)


CTC_RECIPE = """\
name: ctc
model: {kind: onnx, path: m.onnx}
inputs:
  - {name: x, dtype: float32, shape: [50, batch, 6]}
outputs: [y]
dims:
  batch: {min: 1, opt: 4, max: 8}
data:
  samples: {callable: "tests.evaluate.test_candidate_outputs_checked:time_major"}
evaluation:
  metric: %s
  budget: %s
"""


@pytest.mark.parametrize(("metric", "budget"), [
    ("ctc_text\n  ctc_text: {time_axis: 0, class_axis: 2}", "{max_value: 0.05}"),
    ("cosine", "{max_drop: 0.01}"),
])  # fmt: skip
def test_samples_of_a_time_major_output_are_its_batch_items(tmp_path: Path, metric: str, budget: str) -> None:
    path = tmp_path / "ctc.yaml"
    path.write_text(CTC_RECIPE % (metric, budget))
    recipe = load_recipe(path)
    data = load_batches(recipe, recipe.data.samples, "samples")
    reference = run_reference(recipe, lambda b: {"y": b["x"]}, data)
    result = evaluate_accuracy(recipe, lambda b: {"y": b["x"]}, reference, data, "fp32")
    assert result.samples == 8  # 2 batches of 4 lines; before: 100, the time steps


def test_samples_count_the_dim_named_batch_when_axis_0_is_a_named_time_dim(tmp_path: Path) -> None:
    """[time, batch, 6]: axis 0's name is time, so the samples are the items along batch (it counted 100 time steps)."""
    path = tmp_path / "ctc.yaml"
    text = (CTC_RECIPE % ("cosine", "{max_drop: 0.01}")).replace("shape: [50, batch, 6]", "shape: [time, batch, 6]")
    path.write_text(text.replace("dims:\n", "dims:\n  time: {min: 1, opt: 50, max: 64}\n"))
    recipe = load_recipe(path)
    assert recipe.batch_dim == "time"
    data = load_batches(recipe, recipe.data.samples, "samples")
    reference = run_reference(recipe, lambda b: {"y": b["x"]}, data)
    assert evaluate_accuracy(recipe, lambda b: {"y": b["x"]}, reference, data, "fp32").samples == 8
