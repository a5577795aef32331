"""The report's estimate section says how the estimate was made (review: it said "a per-node roofline over the ONNX
graph" for a TensorRT target's per-layer estimate too)."""

from __future__ import annotations

import re

import pytest

from edgekit.estimate.estimate import estimate
from edgekit.report.html import render_report
from edgekit.target import get_target
from tests.estimate.graphs import mlp


def _note(target: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> str:
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path))  # no default calibration file from ~/.cache
    page = render_report({}, None, None, estimate=estimate(mlp(64), get_target(target), dims={"batch": 8}))
    section = page[page.index('<section id="estimate">'):]
    return re.search(r'<p class="note">(.*?) \(<code>', section, re.S).group(1)


def test_a_tensorrt_estimate_is_described_per_layer(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert _note("jetson-orin-nano-8gb", monkeypatch, tmp_path) == (
        "An ESTIMATE, not a measurement: a per-layer roofline over the graph fused as TensorRT fuses it (conv / GEMM "
        "epilogues, pointwise chains, attention), at the benchmark shape, with efficiency factors per layer class and a "
        "launch cost per layer")


def test_a_per_node_estimate_is_described_per_node(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert _note("raspberry-pi-5", monkeypatch, tmp_path) == (
        "An ESTIMATE, not a measurement: a per-node roofline over the ONNX graph at the benchmark shape with efficiency "
        "factors per node class")
