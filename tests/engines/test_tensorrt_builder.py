"""`edgekit build --backend tensorrt` on the host: the build-here-or-on-the-device decision (pure data,
no TensorRT needed), and the bundle files the builder writes on a host without TensorRT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.engines.tensorrt.builder import ENGINE_PATH, build_tensorrt, decide_engine_placement, gpu_model_token, write_bundle_onnx
from edgekit.engines.tensorrt.plan import plan_tensorrt_build
from edgekit.engines.tensorrt.version import HostGpu, HostProbe
from edgekit.errors import BuildError
from edgekit.precision import Backend, Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile
from edgekit_runtime.tensorrt_engines.plan import PLAN_PATH, TensorRTBuildPlan
from edgekit_runtime.tensorrt_engines.version import TensorRTVersion
from tests.engines.conftest import with_tensorrt_major

WEIGHT = np.random.default_rng(5).standard_normal((16, 3)).astype(np.float32)


def write_model(path: Path, *, qdq: bool = False) -> Path:
    """image float32[batch, 1, 4, 4] -> Flatten -> MatMul(16x3) -> logits; optionally Q/DQ on the input."""
    nodes, initializers, first = [], [numpy_helper.from_array(WEIGHT, "weight")], "image"
    if qdq:
        initializers += [numpy_helper.from_array(np.array(0.05, np.float32), "scale"), numpy_helper.from_array(np.array(0, np.int8), "zero")]
        nodes += [helper.make_node("QuantizeLinear", ["image", "scale", "zero"], ["image_q"]),
                  helper.make_node("DequantizeLinear", ["image_q", "scale", "zero"], ["image_dq"])]
        first = "image_dq"
    nodes += [helper.make_node("Flatten", [first], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "weight"], ["logits"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 4, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def host(name: str, cc: str, *, trt: str = "10.3.0.30", integrated: bool = False, sms: int = 16) -> HostProbe:
    return HostProbe(HostGpu(name, cc, sms, integrated, TensorRTVersion.parse(trt)))


@pytest.mark.parametrize(("name", "token"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("Orin", "orin"), ("NVIDIA GeForce RTX 4090", "4090"), ("NVIDIA Thor", "thor"),
    ("Tesla T4", "t4"), ("NVIDIA A100-SXM4-40GB", "a100"),
])
def test_gpu_model_token(name: str, token: str) -> None:
    assert gpu_model_token(name) == token


def test_placement_builds_on_a_matching_host(image_recipe: Recipe, h100: TargetProfile, agx_orin: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, h100, Precision.FP16)
    placement = decide_engine_placement(plan, h100, host("NVIDIA H100 80GB HBM3", "9.0", trt="10.13.0.35", sms=132))
    assert placement.where == "host"
    assert "this host's GPU 'NVIDIA H100 80GB HBM3' (compute capability 9.0, TensorRT 10.13.0.35) matches target 'nvidia-h100'" in placement.reason
    orin_plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16)
    assert decide_engine_placement(orin_plan, agx_orin, host("Orin", "8.7", integrated=True)).where == "host"


@pytest.mark.parametrize(("probe", "reason"), [
    (HostProbe(None, "TensorRT is not installed: `import tensorrt` failed"), "this host cannot build TensorRT engines (TensorRT is not installed"),
    (host("NVIDIA H100 80GB HBM3", "9.0", sms=132), "differs from target 'jetson-agx-orin-64gb' ('2048-core NVIDIA Ampere GPU with 64 Tensor Cores', compute capability 8.7, TensorRT 10) in compute capability"),
    (host("Orin", "8.7", trt="11.4.0", integrated=True), "in TensorRT major"),
    (host("NVIDIA RTX A2000 Embedded", "8.7"), "is a discrete GPU, target 'jetson-agx-orin-64gb'"),
    (host("NVIDIA Xavier", "8.7", integrated=True), "is not the GPU model of target 'jetson-agx-orin-64gb' ('2048-core"),
    (host("NVIDIA Xavier", "8.7", integrated=True), "TensorRT 10) ('xavier' is not in its names)"),
])
def test_placement_defers_to_the_device(image_recipe: Recipe, agx_orin: TargetProfile, probe: HostProbe, reason: str) -> None:
    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16)
    placement = decide_engine_placement(plan, agx_orin, probe)
    assert placement.where == "device"
    assert reason in placement.reason


def test_x86_host_without_tensorrt_writes_a_deferred_bundle(tmp_path: Path, image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    model = write_model(tmp_path / "exported.onnx")
    built = build_tensorrt(model, bundle / "model.onnx", agx_orin, image_recipe, Precision.FP16, prune={"sparse_2_4": True})
    assert built.backend is Backend.TENSORRT and built.model_path == bundle / "model.onnx"
    section = built.to_manifest(intra_op_threads=2)
    assert section["name"] == "tensorrt"
    trt = section["tensorrt"]
    assert (trt["api"], trt["tensorrt_major"], trt["network_typing"], trt["onnx_precision"]) == ("tensorrt10", 10, "weak", "as-exported")
    assert trt["engine"] is None and trt["engine_built_on"] == "device"
    assert trt["placement_reason"].startswith("this host cannot build TensorRT engines (TensorRT is not installed")
    plan = TensorRTBuildPlan.read(bundle / PLAN_PATH)
    assert trt["plan"] == PLAN_PATH and trt["plan_digest"] == plan.digest and plan.sparse_weights
    ep = trt["onnxruntime_tensorrt_ep"]
    assert ep["trt_fp16_enable"] is True and ep["trt_sparsity_enable"] is True
    assert ep["trt_engine_cache_path"] == f"ort-tensorrt-ep/plan-{plan.digest[:32]}"
    assert not (bundle / ENGINE_PATH).exists()
    json.dumps(section)  # the manifest section is JSON
    # The ONNX TensorRT will parse is the export itself (FP16 comes from the builder flag on TensorRT 10).
    image = np.random.default_rng(0).standard_normal((2, 1, 4, 4)).astype(np.float32)
    (logits,) = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"image": image})
    np.testing.assert_allclose(logits, image.reshape(2, 16) @ WEIGHT, rtol=1e-5, atol=1e-5)


def test_tensorrt11_fp16_casts_the_onnx_on_the_host(tmp_path: Path, image_recipe: Recipe, h100: TargetProfile) -> None:
    target = with_tensorrt_major(h100, 11)
    plan = plan_tensorrt_build(image_recipe, target, Precision.FP16)
    out = write_bundle_onnx(write_model(tmp_path / "exported.onnx"), tmp_path / "model.onnx", plan, image_recipe)
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # inputs and outputs kept
    assert {i.data_type for i in model.graph.initializer} == {TensorProto.FLOAT16}
    assert "Cast" in {n.op_type for n in model.graph.node}
    image = np.random.default_rng(1).standard_normal((3, 1, 4, 4)).astype(np.float32)
    (logits,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"image": image})
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, image.reshape(3, 16) @ WEIGHT, rtol=2e-2, atol=2e-2)


def test_qdq_precisions_need_qdq_nodes(tmp_path: Path, image_recipe: Recipe, orin_nano: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, orin_nano, Precision.INT8)
    with pytest.raises(BuildError) as caught:
        write_bundle_onnx(write_model(tmp_path / "fp32.onnx"), tmp_path / "model.onnx", plan, image_recipe)
    assert "exported.onnx" not in str(caught.value) and "fp32.onnx: the int8 TensorRT plan takes its precision from Q/DQ nodes" in str(caught.value)
    assert "run the quantize stage first" in str(caught.value) and "TensorRT 11 removed it" in str(caught.value)
    out = write_bundle_onnx(write_model(tmp_path / "qdq.onnx", qdq=True), tmp_path / "model.onnx", plan, image_recipe)
    assert [n.op_type for n in onnx.load(str(out)).graph.node][:2] == ["QuantizeLinear", "DequantizeLinear"]


def test_a_matching_host_would_build_here(tmp_path: Path, image_recipe: Recipe, h100: TargetProfile) -> None:
    """The builder asks build_engine for the engine when the probe matches; without TensorRT that call
    fails with the reason (no GPU here), which shows the host path is taken and reported."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    probe = host("NVIDIA H100 80GB HBM3", "9.0", trt="10.13.0.35", sms=132)
    with pytest.raises(BuildError) as caught:
        build_tensorrt(write_model(tmp_path / "m.onnx"), bundle / "model.onnx", h100, image_recipe, Precision.FP32,
                       cache_dir=tmp_path / "cache", probe=lambda: probe)
    assert "cannot build a TensorRT engine on this host: TensorRT is not installed" in str(caught.value)
