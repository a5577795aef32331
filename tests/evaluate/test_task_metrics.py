"""Task metrics on hand-made arrays with answers worked out by hand, and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import EvaluationError
from edgekit.evaluate.task_metrics import (
    TASK_METRICS,
    BinaryDecisionMetric,
    CtcTextMetric,
    DetectionMetric,
    SegmentationMetric,
    average_precision,
    box_iou,
    ctc_greedy,
    edit_distance,
    nms,
)
from edgekit.recipe import (
    METRIC_NAMES,
    BinaryDecisionOptions,
    CtcTextOptions,
    DetectionOptions,
    OutputSlice,
    SegmentationOptions,
)

# ---------------------------------------------------------------- detection helpers


def test_box_iou_and_nms_by_hand():
    a = np.array([[0, 0, 10, 10]], float)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], float)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 50 / 150, 0.0]])
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]], float)  # the first two overlap at IoU 90/110
    assert nms(boxes, np.array([0.9, 0.8, 0.7]), iou=0.5).tolist() == [0, 2]
    assert nms(boxes, np.array([0.9, 0.8, 0.7]), iou=0.9).tolist() == [0, 1, 2]


def test_average_precision_by_hand():
    # hits at ranks 1 and 3 of 3 detections, 2 positives: precision 1 up to recall 0.5, 2/3 up to recall 1
    assert average_precision(np.array([0.9, 0.8, 0.7]), np.array([True, False, True]), 2) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert average_precision(np.array([0.9]), np.array([True]), 2) == pytest.approx(0.5)  # half the boxes found
    assert average_precision(np.array([0.9]), np.array([False]), 0) == 0.0  # detections where there is nothing
    assert average_precision(np.zeros(0), np.zeros(0, bool), 0) == 1.0


def _yolo_like(boxes: list[list[float]], scores: list[list[float]]) -> dict[str, np.ndarray]:
    """One image, output [1, 4 + classes, candidates] (channels first, as YOLOv8 exports)."""
    rows = np.concatenate([np.asarray(boxes, np.float32), np.asarray(scores, np.float32)], axis=1)
    return {"out": rows.T[None]}


DETECTION = DetectionOptions(boxes=OutputSlice(output="out", channels=(0, 4), channel_axis=1),
                             scores=OutputSlice(output="out", channels=(4, 6), channel_axis=1),
                             format="cxcywh", score_threshold=0.25, nms_iou=0.5)
REFERENCE = _yolo_like([[50, 50, 20, 20], [150, 150, 40, 40], [51, 50, 20, 20], [300, 10, 10, 10]],
                       [[0.9, 0.1], [0.05, 0.8], [0.85, 0.1], [0.1, 0.1]])


def test_detection_decodes_cxcywh_channels_first_with_nms():
    (image,) = DetectionMetric(DETECTION).decode(REFERENCE)
    np.testing.assert_allclose(image.boxes, [[40, 40, 60, 60], [130, 130, 170, 170]])  # the duplicate is suppressed
    assert image.classes.tolist() == [0, 1]  # the low-scoring candidate is dropped
    np.testing.assert_allclose(image.scores, [0.9, 0.8], rtol=1e-6)


def test_detection_map_by_hand():
    metric = DetectionMetric(DETECTION)
    assert metric([REFERENCE], [REFERENCE])[0] == 1.0
    # the class-1 box moved off its reference: class 0 AP 1, class 1 AP 0 -> mAP 0.5
    moved = _yolo_like([[50, 50, 20, 20], [190, 150, 40, 40]], [[0.9, 0.1], [0.05, 0.8]])
    value, details = metric([moved], [REFERENCE])
    assert value == pytest.approx(0.5)
    assert details["worst_class_ap"] == {"1": 0.0, "0": 1.0} and details["reference_detections"] == 2
    # scores swapped between the classes: every box is the wrong class -> 0
    swapped = _yolo_like([[50, 50, 20, 20], [150, 150, 40, 40]], [[0.1, 0.9], [0.8, 0.05]])
    assert metric([swapped], [REFERENCE])[0] == 0.0
    # a missing box: class 1 found nothing -> mAP 0.5; an extra box of a new class is a false positive class
    missing = _yolo_like([[50, 50, 20, 20]], [[0.9, 0.1]])
    assert metric([missing], [REFERENCE])[0] == pytest.approx(0.5)


def test_detection_errors_name_the_option():
    bad = DetectionOptions(boxes=OutputSlice(output="out", channels=(0, 4), channel_axis=1),
                           scores=OutputSlice(output="out", channels=(4, 90), channel_axis=1))
    with pytest.raises(EvaluationError, match=r"evaluation\.detection\.scores\.channels \[4, 90\] run past output 'out', which has 6 channels on axis 1"):
        DetectionMetric(bad)([REFERENCE], [REFERENCE])
    three = DetectionOptions(boxes=OutputSlice(output="out", channels=(0, 3), channel_axis=1), scores=DETECTION.scores)
    with pytest.raises(EvaluationError, match=r"detection\.boxes selects 3 channels of 'out'; boxes need 4"):
        DetectionMetric(three)([REFERENCE], [REFERENCE])
    other = DetectionOptions(boxes=OutputSlice(output="dets"), scores=DETECTION.scores)
    with pytest.raises(EvaluationError, match=r"the model has no output 'dets' \(it has \['out'\]\)"):
        DetectionMetric(other)([REFERENCE], [REFERENCE])


# ---------------------------------------------------------------- segmentation


def test_segmentation_mean_iou_by_hand():
    reference = np.zeros((1, 3, 2, 2), np.float32)  # argmax classes [[0, 1], [2, 2]]
    reference[0, 0, 0, 0] = reference[0, 1, 0, 1] = reference[0, 2, 1, 0] = reference[0, 2, 1, 1] = 1
    got = np.zeros_like(reference)  # classes [[0, 1], [1, 2]]
    got[0, 0, 0, 0] = got[0, 1, 0, 1] = got[0, 1, 1, 0] = got[0, 2, 1, 1] = 1
    metric = SegmentationMetric(SegmentationOptions(), "mask")
    value, details = metric([{"mask": got}], [{"mask": reference}])
    # IoU: class 0 1/1, class 1 1/2, class 2 1/2
    assert value == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert details["pixel_agreement"] == 0.75
    ignoring = SegmentationMetric(SegmentationOptions(ignore_classes=(0,)), "mask")
    assert ignoring([{"mask": got}], [{"mask": reference}])[0] == pytest.approx(0.5)


def test_segmentation_threshold_masks():
    reference = np.array([[[0.9, 0.8], [0.1, 0.2]]], np.float32)
    got = np.array([[[0.9, 0.3], [0.1, 0.2]]], np.float32)
    metric = SegmentationMetric(SegmentationOptions(threshold=0.5, ignore_classes=(0,)), "prob")
    assert metric([{"prob": got}], [{"prob": reference}])[0] == pytest.approx(0.5)  # foreground: 1 of 2


def test_segmentation_bad_axis():
    metric = SegmentationMetric(SegmentationOptions(class_axis=4), "mask")
    with pytest.raises(EvaluationError, match=r"evaluation\.segmentation\.class_axis 4 is outside output 'mask' of shape \[1, 3, 2\]"):
        metric([{"mask": np.zeros((1, 3, 2))}], [{"mask": np.zeros((1, 3, 2))}])


# ---------------------------------------------------------------- CTC text


def _one_hot(lines: list[list[int]], classes: int = 5) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[np.asarray(lines)]


def test_ctc_greedy_collapses_repeats_and_blanks():
    logits = _one_hot([[1, 1, 0, 1, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 3]])
    assert ctc_greedy(logits, blank=0) == [(1, 1, 2), (3,)]
    assert ctc_greedy(np.transpose(logits, (1, 0, 2)), blank=0, time_axis=0) == [(1, 1, 2), (3,)]


def test_edit_distance_and_cer_by_hand():
    assert edit_distance((1, 2, 3), (1, 3)) == 1 and edit_distance((), (4, 4)) == 2 and edit_distance((1, 2), (2, 1)) == 2
    reference = {"logits": _one_hot([[1, 0, 2, 3], [4, 4, 0, 4]])}  # "1 2 3" and "4 4"
    got = {"logits": _one_hot([[1, 0, 2, 2], [4, 4, 0, 4]])}  # "1 2" and "4 4"
    value, details = CtcTextMetric(CtcTextOptions(), "logits")([got], [reference])
    assert value == pytest.approx(1 / 5) and details["line_agreement"] == 0.5
    agreement = CtcTextMetric(CtcTextOptions(report="line_agreement"), "logits")([got], [reference])[0]
    assert agreement == 0.5


def test_ctc_needs_three_axes():
    with pytest.raises(EvaluationError, match=r"ctc_text: the output has shape \[2, 5\]; CTC decoding needs 3 axes"):
        CtcTextMetric(CtcTextOptions(), "logits")([{"logits": np.zeros((2, 5))}], [{"logits": np.zeros((2, 5))}])


# ---------------------------------------------------------------- binary decisions


def test_binary_decision_agreement_by_hand():
    reference = {"p": np.array([[0.9], [0.2], [0.6], [0.4]], np.float32)}
    got = {"p": np.array([[0.8], [0.3], [0.4], [0.4]], np.float32)}
    value, details = BinaryDecisionMetric(BinaryDecisionOptions(), "p")([got], [reference])
    assert value == 0.75 and details["positives"] == 1 and details["reference_positives"] == 2
    assert BinaryDecisionMetric(BinaryDecisionOptions(threshold=0.35), "p")([got], [reference])[0] == 1.0


def test_every_recipe_metric_is_built_in_or_a_task_metric():
    assert set(METRIC_NAMES) == {"top1", "cosine", "mse", "callable"} | set(TASK_METRICS)


def test_detection_xyxy_boxes_and_one_class_scores_in_separate_outputs():
    options = DetectionOptions(boxes=OutputSlice(output="boxes"), scores=OutputSlice(output="scores"), score_threshold=0.5)
    reference = {"boxes": np.array([[[0, 0, 10, 10], [20, 20, 40, 40], [50, 50, 60, 60]]], np.float32),
                 "scores": np.array([[0.9, 0.8, 0.1]], np.float32)}  # [batch, candidates]: one class
    shifted = {"boxes": reference["boxes"], "scores": np.array([[0.9, 0.4, 0.1]], np.float32)}
    metric = DetectionMetric(options)
    (image,) = metric.decode(reference)
    assert image.classes.tolist() == [0, 0] and len(image.boxes) == 2
    assert metric([reference], [reference])[0] == 1.0
    assert metric([shifted], [reference])[0] == pytest.approx(0.5)  # the second box fell under the threshold
