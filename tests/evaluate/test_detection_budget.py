"""A broken detector (boxes right, class scores scrambled) passes whole-output cosine and fails the
detection metric's budget: both graphs run in ONNX Runtime, the recipe is loaded from YAML."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.data import load_batches
from edgekit.errors import AccuracyBudgetError
from edgekit.evaluate import check_budget, evaluate_accuracy
from edgekit.evaluate.accuracy import run_reference
from edgekit.recipe import load_recipe
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.signature import IOSignature

CANDIDATES = 32


def detector_batches(batches: int = 4, batch: int = 2, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Raw YOLO-like predictions [batch, 4 + 3 classes, candidates]: boxes 0..320 (cxcywh), a few confident objects."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        x = np.zeros((batch, 7, CANDIDATES), np.float32)
        x[:, 0:2] = rng.uniform(20, 300, size=(batch, 2, CANDIDATES))
        x[:, 2:4] = rng.uniform(10, 40, size=(batch, 2, CANDIDATES))
        x[:, 4:7] = rng.uniform(0.0, 0.1, size=(batch, 3, CANDIDATES))
        for image in range(batch):
            for candidate in rng.choice(CANDIDATES, size=6, replace=False):
                x[image, 4 + rng.integers(3), candidate] = rng.uniform(0.6, 0.95)
        out.append({"x": x})
    return out


def _detector(path: Path, scramble: bool) -> None:
    """Identity over the raw predictions (the FP32 model); with ``scramble``, the class scores are moved to other candidates."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 7, CANDIDATES])
    y = helper.make_tensor_value_info("dets", TensorProto.FLOAT, ["batch", 7, CANDIDATES])
    if not scramble:
        nodes, inits = [helper.make_node("Identity", ["x"], ["dets"])], []
    else:
        order = np.roll(np.arange(CANDIDATES), 5).astype(np.int64)
        inits = [helper.make_tensor("split", TensorProto.INT64, [2], [4, 3]), helper.make_tensor("order", TensorProto.INT64, [CANDIDATES], order)]
        nodes = [
            helper.make_node("Split", ["x", "split"], ["boxes", "scores"], axis=1),
            helper.make_node("Gather", ["scores", "order"], ["moved"], axis=2),
            helper.make_node("Concat", ["boxes", "moved"], ["dets"], axis=1),
        ]
    graph = helper.make_graph(nodes, "detector", [x], [y], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


RECIPE = """\
name: detector
model: {kind: onnx, path: good.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 7, %d]}
outputs: [dets]
dims:
  batch: {min: 1, opt: 2, max: 4}
data:
  samples: {callable: "tests.evaluate.test_detection_budget:detector_batches"}
evaluation:
%s
""" % (CANDIDATES, "%s")

DETECTION = """\
  metric: detection
  detection:
    boxes: {output: dets, channels: [0, 4], channel_axis: 1}
    scores: {output: dets, channels: [4, 7], channel_axis: 1}
    format: cxcywh
    score_threshold: 0.25
    nms_iou: 0.5
  budget: {max_drop: 0.05}"""

COSINE = """\
  metric: cosine
  budget: {min_value: 0.99}"""


def _runner(path: Path) -> OnnxRuntimeRunner:
    signature = IOSignature.from_manifest({"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 7, CANDIDATES]}],
                                           "outputs": [{"name": "dets", "dtype": "float32", "shape": ["batch", 7, CANDIDATES]}],
                                           "dims": {"batch": {"min": 1, "opt": 2, "max": 4}}})
    return OnnxRuntimeRunner(path, signature).load()


@pytest.fixture
def detectors(tmp_path):
    _detector(tmp_path / "good.onnx", scramble=False)
    _detector(tmp_path / "broken.onnx", scramble=True)
    good, broken = _runner(tmp_path / "good.onnx"), _runner(tmp_path / "broken.onnx")
    yield good, broken
    good.close()
    broken.close()


def _evaluate(tmp_path: Path, section: str, reference, candidate):
    path = tmp_path / "detector.yaml"
    path.write_text(textwrap.dedent(RECIPE % section))
    recipe = load_recipe(path)
    batches = load_batches(recipe, recipe.data.samples, "samples")
    return recipe, evaluate_accuracy(recipe, candidate.infer, run_reference(recipe, reference.infer, batches), batches, "onnxruntime-fp32")


def test_scrambled_scores_pass_cosine_but_fail_detection(tmp_path, detectors):
    good, broken = detectors
    recipe, cosine = _evaluate(tmp_path, COSINE, good, broken)
    assert cosine.passed and cosine.value > 0.999  # the boxes (up to 320) drown the scores (0..1)
    check_budget(recipe, cosine, "int8")

    recipe, detection = _evaluate(tmp_path, DETECTION, good, broken)
    print(f"cosine {cosine.value:.6f}, detection mAP {detection.value:.4f}")
    assert detection.reference == 1.0 and detection.value < 0.3 and not detection.passed
    assert detection.details["reference_detections"] == 4 * 2 * 6 and detection.details["classes"] == 3
    with pytest.raises(AccuracyBudgetError, match=r"int8 model is outside the accuracy budget: detection = 0\.\d+ \(reference 1, drop 0\.\d+\)"):
        check_budget(recipe, detection, "int8")


def test_the_fp32_detector_scores_itself_perfectly(tmp_path, detectors):
    good, _ = detectors
    _, result = _evaluate(tmp_path, DETECTION, good, good)
    assert result.passed and result.value == 1.0 and result.drop == 0.0
    assert result.to_manifest()["details"]["map_iou"] == 0.5


def test_auto_precision_searches_with_the_task_metric(tmp_path):
    """auto judges every candidate by the recipe's task metric (detection mAP here), as the build's evaluation does."""
    from edgekit.pipeline import build

    _detector(tmp_path / "good.onnx", scramble=False)
    text = (RECIPE % DETECTION).replace("data:\n", 'data:\n  calibration: {callable: "tests.evaluate.test_detection_budget:detector_batches"}\n'
                                         '  evaluation: {callable: "tests.evaluate.test_detection_budget:detector_batches", kwargs: {seed: 1}}\n')
    (tmp_path / "detector.yaml").write_text(text)
    result = build(tmp_path / "detector.yaml", "x86-64-cpu", precision="auto", out=tmp_path / "auto")
    evaluated = [row for row in result.manifest["quantization"]["auto"]["candidates"] if row["value"] is not None]
    assert evaluated and all(0.0 <= row["value"] <= 1.0 for row in evaluated)
    assert result.manifest["accuracy"]["metric"] == "detection" and result.manifest["accuracy"]["passed"]
