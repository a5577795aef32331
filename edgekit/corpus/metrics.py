"""Task metrics of the corpus, each against the FP32 model's own outputs (third-party models come with
no labels here): higher is better, 1.0 means the quantized model decides as FP32 does.

:func:`task_metric` scores with edgekit's own metrics (``edgekit.evaluate``) as the model's recipe
declares them (:attr:`CorpusModel.metric`); the runner uses it. :func:`cosine` is the extra column
beside it, and :func:`text_map_iou` DBNet's thresholded text-pixel IoU, a quick check the fp16 tests use.
"""

from __future__ import annotations

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


def text_map_iou(outputs: list[np.ndarray], reference: list[np.ndarray], threshold: float = 0.3) -> float:
    """IoU of the text pixels (probability > threshold, DBNet's binarisation) with FP32's."""
    inter = union = 0
    for out, ref in zip(outputs, reference):
        a, b = out > threshold, ref > threshold
        inter += int(np.logical_and(a, b).sum())
        union += int(np.logical_or(a, b).sum())
    return inter / union if union else 1.0
