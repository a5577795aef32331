"""ONNX Runtime on the GPU: TensorRT/CUDA execution-provider options derived from a build plan, with the
TensorRT EP's caches keyed like edgekit's engines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import pytest

from edgekit.engines.tensorrt.plan import TensorRTOptions, plan_tensorrt_build
from edgekit.precision import Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile
from edgekit_runtime.backends.onnxruntime import ExecutionProviderConfig, OnnxRuntimeRunner
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.tensorrt_engines.cache import DeviceIdentity, EngineCache, EngineCacheKey, TimingCacheKey
from edgekit_runtime.tensorrt_engines.ep_options import gpu_execution_providers, tensorrt_ep_options
from edgekit_runtime.tensorrt_engines.plan import TimingCachePolicy
from tests.engines.conftest import STATIC_RECIPE, TEXT_RECIPE, with_tensorrt_major


def test_fp16_plan(image_recipe: Recipe, agx_orin: TargetProfile, tmp_path: Path) -> None:
    options = tensorrt_ep_options(plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16), tmp_path)
    assert options["trt_fp16_enable"] is True and options["trt_int8_enable"] is False
    assert options["trt_max_workspace_size"] == 4096 << 20 and options["trt_builder_optimization_level"] == 3
    assert options["trt_engine_cache_enable"] is True and options["trt_timing_cache_enable"] is True
    assert options["trt_dla_enable"] is False and "trt_dla_core" not in options
    assert options["trt_profile_min_shapes"] == "image:1x1x4x4"
    assert options["trt_profile_opt_shapes"] == "image:4x1x4x4" and options["trt_profile_max_shapes"] == "image:8x1x4x4"


def test_int8_on_dla(image_recipe: Recipe, agx_orin: TargetProfile, tmp_path: Path) -> None:
    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.INT8, options=TensorRTOptions(dla_core=1))
    options = tensorrt_ep_options(plan, tmp_path)
    assert options["trt_int8_enable"] is True and options["trt_fp16_enable"] is False
    assert options["trt_int8_use_native_calibration_table"] is False
    assert (options["trt_dla_enable"], options["trt_dla_core"]) == (True, 1)


def test_strongly_typed_plans_set_no_precision_flags(image_recipe: Recipe, h100: TargetProfile, thor: TargetProfile, tmp_path: Path) -> None:
    fp16_11 = tensorrt_ep_options(plan_tensorrt_build(image_recipe, with_tensorrt_major(h100, 11), Precision.FP16), tmp_path)
    assert fp16_11["trt_fp16_enable"] is False  # the ONNX itself is FP16
    int8_11 = tensorrt_ep_options(plan_tensorrt_build(image_recipe, with_tensorrt_major(h100, 11), Precision.INT8), tmp_path)
    assert int8_11["trt_int8_enable"] is True  # Q/DQ int8 still needs INT8 kernels allowed in the EP
    assert tensorrt_ep_options(plan_tensorrt_build(image_recipe, thor, Precision.BF16), tmp_path)["trt_bf16_enable"] is True


def test_multi_input_profiles_and_static_shapes(write_recipe: Callable[[str], Recipe], h100: TargetProfile, tmp_path: Path) -> None:
    text = tensorrt_ep_options(plan_tensorrt_build(write_recipe(TEXT_RECIPE), h100, Precision.FP16), tmp_path)
    assert text["trt_profile_max_shapes"] == "input_ids:32x256,attention_mask:32x256"
    static = tensorrt_ep_options(plan_tensorrt_build(write_recipe(STATIC_RECIPE, "static.yaml"), h100, Precision.FP32), tmp_path)
    assert not any(name.startswith("trt_profile_") for name in static)


def test_caches_are_keyed_like_engines(image_recipe: Recipe, agx_orin: TargetProfile, tmp_path: Path) -> None:
    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16, options=TensorRTOptions(timing_cache=TimingCachePolicy.OFF))
    device = DeviceIdentity.from_cuda("Orin", "8.7", 16, "10.3.0")
    key = EngineCacheKey.for_device("a" * 64, plan.digest, device)
    options = tensorrt_ep_options(plan, tmp_path, key=key, device_id=1)
    assert options["trt_engine_cache_path"] == str(EngineCache(tmp_path).ort_tensorrt_ep_dir(key))
    assert options["trt_timing_cache_path"].endswith(f"timing-{TimingCacheKey.for_device(device).digest[:32]}")
    assert options["trt_timing_cache_enable"] is False and options["device_id"] == 1
    newer = EngineCacheKey.for_device("a" * 64, plan.digest, DeviceIdentity.from_cuda("Orin", "8.7", 16, "10.7.0"))
    assert tensorrt_ep_options(plan, tmp_path, key=newer)["trt_engine_cache_path"] != options["trt_engine_cache_path"]


def test_gpu_providers_become_onnxruntime_options(image_recipe: Recipe, agx_orin: TargetProfile, tmp_path: Path) -> None:
    providers = gpu_execution_providers(plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16), tmp_path)
    assert [p["name"] for p in providers] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    parsed = ExecutionProviderConfig.parse(providers[0], where="execution_providers[0]").ort_options()
    assert parsed["trt_fp16_enable"] == "1" and parsed["trt_dla_enable"] == "0"
    assert all(isinstance(value, str) for value in parsed.values())


def test_the_runner_refuses_a_tensorrt_ep_that_cannot_load(image_recipe: Recipe, agx_orin: TargetProfile, tmp_path: Path) -> None:
    """On this CPU-only onnxruntime the TensorRT EP is not built in: an error, never a silent CPU fallback."""
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the TensorRT EP built in; the test needs a CPU-only install")
    from tests.engines.test_tensorrt_builder import write_model

    signature = IOSignature.from_manifest({"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 4, 4]}],
                                           "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 3]}],
                                           "dims": {"batch": {"min": 1, "opt": 4, "max": 8}}})
    providers = gpu_execution_providers(plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16), tmp_path)
    runner = OnnxRuntimeRunner(write_model(tmp_path / "m.onnx"), signature, execution_providers=providers)
    with pytest.raises(BackendError, match="execution provider 'TensorrtExecutionProvider' is not in the installed onnxruntime"):
        runner.load()
