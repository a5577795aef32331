"""Task metrics of the corpus, each against the FP32 model's own outputs (third-party models come with
no labels here): higher is better, 1.0 means the quantized model decides as FP32 does.

:func:`task_metric` scores with edgekit's own metrics (``edgekit.evaluate``) as the model's recipe
declares them (:attr:`CorpusModel.metric`); the runner uses it. The private metrics below it predate
those; nothing in the corpus calls them any more (only their own test), so they can go.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from edgekit.corpus.base import CorpusModel


def evaluation_spec(model: CorpusModel) -> "EvaluationSpec":  # noqa: F821
    """The model's ``evaluation`` section as edgekit's schema reads it (budget: ``model.min_value``)."""
    from edgekit.recipe import EvaluationSpec

    return EvaluationSpec.model_validate({"output": model.output, **model.metric, "budget": {"min_value": model.min_value}})


def task_metric(model: CorpusModel, outputs: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]) -> tuple[float, dict]:
    """The model's task metric of ``outputs`` (one dict of outputs per evaluation batch) against FP32's
    ``reference``, computed by edgekit's built-in metrics exactly as a build's evaluation does; top1 reads
    the evaluation batches' ``labels`` (FP32's arg-max)."""
    from edgekit.evaluate.metrics import METRICS
    from edgekit.evaluate.task_metrics import TASK_METRICS as BUILT_IN

    spec = evaluation_spec(model)
    output = spec.output or model.output
    if spec.metric in BUILT_IN:
        return BUILT_IN[spec.metric](spec, output)(outputs, reference)
    labels = [batch.get(spec.labels) for batch in model.evaluation]
    return float(METRICS[spec.metric]([o[output] for o in outputs], [r[output] for r in reference], labels)), {}


def cosine(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Mean cosine similarity per sample (first axis), over all batches."""
    values = []
    for out, ref in zip(outputs, reference):
        a = out.reshape(out.shape[0], -1).astype(np.float64)
        b = ref.reshape(ref.shape[0], -1).astype(np.float64)
        values.extend((a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12))
    return float(np.mean(values))


def decision_agreement(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Fraction of samples whose decision matches FP32's: the arg-max class over the last axis, or for a
    single probability (last axis of 1, a VAD's speech score) whether it is over 0.5."""
    same = [(out > 0.5) == (ref > 0.5) if out.shape[-1] == 1 else out.argmax(-1) == ref.argmax(-1) for out, ref in zip(outputs, reference)]
    return float(np.mean(np.concatenate([s.ravel() for s in same])))


def text_map_iou(outputs: list[np.ndarray], reference: list[np.ndarray], threshold: float = 0.3) -> float:
    """IoU of the text pixels (probability > threshold, DBNet's binarisation) with FP32's."""
    inter = union = 0
    for out, ref in zip(outputs, reference):
        a, b = out > threshold, ref > threshold
        inter += int(np.logical_and(a, b).sum())
        union += int(np.logical_or(a, b).sum())
    return inter / union if union else 1.0


def ctc_greedy(probabilities: np.ndarray, blank: int = 0) -> list[tuple[int, ...]]:
    """Greedy CTC decoding of (batch, time, classes): arg-max, repeats collapsed, blanks dropped."""
    decoded = []
    for row in probabilities.argmax(-1):
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        decoded.append(tuple(int(t) for t in row[keep] if t != blank))
    return decoded


def _edit_distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def ctc_text_agreement(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """1 - character error rate of the greedy CTC transcripts against FP32's."""
    errors = length = 0
    for out, ref in zip(outputs, reference):
        for got, want in zip(ctc_greedy(out), ctc_greedy(ref)):
            errors += _edit_distance(got, want)
            length += max(len(want), 1)
    return 1.0 - errors / length if length else 1.0


def _box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of (cx, cy, w, h) boxes, elementwise over the leading axes."""
    def corners(box: np.ndarray) -> tuple[np.ndarray, ...]:
        return box[..., 0] - box[..., 2] / 2, box[..., 1] - box[..., 3] / 2, box[..., 0] + box[..., 2] / 2, box[..., 1] + box[..., 3] / 2

    ax0, ay0, ax1, ay1 = corners(a)
    bx0, by0, bx1, by1 = corners(b)
    inter = np.clip(np.minimum(ax1, bx1) - np.maximum(ax0, bx0), 0, None) * np.clip(np.minimum(ay1, by1) - np.maximum(ay0, by0), 0, None)
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 1.0)


def detection_agreement(outputs: list[np.ndarray], reference: list[np.ndarray], iou: float = 0.9) -> float:
    """Fraction of detections ([..., 4 box (cx, cy, w, h) + class scores]) whose class matches FP32's and
    whose box overlaps FP32's with IoU >= ``iou``."""
    hits = []
    for out, ref in zip(outputs, reference):
        same_class = out[..., 4:].argmax(-1) == ref[..., 4:].argmax(-1)
        hits.append((same_class & (_box_iou(out[..., :4], ref[..., :4]) >= iou)).ravel())
    return float(np.mean(np.concatenate(hits)))


#: task -> (metric name, metric)
TASK_METRICS: dict[str, tuple[str, Callable[[list[np.ndarray], list[np.ndarray]], float]]] = {
    "text_map": ("text-pixel IoU", text_map_iou),
    "ctc_text": ("1 - CER", ctc_text_agreement),
    "binary_decision": ("decision agreement", decision_agreement),
    "classification": ("top-1 agreement", decision_agreement),
    "detection": ("class + box IoU>=0.9 agreement", detection_agreement),
    "embedding": ("cosine", cosine),
}
