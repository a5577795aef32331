"""Metrics, by name. Each takes the model's outputs for one output name over all evaluation batches,
the FP32 reference outputs, and the batches (for labels), and returns one number."""

from __future__ import annotations

from typing import Callable

import numpy as np

from edgekit.errors import EvaluationError
from edgekit.export.parity import row_cosines

Metric = Callable[[list[np.ndarray], list[np.ndarray], list[np.ndarray | None]], float]


def top1(outputs: list[np.ndarray], reference: list[np.ndarray], labels: list[np.ndarray | None]) -> float:
    """Fraction of rows whose arg-max over the last axis equals the label."""
    correct = total = 0
    for out, label in zip(outputs, labels):
        if label is None:
            raise EvaluationError("metric top1 needs labels in every evaluation batch", hint="return a 'labels' array with each batch (or set evaluation.labels)")
        predicted = out.reshape(out.shape[0], -1).argmax(axis=1) if out.ndim > 2 else out.argmax(axis=-1)
        if predicted.shape != label.reshape(-1).shape:
            raise EvaluationError(f"metric top1: {predicted.shape[0]} predictions but labels of shape {list(label.shape)}")
        correct += int((predicted == label.reshape(-1)).sum())
        total += predicted.shape[0]
    return correct / max(total, 1)


def cosine(outputs: list[np.ndarray], reference: list[np.ndarray], labels: list[np.ndarray | None]) -> float:
    """Mean cosine similarity to the reference, per row."""
    return float(np.concatenate([row_cosines(r, o) for o, r in zip(outputs, reference)]).mean())


def cosine_min(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    return float(np.concatenate([row_cosines(r, o) for o, r in zip(outputs, reference)]).min())


def mse(outputs: list[np.ndarray], reference: list[np.ndarray], labels: list[np.ndarray | None]) -> float:
    """Mean squared error to the reference."""
    total = sum(float(np.square(o.astype(np.float64) - r.astype(np.float64)).sum()) for o, r in zip(outputs, reference))
    count = sum(o.size for o in outputs)
    return total / max(count, 1)


#: metric name -> implementation ("callable" is resolved from the recipe).
METRICS: dict[str, Metric] = {"top1": top1, "cosine": cosine, "mse": mse}
