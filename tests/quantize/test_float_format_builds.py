"""`edgekit build` with the floating-point formats for a Blackwell target (TensorRT, engine built on the device):
the bundle carries the written graph, the host evaluates its decoded twin and says so, and `edgekit bench`
refuses to time a graph this host's ONNX Runtime cannot run."""

from __future__ import annotations

import json

import onnx
import pytest

from edgekit.bench.compare import bench_bundle
from edgekit.errors import EdgekitError
from edgekit.pipeline import build
from tests.test_sweep import CALIBRATED


@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_build_for_thor_writes_the_format_and_evaluates_the_twin(tiny_recipe, tmp_path, precision):
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    result = build(recipe, "jetson-agx-thor", precision=precision, out=tmp_path / precision)
    manifest = result.manifest
    assert manifest["precision"] == precision and manifest["backend"]["name"] == "tensorrt"
    written = manifest["quantization"]["format"]
    assert written["format"] == precision and written["quantized_weights"] >= 1
    model = onnx.load(str(result.bundle_dir / "model.onnx"))
    element = onnx.TensorProto.FLOAT8E4M3FN if precision == "fp8" else onnx.TensorProto.FLOAT4E2M1
    assert any(i.data_type == element for i in model.graph.initializer)
    assert "twin" in manifest["accuracy"]["note"] and "twin" in manifest["quantization"]["host_evaluation"]
    assert manifest["accuracy"]["passed"] is True
    if precision == "fp8":
        assert manifest["quantization"]["calibration"]["tensors"] >= 2  # the Conv and Linear inputs
    assert json.loads((result.bundle_dir / "manifest.json").read_text())["files"]["model.onnx"] == manifest["model"]["sha256"]
    with pytest.raises(EdgekitError, match=rf"a {precision} bundle holds weights ONNX Runtime's CPU provider cannot run"):
        bench_bundle(result.bundle_dir, iterations=2, warmup=0)
