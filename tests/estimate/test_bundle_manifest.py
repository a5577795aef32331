"""A damaged bundle manifest is an EstimateError naming the file and field (review: a manifest that is not an object,
or a benchmark.shape that is a list or holds "eight", gave a Python traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from edgekit.estimate.estimate import bundle_input
from edgekit.estimate.graph_cost import EstimateError
from tests.estimate.graphs import mlp


def _bundle(tmp_path: Path, manifest: Any) -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    onnx.save(mlp(8), str(tmp_path / "model.onnx"))
    return tmp_path


@pytest.mark.parametrize("manifest, problem", [
    ([1, 2], "not a bundle manifest (a list, not an object)"),
    ({"benchmark": {}}, "model.path must name the bundle's ONNX file"),
    ({"model": "model.onnx"}, "model.path must name the bundle's ONNX file"),
    ({"model": {"path": "model.onnx"}, "benchmark": {"shape": [1, 2]}}, 'benchmark.shape must map dim names to sizes, e.g. {"batch": 8}'),
    ({"model": {"path": "model.onnx"}, "benchmark": {"shape": {"batch": "eight"}}}, "benchmark.shape.batch must be a whole number >= 1, not 'eight'"),
    ({"model": {"path": "model.onnx"}, "benchmark": {"shape": {"batch": 0}}}, "benchmark.shape.batch must be a whole number >= 1, not 0"),
    ({"model": {"path": "model.onnx"}, "benchmark": {"batch": "8"}}, "benchmark.batch must be a whole number >= 1, not '8'"),
    ({"model": {"path": "model.onnx"}, "benchmark": {"p50_ms": "fast"}}, "benchmark.p50_ms must be a number of milliseconds, not 'fast'"),
])  # fmt: skip
def test_a_malformed_manifest_names_the_file_and_field(tmp_path: Path, manifest: Any, problem: str) -> None:
    bundle = _bundle(tmp_path, manifest)
    with pytest.raises(EstimateError) as caught:
        bundle_input(bundle)
    assert str(caught.value).startswith(f"{bundle / 'manifest.json'}: {problem}")
    assert "edgekit build" in caught.value.hint


def test_a_well_formed_manifest_gives_the_benchmark_shape(tmp_path: Path) -> None:
    found = bundle_input(_bundle(tmp_path, {"model": {"path": "model.onnx"}, "benchmark": {"shape": {"batch": 8}, "batch": 8, "p50_ms": 1.5}}))
    assert (found.model_path, found.dims, found.batch, found.measured_p50_ms) == (tmp_path / "model.onnx", {"batch": 8}, 8, 1.5)
