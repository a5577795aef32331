"""A metric that is NaN or infinite fails the accuracy budget (every comparison with NaN is false, so before it
met any budget): a candidate whose outputs are NaN, through the real recipe loader and ONNX Runtime's twin
of a quantized model (``OrtMetricEvaluator``) alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgekit.data import load_batches
from edgekit.errors import AccuracyBudgetError
from edgekit.evaluate import check_budget, evaluate_accuracy
from edgekit.evaluate.accuracy import run_reference
from edgekit.recipe import load_recipe


def batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(2)]


RECIPE = """\
name: nan-metric
model: {kind: onnx, path: m.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 16]}
outputs: [y]
dims:
  batch: {min: 1, opt: 4, max: 8}
data:
  samples: {callable: "tests.evaluate.test_nonfinite_metric:batches"}
evaluation:
  metric: %s
  budget: %s
"""


def mean_error(got: list[np.ndarray], ref: list[np.ndarray], labels: object) -> float:
    """A recipe's own metric: the mean of the outputs' differences (NaN with NaN outputs)."""
    return float(np.mean([np.mean(g - r) for g, r in zip(got, ref)]))


@pytest.mark.parametrize(("metric", "budget"), [
    ("mse", "{max_drop: 0.001, max_value: 0.01}"),
    ("callable\n  callable: tests.evaluate.test_nonfinite_metric:mean_error\n  higher_is_better: false", "{max_drop: 0.01}"),
])  # fmt: skip
def test_a_nan_metric_fails_the_budget_and_says_why(tmp_path: Path, metric: str, budget: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(RECIPE % (metric, budget)))
    recipe = load_recipe(path)
    data = load_batches(recipe, recipe.data.samples, "samples")
    reference = run_reference(recipe, lambda b: {"y": b["x"] * 2.0}, data)
    result = evaluate_accuracy(recipe, lambda b: {"y": np.full_like(b["x"], np.nan)}, reference, data, "int8")
    assert np.isnan(result.value) and result.passed is False  # before: passed
    with pytest.raises(AccuracyBudgetError) as info:
        check_budget(recipe, result, "int8")
    assert f"int8 model's accuracy cannot be judged: {metric.split()[0]} is nan" in info.value.message
    assert "not a finite number" in info.value.message and "NaN or infinity" in (info.value.hint or "")
    good = evaluate_accuracy(recipe, lambda b: {"y": b["x"] * 2.0}, reference, data, "int8")
    assert good.passed is True


def test_the_quantized_twins_judge_fails_a_nan_metric(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from edgekit.quantize.ort.judges import OrtMetricEvaluator
    from edgekit.recipe import AccuracyBudget

    for name, ops in (("reference", ["Abs", "Sqrt"]), ("candidate", ["Sqrt", "Identity"])):  # negative inputs: Sqrt gives NaN
        nodes = [helper.make_node(ops[0], ["x"], ["h"]), helper.make_node(ops[1], ["h"], ["y"])]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])])  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / f"{name}.onnx"))

    def mse(got: list[np.ndarray], ref: list[np.ndarray], labels: object) -> float:
        return float(np.mean([np.mean((g - r) ** 2) for g, r in zip(got, ref)]))

    judge = OrtMetricEvaluator(batches(), mse, AccuracyBudget(max_drop=1.0), tmp_path / "reference.onnx", higher_is_better=False)
    assert judge(tmp_path / "reference.onnx").passed
    result = judge(tmp_path / "candidate.onnx")
    assert not result.passed and result.reasons[0] == "the metric is nan, not a finite number"  # before: passed
