"""Plan translation: recipe + target + precision + prune report -> TensorRTBuildPlan, for the shipped
Jetson Orin, Jetson Thor and H100 profiles, and a TensorRT 11 variant of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit.engines.tensorrt.plan import TENSORRT10, TENSORRT11, TensorRTOptions, plan_tensorrt_build
from edgekit.errors import BuildError, TargetError
from edgekit.precision import Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile, get_target
from edgekit_runtime.tensorrt_engines.plan import (
    NetworkTyping,
    OnnxPrecision,
    PlanError,
    TensorRTBuildPlan,
    TimingCachePolicy,
)
from tests.engines.conftest import STATIC_RECIPE, TEXT_RECIPE, with_tensorrt_major


def test_orin_fp16_is_weakly_typed_with_the_fp16_flag(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16)
    assert (plan.api, plan.tensorrt_major) == ("tensorrt10", 10)
    assert plan.network_typing is NetworkTyping.WEAK
    assert plan.builder_flags == ("FP16",)
    assert plan.onnx_precision is OnnxPrecision.AS_EXPORTED
    assert (plan.target, plan.compute_capability) == ("jetson-agx-orin-64gb", "8.7")
    assert plan.workspace_mb == 4096 and plan.workspace_bytes == 4096 << 20
    assert plan.dla is None and not plan.sparse_weights
    assert plan.timing_cache is TimingCachePolicy.SHARED and plan.builder_optimization_level == 3


def test_orin_int8_takes_its_precision_from_qdq(image_recipe: Recipe, orin_nano: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, orin_nano, Precision.INT8)
    assert plan.builder_flags == ("INT8",)
    assert plan.onnx_precision is OnnxPrecision.QDQ
    assert any("symmetric Q/DQ" in note for note in plan.notes)


def test_orin_has_no_fp8(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    with pytest.raises(BuildError) as caught:
        plan_tensorrt_build(image_recipe, agx_orin, Precision.FP8)
    assert "precision fp8 cannot be built with TensorRT for target 'jetson-agx-orin-64gb'" in str(caught.value)
    assert "compute capability >= 8.9; this GPU is 8.7 (ampere)" in str(caught.value)
    assert "edgekit targets show jetson-agx-orin-64gb" in str(caught.value)


def test_dla_on_agx_orin(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.INT8, options=TensorRTOptions(dla_core=1, gpu_fallback=False))
    assert plan.dla is not None and (plan.dla.core, plan.dla.gpu_fallback) == (1, False)
    with pytest.raises(BuildError, match=r"build.tensorrt.dla_core: 2 is not a DLA core of target 'jetson-agx-orin-64gb' \(it has 2: 0..1\)"):
        plan_tensorrt_build(image_recipe, agx_orin, Precision.INT8, options=TensorRTOptions(dla_core=2))


def test_dla_runs_only_fp16_and_int8(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    with pytest.raises(BuildError) as caught:
        plan_tensorrt_build(image_recipe, agx_orin, Precision.FP32, options=TensorRTOptions(dla_core=0))
    assert "precision fp32 cannot be built with TensorRT for target 'jetson-agx-orin-64gb': DLA runs only fp16 and int8" in str(caught.value)


def test_dla_on_a_target_without_dla(image_recipe: Recipe, orin_nano: TargetProfile, thor: TargetProfile) -> None:
    for target in (orin_nano, thor):
        with pytest.raises(BuildError) as caught:
            plan_tensorrt_build(image_recipe, target, Precision.FP16, options=TensorRTOptions(dla_core=0))
        assert f"build.tensorrt.dla_core: 0 asks for DLA, but target '{target.name}' has no DLA cores" in str(caught.value)
        assert "leave dla_core out" in str(caught.value)


@pytest.mark.parametrize(("precision", "flags", "typing"), [
    (Precision.FP8, ("FP8",), NetworkTyping.WEAK),
    (Precision.NVFP4, (), NetworkTyping.STRONG),
    (Precision.MXFP8, (), NetworkTyping.STRONG),
    (Precision.MXFP4, (), NetworkTyping.STRONG),
    (Precision.BF16, ("BF16",), NetworkTyping.WEAK),
])
def test_thor_fp8_and_fp4(image_recipe: Recipe, thor: TargetProfile, precision: Precision, flags: tuple[str, ...],
                          typing: NetworkTyping) -> None:
    plan = plan_tensorrt_build(image_recipe, thor, precision)
    assert plan.builder_flags == flags and plan.network_typing is typing
    assert plan.compute_capability == "11.0" and plan.dla is None
    assert plan.onnx_precision is (OnnxPrecision.AS_EXPORTED if precision is Precision.BF16 else OnnxPrecision.QDQ)


def test_h100_runs_fp8_but_not_fp4(image_recipe: Recipe, h100: TargetProfile) -> None:
    assert plan_tensorrt_build(image_recipe, h100, Precision.FP8).builder_flags == ("FP8",)
    with pytest.raises(BuildError, match=r"nvfp4 needs compute capability >= 10.0; this GPU is 9.0 \(hopper\)"):
        plan_tensorrt_build(image_recipe, h100, Precision.NVFP4)
    assert plan_tensorrt_build(image_recipe, h100, Precision.FP32).workspace_mb == 8192


def test_tensorrt11_is_strongly_typed_and_casts_fp16_on_the_host(image_recipe: Recipe, h100: TargetProfile) -> None:
    target = with_tensorrt_major(h100, 11)
    fp16 = plan_tensorrt_build(image_recipe, target, Precision.FP16)
    assert (fp16.api, fp16.network_typing, fp16.builder_flags) == ("tensorrt11", NetworkTyping.STRONG, ())
    assert fp16.onnx_precision is OnnxPrecision.FP16_CAST
    for precision in (Precision.INT8, Precision.FP8, Precision.INT4):
        plan = plan_tensorrt_build(image_recipe, target, precision)
        assert (plan.network_typing, plan.builder_flags, plan.onnx_precision) == (NetworkTyping.STRONG, (), OnnxPrecision.QDQ)
    with pytest.raises(BuildError, match="precision bf16 has no TensorRT 11 expression in edgekit .*no host-side BF16 cast"):
        plan_tensorrt_build(image_recipe, target, Precision.BF16)


def test_every_precision_table_entry_is_planned(image_recipe: Recipe, thor: TargetProfile, h100: TargetProfile) -> None:
    """Each row of TENSORRT10 and TENSORRT11 produces a plan on a target that can run it."""
    for table, major in ((TENSORRT10, 10), (TENSORRT11, 11)):
        for precision, (typing, flags, onnx_precision) in table.items():
            target = with_tensorrt_major(thor, major)
            plan = plan_tensorrt_build(image_recipe, target, precision)
            assert (plan.network_typing, plan.builder_flags, plan.onnx_precision) == (typing, flags, onnx_precision), precision


def test_dla_is_refused_for_tensorrt11(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    with pytest.raises(BuildError, match="runs TensorRT 11, and edgekit supports DLA with TensorRT 10 only"):
        plan_tensorrt_build(image_recipe, with_tensorrt_major(agx_orin, 11), Precision.FP16, options=TensorRTOptions(dla_core=0))


def test_old_or_missing_tensorrt_major(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    with pytest.raises(BuildError) as caught:
        plan_tensorrt_build(image_recipe, with_tensorrt_major(agx_orin, 8), Precision.FP16)
    assert "target 'jetson-agx-orin-64gb': software.tensorrt_major 8: TensorRT 8.x is not supported" in str(caught.value)
    assert "JetPack 6" in str(caught.value)
    plan = plan_tensorrt_build(image_recipe, with_tensorrt_major(agx_orin, None), Precision.FP16)
    assert plan.tensorrt_major == 10
    assert "names no software.tensorrt_major; planned for TensorRT 10" in plan.notes[0]


def test_target_without_tensorrt(image_recipe: Recipe) -> None:
    with pytest.raises(TargetError, match="target 'x86-64-cpu' has no tensorrt backend"):
        plan_tensorrt_build(image_recipe, get_target("x86-64-cpu"), Precision.FP32)


def test_sparse_weights_follow_the_prune_report(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    assert plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16, {"method": "2:4", "sparse_2_4": True}).sparse_weights
    assert not plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16, {"method": "magnitude", "sparse_2_4": False}).sparse_weights


def test_profiles_come_from_the_recipe_dims(write_recipe: Callable[[str], Recipe], agx_orin: TargetProfile) -> None:
    plan = plan_tensorrt_build(write_recipe(TEXT_RECIPE), agx_orin, Precision.FP16)
    full, at_min = plan.profiles
    assert full.name == "min-opt-max" and at_min.name == "min"
    ids = full.shapes[0]
    assert (ids.name, ids.min, ids.opt, ids.max) == ("input_ids", (1, 16), (8, 128), (32, 256))
    assert [r.name for r in full.shapes] == ["input_ids", "attention_mask"]
    assert all(r.min == r.opt == r.max == (1, 16) for r in at_min.shapes)
    only_one = plan_tensorrt_build(write_recipe(TEXT_RECIPE), agx_orin, Precision.FP16, options=TensorRTOptions(min_shape_profile=False))
    assert len(only_one.profiles) == 1


def test_static_recipe_has_one_static_profile(write_recipe: Callable[[str], Recipe], h100: TargetProfile) -> None:
    plan = plan_tensorrt_build(write_recipe(STATIC_RECIPE), h100, Precision.FP32)
    assert len(plan.profiles) == 1 and plan.profiles[0].static
    assert plan.profiles[0].shapes[0].max == (1, 1, 4, 4)


def test_bad_options_are_build_errors() -> None:
    with pytest.raises(BuildError, match="builder_optimization_level must be 0..5, got 7"):
        TensorRTOptions(builder_optimization_level=7)
    with pytest.raises(BuildError, match="dla_core must be a DLA core index >= 0, got -1"):
        TensorRTOptions(dla_core=-1)


def test_plan_round_trips_through_json(tmp_path: Path, write_recipe: Callable[[str], Recipe], agx_orin: TargetProfile) -> None:
    plan = plan_tensorrt_build(write_recipe(TEXT_RECIPE), agx_orin, Precision.INT8, {"sparse_2_4": True},
                               TensorRTOptions(dla_core=0, timing_cache=TimingCachePolicy.READ_ONLY, builder_optimization_level=5))
    path = plan.write(tmp_path / "tensorrt" / "plan.json")
    again = TensorRTBuildPlan.read(path)
    assert again == plan and again.notes == plan.notes
    assert again.digest == plan.digest
    assert json.loads(path.read_text())["dla"] == {"core": 0, "gpu_fallback": True}


def test_digest_ignores_notes_but_not_settings(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    from dataclasses import replace

    plan = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16)
    assert replace(plan, notes=("another note",)).digest == plan.digest
    assert replace(plan, workspace_mb=1024).digest != plan.digest
    assert replace(plan, builder_optimization_level=4).digest != plan.digest
    assert plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16).digest == plan.digest  # stable


def test_malformed_plan_files_name_the_field(tmp_path: Path, image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    good = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16).to_dict()
    path = tmp_path / "plan.json"
    cases = {
        "field 'precision' is missing": {k: v for k, v in good.items() if k != "precision"},
        "field 'network_typing' is 'loose'; expected one of weak, strong": {**good, "network_typing": "loose"},
        "field 'workspace_mb' must be an integer, got '4096'": {**good, "workspace_mb": "4096"},
        "schema_version 2 is not supported": {**good, "schema_version": 2},
        "unknown builder flag(s) ['FP64']": {**good, "builder_flags": ["FP64"]},
        "profiles[0].shapes[0]: field 'min' must be a list of integers": {**good, "profiles": [{"name": "p", "shapes": [{"name": "image", "min": ["a"], "opt": [1], "max": [1]}]}]},
        "input 'image': need 0 <= min <= opt <= max per dimension": {**good, "profiles": [{"name": "p", "shapes": [{"name": "image", "min": [4], "opt": [1], "max": [8]}]}]},
        "builder flags ['FP16'] need a weakly typed network": {**good, "network_typing": "strong"},
    }
    for expected, data in cases.items():
        path.write_text(json.dumps(data))
        with pytest.raises(PlanError) as caught:
            TensorRTBuildPlan.read(path)
        assert expected in str(caught.value), str(caught.value)
        assert str(path) in str(caught.value)
    path.write_text("{not json")
    with pytest.raises(PlanError, match="cannot be read as JSON"):
        TensorRTBuildPlan.read(path)
    with pytest.raises(PlanError, match=r"is missing[\s\S]*edgekit build --backend tensorrt"):
        TensorRTBuildPlan.read(tmp_path / "absent.json")
