"""A TensorRT bundle whose precision TensorRT applies through builder flags (fp16, bf16) ships the FP32 ONNX graph:
what this host measured on it is the FP32 graph's, and the report says so (review: the card read 'FP16 vs FP32 max |diff|
3.81e-06' and the accuracy section hid the build's note and a metric's advice)."""

from __future__ import annotations

import copy
from typing import Any

from edgekit.report import render_report
from tests.report.test_report import _parse, _visible_text
from tests.report.test_report_details import _manifest

NOTE = ("measured with ONNX Runtime on this host on the bundle's FP32 graph: TensorRT applies fp16 through builder flags on "
        "the device, so the device's accuracy can differ")
ADVICE = "binary_decision: 1.0% of FP32's decisions are positive: set evaluation.binary_decision.report: f1"


def _trt_manifest(onnx_precision: str = "as-exported", precision: str = "fp16") -> dict[str, Any]:
    manifest = copy.deepcopy(_manifest(precision=precision))
    manifest["backend"] = {"name": "tensorrt", "tensorrt": {"onnx_precision": onnx_precision}}
    manifest["golden"] = {"outputs": {"logits": {"measured": {"max_abs_diff": 3.81e-06, "cosine_min": 0.9999}}}}
    manifest["accuracy"]["note"] = NOTE
    manifest["accuracy"]["details"] = {"advice": ADVICE}
    return manifest


def test_accuracy_section_shows_the_builds_note_and_advice() -> None:
    text = _visible_text(_parse(render_report(_trt_manifest(), None, None)))
    section = text[text.index("Accuracy against the reference"):text.index("Benchmark on")]
    assert f"What was measured: {NOTE}" in section
    assert f"Advice: {ADVICE}" in section


def test_card_titles_the_fp32_graph_when_tensorrt_applies_the_precision() -> None:
    text = _visible_text(_parse(render_report(_trt_manifest(), None, None)))
    assert "Host FP32 graph vs FP32 max |diff| 3.81e-06" in text
    assert "the device applies FP16 through TensorRT builder flags, so its own deviation is not measured here" in text
    assert "FP16 vs FP32 max |diff|" not in text
    assert "the host FP32 graph's, not the device's fp16" in text  # the accuracy card
    written = _visible_text(_parse(render_report(_trt_manifest(onnx_precision="fp16"), None, None)))  # the graph is FP16
    assert "FP16 vs FP32 max |diff| 3.81e-06" in written and "Host FP32 graph" not in written
