"""The golden self-check against a wrong model, on a detector-style output that mixes ranges: boxes in
pixels (0..320) and class scores (0..1) concatenated in one tensor, as YOLO-class exports write them.

Built at int8, the bundle passes its own self-check; a model of the same signature with other weights
in place of model.onnx fails it, and the failure names the output and the tolerance it broke, both
through the self-check API and when the swapped bundle is re-signed so that it gets past the hash check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.bundle.manifest import write_manifest
from edgekit.errors import BundleError
from edgekit.pipeline import build
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check

CLASSES = 3
CELLS = 64  # 8 x 8 grid
SIZE = 320.0

RECIPE = """\
name: mixed-head
model: {kind: onnx, path: detector.onnx}
inputs:
  - {name: images, dtype: float32, shape: [batch, 3, 16, 16]}
outputs: [detections]
dims:
  batch: {min: 1, opt: 2, max: 2}
data:
  samples: {callable: "tests.bundle.test_golden_swap:image_batches"}
  calibration: {callable: "tests.bundle.test_golden_swap:image_batches", kwargs: {count: 4}}
  evaluation: {callable: "tests.bundle.test_golden_swap:image_batches"}
evaluation:
  metric: cosine
  budget: {min_value: 0.5}
build:
  benchmark: {warmup: 1, iterations: 2}
"""


def image_batches(count: int = 2, batch: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [{"images": rng.uniform(0, 1, size=(batch, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


def _weights(seed: int, score_seed: int | None = None) -> dict[str, np.ndarray]:
    """The detector's weights from ``seed``; ``score_seed`` redraws only the class-score rows of the head."""
    rng = np.random.default_rng(seed)
    weights = {
        "stem.w": rng.normal(0, 0.4, (16, 3, 3, 3)), "stem.b": rng.normal(0, 0.1, 16),
        "head.w": rng.normal(0, 0.3, (4 + CLASSES, 16, 1, 1)), "head.b": rng.normal(0, 0.2, 4 + CLASSES),
    }
    if score_seed is not None:
        other = np.random.default_rng(score_seed)
        weights["head.w"][4:] = other.normal(0, 0.3, (CLASSES, 16, 1, 1))
        weights["head.b"][4:] = other.normal(0, 0.2, CLASSES)
    return weights


def mixed_range_detector(seed: int = 0, score_seed: int | None = None) -> onnx.ModelProto:
    """images[b, 3, 16, 16] -> detections[b, 64, 4 + 3]: sigmoid boxes x 320 and sigmoid class scores."""
    const = {"shape": np.array([0, 4 + CLASSES, CELLS], np.int64), "split": np.array([4, CLASSES], np.int64),
             "size": np.array(SIZE, np.float32)}
    nodes = [
        helper.make_node("Conv", ["images", "stem.w", "stem.b"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "head.w", "head.b"], ["h"], name="head"),
        helper.make_node("Reshape", ["h", "shape"], ["flat"], name="flatten_cells"),
        helper.make_node("Transpose", ["flat"], ["cells"], perm=[0, 2, 1], name="cells_last"),
        helper.make_node("Split", ["cells", "split"], ["raw_boxes", "raw_scores"], axis=2, name="split"),
        helper.make_node("Sigmoid", ["raw_boxes"], ["unit_boxes"], name="box_sigmoid"),
        helper.make_node("Mul", ["unit_boxes", "size"], ["boxes"], name="to_pixels"),
        helper.make_node("Sigmoid", ["raw_scores"], ["scores"], name="score_sigmoid"),
        helper.make_node("Concat", ["boxes", "scores"], ["detections"], axis=2, name="concat"),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in _weights(seed, score_seed).items()]
    initializers += [numpy_helper.from_array(v, k) for k, v in const.items()]
    graph = helper.make_graph(nodes, "mixed_range_detector",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                              [helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["batch", CELLS, 4 + CLASSES])],
                              initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def int8_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixed")
    onnx.save(mixed_range_detector(), str(root / "detector.onnx"))
    (root / "recipe.yaml").write_text(RECIPE)
    build(root / "recipe.yaml", "x86-64-cpu", precision="int8", out=root / "bundle")
    return root / "bundle"


def _swapped(bundle_dir: Path, tmp_path: Path, model: onnx.ModelProto) -> Path:
    copy = tmp_path / "swapped"
    copy.mkdir()
    for path in bundle_dir.rglob("*"):
        if path.is_file():
            (copy / path.relative_to(bundle_dir)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(bundle_dir)).write_bytes(path.read_bytes())
    onnx.save(model, str(copy / "model.onnx"))
    return copy


def _run_self_check(bundle_dir: Path, verify: bool, raise_on_failure: bool = False):
    bundle = open_bundle(bundle_dir, verify=verify)
    return self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle), raise_on_failure=raise_on_failure)


def test_the_int8_bundle_passes_its_own_self_check(int8_bundle: Path) -> None:
    result = _run_self_check(int8_bundle, verify=True)
    assert result.passed, result.to_dict()
    tolerance = json.loads((int8_bundle / "manifest.json").read_text())["golden"]["outputs"]["detections"]
    assert tolerance["measured"]["max_abs_reference"] > 100  # the boxes are in pixels
    assert tolerance["atol"] < 0.1 * SIZE  # not the 177-of-320 atol the issue found


@pytest.mark.parametrize("swap", ["all weights", "class scores only"])
def test_a_same_signature_model_with_other_weights_fails_naming_output_and_tolerance(int8_bundle: Path, tmp_path: Path, swap: str) -> None:
    other = mixed_range_detector(seed=1) if swap == "all weights" else mixed_range_detector(seed=0, score_seed=5)
    swapped = _swapped(int8_bundle, tmp_path, other)
    manifest = json.loads((swapped / "manifest.json").read_text())
    tolerance = manifest["golden"]["outputs"]["detections"]
    with pytest.raises(BundleError, match="model.onnx"):  # the hash check comes first
        open_bundle(swapped, verify=True)
    write_manifest(swapped, {**manifest, "files": {}})  # re-hashed, as a build of the other model would be
    result = _run_self_check(swapped, verify=True)
    assert not result.passed and [c.name for c in result.outputs if not c.passed] == ["detections"]
    with pytest.raises(BundleError) as caught:
        _run_self_check(swapped, verify=True, raise_on_failure=True)
    message = str(caught.value)
    assert "output 'detections': max_abs_diff" in message
    assert f"atol {tolerance['atol']:g}" in message and f"min_cosine {tolerance['min_cosine']:g}" in message
