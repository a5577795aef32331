"""Task metrics: the candidate's decisions scored against the FP32 model's decisions as ground truth.

Whole-output cosine hides a broken detector whose boxes (0..320) and class scores (0..1) share one
tensor: the boxes dominate the norm. These metrics decode each output the way the application does
(detections after NMS, masks, CTC text, thresholded decisions) and compare what comes out. Each is a
small class built from the recipe's options, registered by name in :data:`TASK_METRICS`; calling one
with the candidate's and the reference's outputs (one dict per evaluation batch) returns the value and
a few details for the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from edgekit.errors import EvaluationError
from edgekit.recipe import (
    BinaryDecisionOptions,
    CtcTextOptions,
    DetectionOptions,
    EvaluationSpec,
    OutputSlice,
    SegmentationOptions,
)

Outputs = Sequence[dict[str, np.ndarray]]


def _output(batch: dict[str, np.ndarray], name: str, metric: str) -> np.ndarray:
    if name not in batch:
        raise EvaluationError(f"metric {metric}: the model has no output '{name}' (it has {sorted(batch)})",
                              hint="name one of the recipe's outputs in the metric's options")
    return np.asarray(batch[name])


# ---------------------------------------------------------------- detection


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every xyxy box in ``a`` [N, 4] with every box in ``b`` [M, 4]: [N, M]."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, highest score first."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size:
        best, order = order[0], order[1:]
        keep.append(int(best))
        if order.size:
            order = order[box_iou(boxes[best][None], boxes[order])[0] <= iou]
    return np.asarray(keep, dtype=np.int64)


def average_precision(scores: np.ndarray, matched: np.ndarray, positives: int) -> float:
    """All-point interpolated AP (the area under the precision envelope) of detections sorted by score."""
    if positives == 0:
        return 0.0 if scores.size else 1.0
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(matched[order])
    fp = np.cumsum(~matched[order])
    recall = np.concatenate([[0.0], tp / positives, [1.0]])
    precision = np.concatenate([[1.0], tp / np.maximum(tp + fp, 1), [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.nonzero(recall[1:] != recall[:-1])[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


@dataclass(frozen=True)
class Detections:
    """One image's detections after the score threshold and NMS."""

    boxes: np.ndarray  # [N, 4] xyxy
    scores: np.ndarray  # [N]
    classes: np.ndarray  # [N]


