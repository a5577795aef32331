"""Accuracy of a built model against the FP32 reference: metrics (a registry) and the budget check."""

from edgekit.evaluate.accuracy import AccuracyResult, check_budget, evaluate_accuracy
from edgekit.evaluate.metrics import METRICS

__all__ = ["METRICS", "AccuracyResult", "check_budget", "evaluate_accuracy"]
