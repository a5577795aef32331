"""``binary_decision`` on dense maps with rare positives (issue 29: a face-proposal heatmap scored 0.9986 agreement
while 18 % of its proposals at the model's own threshold were lost): F1 / IoU of the positive set, selectable with
``report``, and the build's advice where positives are under 10 %."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import EvaluationError
from edgekit.evaluate import evaluate_accuracy
from edgekit.evaluate.accuracy import run_reference
from edgekit.evaluate.task_metrics import BinaryDecisionMetric, positive_set_scores
from edgekit.pipeline import build
from edgekit.recipe import BinaryDecisionOptions, load_recipe


def test_f1_and_iou_of_the_positives_by_hand() -> None:
    """100 decisions, FP32 has 5 positives, the candidate keeps 4 and adds none: agreement 0.99, F1 8/9, IoU 4/5."""
    reference = np.zeros((1, 100), np.float32)
    reference[0, :5] = 0.9
    got = reference.copy()
    got[0, 4] = 0.1
    for report, want in (("agreement", 0.99), ("f1", 8 / 9), ("iou", 0.8)):
        value, details = BinaryDecisionMetric(BinaryDecisionOptions(report=report), "p")([{"p": got}], [{"p": reference}])
        assert value == pytest.approx(want)
    assert details["positive_rate"] == pytest.approx(0.05) and details["f1"] == pytest.approx(8 / 9) and details["iou"] == pytest.approx(0.8)
    with pytest.raises(EvaluationError, match="cannot judge the model"):  # no positive in the reference: nothing to find
        positive_set_scores(0, 0, 0)


def test_advice_only_where_agreement_is_budgeted_over_rare_positives() -> None:
    reference = np.zeros((1, 100), np.float32)
    reference[0, :5] = 0.9
    _, rare = BinaryDecisionMetric(BinaryDecisionOptions(), "p")([{"p": reference}], [{"p": reference}])
    assert "set evaluation.binary_decision.report: f1" in rare["advice"] and "5.0% of FP32's decisions are positive" in rare["advice"]
    _, chosen = BinaryDecisionMetric(BinaryDecisionOptions(report="f1"), "p")([{"p": reference}], [{"p": reference}])
    reference[0, :50] = 0.9
    _, common = BinaryDecisionMetric(BinaryDecisionOptions(), "p")([{"p": reference}], [{"p": reference}])
    assert "advice" not in chosen and "advice" not in common


# ---------------------------------------------------------------- a real heatmap model


def proposal_heatmap(bias: float = -6.0) -> onnx.ModelProto:
    """``x[batch, 1, 16, 16]`` -> 3x3 Conv -> Sigmoid: a proposal heatmap whose positives (> 0.5) are a few percent
    of its cells; ``bias`` shifts every logit (a damaged build lowers it and loses the weakest proposals)."""
    rng = np.random.default_rng(5)
    weights = rng.normal(0, 1.0, (1, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["logits"], pads=[1, 1, 1, 1], name="head"),
         helper.make_node("Sigmoid", ["logits"], ["heatmap"], name="sigmoid")],
        "proposals", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 16, 16])],
        [helper.make_tensor_value_info("heatmap", TensorProto.FLOAT, ["batch", 1, 16, 16])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([bias], np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def heatmap_batches(count: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    return [{"x": rng.normal(0, 1.5, (4, 1, 16, 16)).astype(np.float32)} for _ in range(count)]


RECIPE = """\
name: proposals
model: {{kind: onnx, path: proposals.onnx}}
inputs:
  - {{name: x, dtype: float32, shape: [batch, 1, 16, 16]}}
outputs: [heatmap]
dims:
  batch: {{min: 1, opt: 4, max: 4}}
data:
  samples: {{callable: "tests.evaluate.test_binary_decision_positives:heatmap_batches"}}
  evaluation: {{callable: "tests.evaluate.test_binary_decision_positives:heatmap_batches"}}
evaluation:
  metric: binary_decision
  binary_decision: {{threshold: 0.5{report}}}
  budget: {{min_value: 0.98}}
build:
  benchmark: {{warmup: 1, iterations: 3}}
"""


def _recipe(directory: Path, report: str | None = None) -> Path:
    onnx.save(proposal_heatmap(), str(directory / "proposals.onnx"))
    path = directory / "proposals.yaml"
    path.write_text(textwrap.dedent(RECIPE.format(report=f", report: {report}" if report else "")))
    return path


def _runner(model: onnx.ModelProto):  # type: ignore[no-untyped-def]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda batch: dict(zip(["heatmap"], session.run(None, {"x": batch["x"]})))


@pytest.mark.parametrize(("report", "passes"), [(None, True), ("f1", False), ("iou", False)])
def test_a_damaged_heatmap_passes_on_agreement_and_fails_on_the_positives(tmp_path: Path, report: str | None, passes: bool) -> None:
    recipe = load_recipe(_recipe(tmp_path, report))
    batches = heatmap_batches()
    reference = run_reference(recipe, _runner(proposal_heatmap()), batches)
    result = evaluate_accuracy(recipe, _runner(proposal_heatmap(bias=-6.4)), reference, batches, "onnxruntime-fp32")
    assert result.details is not None and result.details["positive_rate"] < 0.10
    lost = 1 - result.details["positives"] / result.details["reference_positives"]
    assert lost > 0.15  # a sixth or more of the proposals are gone
    assert result.details["agreement"] > 0.98 and result.passed is passes


def test_the_build_log_and_manifest_recommend_f1_where_positives_are_rare(tmp_path: Path) -> None:
    manifest = build(_recipe(tmp_path), "x86-64-cpu", precision="fp32", out=tmp_path / "bundle").manifest
    details = manifest["accuracy"]["details"]
    assert details["positive_rate"] < 0.10 and "set evaluation.binary_decision.report: f1" in details["advice"]
    manifest = build(_recipe(tmp_path, "f1"), "x86-64-cpu", precision="fp32", out=tmp_path / "bundle-f1").manifest
    assert manifest["accuracy"]["value"] == 1.0 and "advice" not in manifest["accuracy"]["details"]


def test_agreement_over_a_reference_without_positives_is_judged_with_advice() -> None:
    """report: agreement still tells false positives when FP32 decides no positive (a real VAD on silence); only f1 and
    iou, which have nothing to find there, refuse such an evaluation set."""
    reference = np.zeros(20, np.float32)
    got = np.zeros(20, np.float32)
    got[3] = 0.9  # one false positive
    value, details = BinaryDecisionMetric(BinaryDecisionOptions(report="agreement"), "p")([{"p": got}], [{"p": reference}])
    assert value == pytest.approx(19 / 20) and details["f1"] is None and details["reference_positives"] == 0
    assert "FP32 decides no positive in the evaluation set" in details["advice"]
    with pytest.raises(EvaluationError, match="cannot judge the model"):
        BinaryDecisionMetric(BinaryDecisionOptions(report="f1"), "p")([{"p": got}], [{"p": reference}])