class DetectionMetric:
    """mAP@``match_iou`` of the candidate's detections against the reference's, over classes either one detects."""

    def __init__(self, options: DetectionOptions) -> None:
        self.options = options
        self.outputs = tuple(dict.fromkeys([options.boxes.output, options.scores.output]))

    def _items(self, batch: dict[str, np.ndarray], where: OutputSlice, field: str) -> np.ndarray:
        array = _output(batch, where.output, "detection")
        if field == "scores" and array.ndim == 2 and where.channels is None:  # [batch, candidates]: one class
            array = array[..., None]
        if array.ndim < 2:
            raise EvaluationError(f"metric detection: evaluation.detection.{field}: output '{where.output}' has shape {list(array.shape)}; "
                                  "it needs a batch axis and a channel axis")
        try:
            moved = np.moveaxis(array, where.channel_axis, -1)
        except np.exceptions.AxisError:
            raise EvaluationError(f"metric detection: evaluation.detection.{field}.channel_axis {where.channel_axis} is outside output "
                                  f"'{where.output}' of shape {list(array.shape)}") from None
        if where.channels is not None:
            start, stop = where.channels
            if stop > moved.shape[-1]:
                raise EvaluationError(
                    f"metric detection: evaluation.detection.{field}.channels {list(where.channels)} run past output '{where.output}', "
                    f"which has {moved.shape[-1]} channels on axis {where.channel_axis} (shape {list(array.shape)})",
                    hint="count channels along channel_axis; for [batch, 84, anchors] set channel_axis: 1",
                )
            moved = moved[..., start:stop]
        return moved.reshape(moved.shape[0], -1, moved.shape[-1]).astype(np.float64)

    def decode(self, batch: dict[str, np.ndarray]) -> list[Detections]:
        opts = self.options
        boxes = self._items(batch, opts.boxes, "boxes")
        scores = self._items(batch, opts.scores, "scores")
        if boxes.shape[-1] != 4:
            raise EvaluationError(f"metric detection: evaluation.detection.boxes selects {boxes.shape[-1]} channels of '{opts.boxes.output}'; boxes need 4",
                                  hint="set boxes.channels to the 4 coordinates, e.g. [0, 4]")
        if boxes.shape[:2] != scores.shape[:2]:
            raise EvaluationError(f"metric detection: boxes give {boxes.shape[1]} candidates per image but scores {scores.shape[1]} "
                                  f"(batch {boxes.shape[0]} vs {scores.shape[0]})", hint="check channel_axis of boxes and scores")
        if opts.format == "cxcywh":
            centre, size = boxes[..., :2], boxes[..., 2:]
            boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=-1)
        images = []
        for image_boxes, image_scores in zip(boxes, scores):
            best = image_scores.max(axis=1)
            classes = image_scores.argmax(axis=1)
            keep = np.nonzero(best >= opts.score_threshold)[0]
            kept: list[np.ndarray] = []
            for cls in np.unique(classes[keep]):
                members = keep[classes[keep] == cls]
                kept.append(members[nms(image_boxes[members], best[members], opts.nms_iou)])
            chosen = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
            chosen = chosen[np.argsort(-best[chosen], kind="stable")][: opts.max_detections]
            images.append(Detections(image_boxes[chosen], best[chosen], classes[chosen]))
        return images

    def __call__(self, outputs: Outputs, reference: Outputs) -> tuple[float, dict[str, Any]]:
        got = [d for batch in outputs for d in self.decode(batch)]
        truth = [d for batch in reference for d in self.decode(batch)]
        if len(got) != len(truth):
            raise EvaluationError(f"metric detection: {len(got)} candidate images but {len(truth)} reference images")
        if not any(len(d.scores) for d in truth):
            raise EvaluationError(
                f"metric detection: the FP32 reference detects nothing in any of the {len(truth)} evaluation images (score "
                f"threshold {self.options.score_threshold}), so the evaluation set cannot judge the model: any candidate, even "
                "one that outputs NaN or nothing, would score a perfect 1.0",
                hint="lower evaluation.detection.score_threshold, or evaluate on data with objects the FP32 model detects",
            )
        classes = sorted({int(c) for d in got + truth for c in d.classes})
        per_class: dict[int, float] = {}
        for cls in classes:
            scores, matched, positives = [], [], 0
            for candidate, expected in zip(got, truth):
                mine, theirs = candidate.classes == cls, expected.classes == cls
                positives += int(theirs.sum())
                boxes, box_scores = candidate.boxes[mine], candidate.scores[mine]
                hits = np.zeros(len(boxes), dtype=bool)
                if len(boxes) and theirs.any():
                    iou = box_iou(boxes, expected.boxes[theirs])
                    taken = np.zeros(iou.shape[1], dtype=bool)
                    for index in np.argsort(-box_scores, kind="stable"):
                        row = np.where(taken, -1.0, iou[index])
                        best = int(row.argmax())
                        if row[best] >= self.options.match_iou:
                            taken[best], hits[index] = True, True
                scores.append(box_scores)
                matched.append(hits)
            per_class[cls] = average_precision(np.concatenate(scores), np.concatenate(matched), positives)
        value = float(np.mean(list(per_class.values()))) if per_class else 1.0
        details = {
            "map_iou": self.options.match_iou,
            "classes": len(classes),
            "images": len(truth),
            "detections": int(sum(len(d.scores) for d in got)),
            "reference_detections": int(sum(len(d.scores) for d in truth)),
            "worst_class_ap": {str(c): round(ap, 6) for c, ap in sorted(per_class.items(), key=lambda item: item[1])[:5]},
        }
        return value, details


# ---------------------------------------------------------------- segmentation


class SegmentationMetric:
    """Mean IoU over classes of the candidate's masks against the reference's (intersections and unions summed over all images)."""

    def __init__(self, options: SegmentationOptions, output: str) -> None:
        self.options = options
        self.output = output
        self.outputs = (output,)

    def masks(self, array: np.ndarray) -> np.ndarray:
        if self.options.threshold is not None:
            return (array > self.options.threshold).astype(np.int64)
        try:
            return np.asarray(np.asarray(array).argmax(axis=self.options.class_axis))
        except np.exceptions.AxisError:
            raise EvaluationError(f"metric segmentation: evaluation.segmentation.class_axis {self.options.class_axis} is outside output "
                                  f"'{self.output}' of shape {list(array.shape)}", hint="set class_axis, or threshold for one-channel masks") from None

    def _foreground(self, masks: np.ndarray) -> np.ndarray:
        """Pixels of a scored class: not in ``ignore_classes``, and with a threshold not the background 0 either."""
        scored = ~np.isin(masks, list(self.options.ignore_classes))
        return scored & (masks != 0) if self.options.threshold is not None else scored

    def _foreground_text(self) -> str:
        ignored = f"ignoring classes {list(self.options.ignore_classes)}" if self.options.ignore_classes else ""
        if self.options.threshold is not None:
            return f"no value above the threshold {self.options.threshold}" + (f", {ignored}" if ignored else "")
        return ignored or "every class"

    def __call__(self, outputs: Outputs, reference: Outputs) -> tuple[float, dict[str, Any]]:
        intersections: dict[int, int] = {}
        unions: dict[int, int] = {}
        agree = total = foreground = 0
        for got_batch, ref_batch in zip(outputs, reference):
            got, ref = self.masks(_output(got_batch, self.output, "segmentation")), self.masks(_output(ref_batch, self.output, "segmentation"))
            if got.shape != ref.shape:
                raise EvaluationError(f"metric segmentation: candidate masks of '{self.output}' have shape {list(got.shape)}, reference {list(ref.shape)}")
            agree += int((got == ref).sum())
            total += got.size
            foreground += int(self._foreground(ref).sum())
            for cls in np.union1d(np.unique(got), np.unique(ref)):
                a, b = got == cls, ref == cls
                intersections[int(cls)] = intersections.get(int(cls), 0) + int((a & b).sum())
                unions[int(cls)] = unions.get(int(cls), 0) + int((a | b).sum())
        if not foreground:
            raise EvaluationError(
                f"metric segmentation: the FP32 reference's masks of '{self.output}' have no foreground pixels "
                f"({self._foreground_text()}) in the evaluation set, so it cannot judge the model: any candidate, even one "
                "that outputs NaN or nothing, would score a perfect IoU",
                hint=("lower evaluation.segmentation.threshold, or " if self.options.threshold is not None else "")
                + "evaluate on data where the FP32 model finds foreground",
            )
        ious = {cls: intersections[cls] / unions[cls] for cls in unions if unions[cls] and cls not in self.options.ignore_classes}
        value = float(np.mean(list(ious.values()))) if ious else 1.0
        worst = sorted(ious.items(), key=lambda item: item[1])[:5]
        return value, {"classes": len(ious), "pixel_agreement": agree / max(total, 1), "worst_class_iou": {str(c): round(v, 6) for c, v in worst}}


# ---------------------------------------------------------------- CTC text


def ctc_greedy(logits: np.ndarray, blank: int, time_axis: int = 1, class_axis: int = -1) -> list[tuple[int, ...]]:
    """Greedy CTC decoding of a [batch, time, classes] array (axes as given): best class per step,
    repeats collapsed, blanks removed; one tuple of class indices per line."""
    array = np.asarray(logits)
    if array.ndim != 3:
        raise EvaluationError(f"metric ctc_text: the output has shape {list(array.shape)}; CTC decoding needs 3 axes (batch, time, classes)")
    time_axis, class_axis = time_axis % 3, class_axis % 3
    if time_axis == class_axis:
        raise EvaluationError(f"metric ctc_text: time_axis and class_axis are both axis {time_axis}")
    batch_axis = ({0, 1, 2} - {time_axis, class_axis}).pop()
    best = np.transpose(array, (batch_axis, time_axis, class_axis)).argmax(axis=2)
    lines = []
    for row in best:
        changed = np.concatenate([[True], row[1:] != row[:-1]])
        lines.append(tuple(int(t) for t in row[changed & (row != blank)]))
    return lines


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each cost 1)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


class CtcTextMetric:
    """Character error rate (edit distance / reference characters) and exact line agreement of greedy CTC text."""

    def __init__(self, options: CtcTextOptions, output: str) -> None:
        self.options = options
        self.output = output
        self.outputs = (output,)

    def lines(self, batch: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
        o = self.options
        return ctc_greedy(_output(batch, self.output, "ctc_text"), o.blank, o.time_axis, o.class_axis)

    def __call__(self, outputs: Outputs, reference: Outputs) -> tuple[float, dict[str, Any]]:
        got = [line for batch in outputs for line in self.lines(batch)]
        truth = [line for batch in reference for line in self.lines(batch)]
        errors = sum(edit_distance(g, t) for g, t in zip(got, truth))
        characters = sum(len(t) for t in truth)
        cer = errors / characters if characters else float(errors > 0)
        agreement = sum(g == t for g, t in zip(got, truth)) / max(len(truth), 1)
        details = {"cer": cer, "line_agreement": agreement, "lines": len(truth), "reference_characters": characters}
        return (cer if self.options.report == "cer" else agreement), details


# ---------------------------------------------------------------- binary decisions


#: Below this share of positive decisions in FP32's outputs, agreement over all decisions hides lost positives:
#: the build log recommends ``report: f1`` (a face-proposal heatmap scored 0.9986 agreement while 18 % of its
#: proposals were lost).
RARE_POSITIVE_RATE = 0.10


def positive_set_scores(tp: int, fp: int, fn: int) -> tuple[float, float]:
    """(F1, IoU) of the candidate's positive decisions against the reference's. With no positive in the reference
    (``tp + fn == 0``) there is nothing to find: an EvaluationError says the evaluation set cannot judge the model."""
    if tp + fn == 0:
        raise EvaluationError(
            f"metric binary_decision: the FP32 reference has no positive decision in the evaluation set ({fp} candidate "
            "positives), so it cannot judge the model: any candidate, even one that outputs NaN, would score a perfect F1",
            hint="lower evaluation.binary_decision.threshold, or evaluate on data where the FP32 model decides positive",
        )
    return 2 * tp / (2 * tp + fp + fn), tp / (tp + fp + fn)


class BinaryDecisionMetric:
    """Decisions (output > threshold) against the reference's: the agreement of all of them, or the F1 / IoU of the
    positive set (``report``)."""

    def __init__(self, options: BinaryDecisionOptions, output: str) -> None:
        self.options = options
        self.output = output
        self.outputs = (output,)

    def __call__(self, outputs: Outputs, reference: Outputs) -> tuple[float, dict[str, Any]]:
        agree = total = tp = fp = fn = 0
        for got_batch, ref_batch in zip(outputs, reference):
            got = _output(got_batch, self.output, "binary_decision") > self.options.threshold
            ref = _output(ref_batch, self.output, "binary_decision") > self.options.threshold
            if got.shape != ref.shape:
                raise EvaluationError(f"metric binary_decision: candidate '{self.output}' has shape {list(got.shape)}, reference {list(ref.shape)}")
            agree += int((got == ref).sum())
            total += got.size
            tp += int((got & ref).sum())
            fp += int((got & ~ref).sum())
            fn += int((~got & ref).sum())
        if tp + fn == 0 and self.options.report == "agreement":
            f1 = iou = None  # nothing to find: agreement still counts the candidate's false positives (advice below)
        else:
            f1, iou = positive_set_scores(tp, fp, fn)
        agreement = agree / max(total, 1)
        positive_rate = (tp + fn) / max(total, 1)
        details: dict[str, Any] = {"threshold": self.options.threshold, "report": self.options.report, "decisions": total,
                                   "positives": tp + fp, "reference_positives": tp + fn, "positive_rate": positive_rate,
                                   "agreement": agreement, "f1": f1, "iou": iou}
        advice = rare_positive_advice(self.options, positive_rate, agreement, f1)
        if advice:
            details["advice"] = advice
        return {"agreement": agreement, "f1": f1, "iou": iou}[self.options.report], details


def rare_positive_advice(options: BinaryDecisionOptions, positive_rate: float, agreement: float,
                         f1: float | None) -> str | None:  # fmt: skip
    """What the build log says when the budget reads agreement over decisions that are mostly (or all) negative."""
    if options.report != "agreement" or positive_rate >= RARE_POSITIVE_RATE:
        return None
    if f1 is None:
        return (f"binary_decision: FP32 decides no positive in the evaluation set, so agreement ({agreement:.4f}) counts "
                "only the candidate's false positives, never a lost positive: evaluate on data where FP32 decides "
                "positive (or lower evaluation.binary_decision.threshold) to judge the positives")
    return (f"binary_decision: {positive_rate:.1%} of FP32's decisions are positive (under {RARE_POSITIVE_RATE:.0%}), so agreement "
            f"({agreement:.4f}) hides lost positives; F1 of the positives is {f1:.4f}: set evaluation.binary_decision.report: f1 "
            "(or iou) and budget it")


TaskMetric = Callable[[Outputs, Outputs], tuple[float, dict[str, Any]]]

#: metric name -> factory(evaluation spec, output name) of a task metric. Every entry has tests in tests/evaluate.
TASK_METRICS: dict[str, Callable[[EvaluationSpec, str], Any]] = {
    "detection": lambda spec, output: DetectionMetric(spec.detection),  # type: ignore[arg-type]  # required by the schema
    "segmentation": lambda spec, output: SegmentationMetric(spec.options, output),  # type: ignore[arg-type]
    "ctc_text": lambda spec, output: CtcTextMetric(spec.options, output),  # type: ignore[arg-type]
    "binary_decision": lambda spec, output: BinaryDecisionMetric(spec.options, output),  # type: ignore[arg-type]
}
