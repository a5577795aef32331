"""Recipe + target + precision + prune report -> :class:`TensorRTBuildPlan`.

The plan says how the engine will be built wherever it is built (host or device):

- **precision and how it is expressed.** TensorRT 10 (``software.tensorrt_major: 10``): a weakly typed
  network plus the builder flag of the precision (FP16, BF16, INT8, FP8, INT4), the quantized ones on top
  of the quantize stage's Q/DQ nodes; the block formats (nvfp4, mxfp8, mxfp4) use a strongly typed
  network even there. TensorRT 11: strongly typed only, so FP16 is a host-side cast of the ONNX and every
  quantized precision comes from Q/DQ nodes.
- **optimisation profiles** from the recipe's ``dims`` min/opt/max, plus (by default) a second profile
  pinned at the minimum shape, so batch-1 calls run kernels tuned for batch 1.
- **workspace** (``build.workspace_mb`` of the target), builder optimisation level, DLA core and GPU
  fallback (only where the target has DLA; DLA runs fp16 and int8 only), sparse weights when the prune
  report says the weights are 2:4, and the timing-cache policy.

Options a target cannot honour are errors naming the option, the target and the fix; nothing is
switched silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.errors import BuildError
from edgekit.precision import Backend, Precision
from edgekit.prune.report import PruneReport
from edgekit.quantize.gating import refusal_reason
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile
from edgekit_runtime.tensorrt_engines.errors import TensorRTUnavailableError
from edgekit_runtime.tensorrt_engines.plan import (
    DlaPolicy,
    NetworkTyping,
    OnnxPrecision,
    OptimizationProfile,
    ShapeRange,
    TensorRTBuildPlan,
    TimingCachePolicy,
)
from edgekit_runtime.tensorrt_engines.version import TensorRTApi, api_for_major

#: Used when a target profile does not name its TensorRT major (software.tensorrt_major).
DEFAULT_TENSORRT_MAJOR = 10

Expression = tuple[NetworkTyping, tuple[str, ...], OnnxPrecision]

#: TensorRT 10: precision -> (network typing, builder flags, how the ONNX carries it).
TENSORRT10: dict[Precision, Expression] = {
    Precision.FP32: (NetworkTyping.WEAK, (), OnnxPrecision.AS_EXPORTED),
    Precision.FP16: (NetworkTyping.WEAK, ("FP16",), OnnxPrecision.AS_EXPORTED),
    Precision.BF16: (NetworkTyping.WEAK, ("BF16",), OnnxPrecision.AS_EXPORTED),
    Precision.INT8: (NetworkTyping.WEAK, ("INT8",), OnnxPrecision.QDQ),
    Precision.FP8: (NetworkTyping.WEAK, ("FP8",), OnnxPrecision.QDQ),
    Precision.INT4: (NetworkTyping.WEAK, ("INT4",), OnnxPrecision.QDQ),
    Precision.NVFP4: (NetworkTyping.STRONG, (), OnnxPrecision.QDQ),
    Precision.MXFP8: (NetworkTyping.STRONG, (), OnnxPrecision.QDQ),
    Precision.MXFP4: (NetworkTyping.STRONG, (), OnnxPrecision.QDQ),
}

#: TensorRT 11: strongly typed only. BF16 is missing on purpose: edgekit has no host-side BF16 cast yet.
TENSORRT11: dict[Precision, Expression] = {
    Precision.FP32: (NetworkTyping.STRONG, (), OnnxPrecision.AS_EXPORTED),
    Precision.FP16: (NetworkTyping.STRONG, (), OnnxPrecision.FP16_CAST),
    **{p: (NetworkTyping.STRONG, (), OnnxPrecision.QDQ)
       for p in (Precision.INT8, Precision.FP8, Precision.INT4, Precision.NVFP4, Precision.MXFP8, Precision.MXFP4)},
}


@dataclass(frozen=True)
class TensorRTOptions:
    """What a recipe may choose about a TensorRT build (``build.tensorrt`` once the recipe carries it)."""

    dla_core: int | None = None
    gpu_fallback: bool = True
    builder_optimization_level: int = 3
    timing_cache: TimingCachePolicy = TimingCachePolicy.SHARED
    min_shape_profile: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.builder_optimization_level <= 5:
            raise BuildError(f"build.tensorrt.builder_optimization_level must be 0..5, got {self.builder_optimization_level}",
                             hint="3 is TensorRT's default; 5 searches longest for the fastest kernels")
        if self.dla_core is not None and self.dla_core < 0:
            raise BuildError(f"build.tensorrt.dla_core must be a DLA core index >= 0, got {self.dla_core}")


def _sparse_2_4(prune: PruneReport | Mapping[str, Any] | None) -> bool:
    if prune is None:
        return False
    if isinstance(prune, PruneReport):
        return prune.sparse_2_4
    return bool(prune.get("sparse_2_4", False))


def shape_ranges(recipe: Recipe) -> tuple[ShapeRange, ...]:
    return tuple(
        ShapeRange(spec.name, recipe.shape_at(spec, "min"), recipe.shape_at(spec, "opt"), recipe.shape_at(spec, "max"))
        for spec in recipe.inputs
    )


def optimization_profiles(recipe: Recipe, min_shape_profile: bool) -> tuple[OptimizationProfile, ...]:
    """The recipe's min/opt/max profile; with ``min_shape_profile`` also one pinned at the min shapes when
    they differ from opt (TensorRT picks kernels for opt, which can be slow at batch 1)."""
    ranges = shape_ranges(recipe)
    profiles = [OptimizationProfile("min-opt-max", ranges)]
    if min_shape_profile and any(r.min != r.opt for r in ranges):
        profiles.append(OptimizationProfile("min", tuple(ShapeRange(r.name, r.min, r.min, r.min) for r in ranges)))
    return tuple(profiles)


def _dla_policy(target: TargetProfile, precision: Precision, options: TensorRTOptions, major: int) -> DlaPolicy | None:
    if options.dla_core is None:
        return None
    if target.dla_cores == 0:
        raise BuildError(
            f"build.tensorrt.dla_core: {options.dla_core} asks for DLA, but target '{target.name}' has no DLA cores",
            hint="leave dla_core out for this target (add it under overrides.<target> for Jetson AGX Orin / Orin NX only)",
        )
    if not 0 <= options.dla_core < target.dla_cores:
        raise BuildError(
            f"build.tensorrt.dla_core: {options.dla_core} is not a DLA core of target '{target.name}' "
            f"(it has {target.dla_cores}: 0..{target.dla_cores - 1})",
            hint=f"use dla_core: 0{' or 1' if target.dla_cores > 1 else ''}",
        )
    if major >= 11:
        raise BuildError(
            f"build.tensorrt.dla_core: target '{target.name}' runs TensorRT {major}, and edgekit supports DLA with TensorRT 10 only",
            hint="leave dla_core out, or set the target's software.tensorrt_major to 10 (JetPack 6)",
        )
    return DlaPolicy(core=options.dla_core, gpu_fallback=options.gpu_fallback)


def plan_tensorrt_build(
    recipe: Recipe,
    target: TargetProfile,
    precision: Precision,
    prune: PruneReport | Mapping[str, Any] | None = None,
    options: TensorRTOptions = TensorRTOptions(),
) -> TensorRTBuildPlan:
    """The TensorRT build plan for ``recipe`` on ``target`` at ``precision``."""
    target.backend(Backend.TENSORRT)  # TargetError when the target has no TensorRT
    assert target.gpu is not None  # the target schema requires a gpu section with the tensorrt backend
    notes: list[str] = []
    use_dla = options.dla_core is not None
    major = target.software.tensorrt_major
    if major is None:
        major = DEFAULT_TENSORRT_MAJOR
        notes.append(f"target '{target.name}' names no software.tensorrt_major; planned for TensorRT {major}")
    try:
        api = api_for_major(major)
    except TensorRTUnavailableError as err:
        raise BuildError(f"target '{target.name}': software.tensorrt_major {major}: {err.message}", hint=err.hint) from None
    dla = _dla_policy(target, precision, options, major)
    reason = refusal_reason(target, Backend.TENSORRT, precision, use_dla)
    if reason is not None:
        raise BuildError(f"precision {precision.value} cannot be built with TensorRT for target '{target.name}': {reason}",
                         hint="choose a precision the target lists for tensorrt (`edgekit targets show " + target.name + "`)")
    table = TENSORRT10 if api is TensorRTApi.WEAKLY_TYPED_10 else TENSORRT11
    if precision not in table:
        raise BuildError(
            f"precision {precision.value} has no TensorRT {major} expression in edgekit "
            + ("(TensorRT 11 is strongly typed and edgekit has no host-side BF16 cast yet)" if precision is Precision.BF16 else ""),
            hint="use fp16 instead, or a target with software.tensorrt_major: 10",
        )
    typing, flags, onnx_precision = table[precision]
    if onnx_precision is OnnxPrecision.QDQ:
        notes.append(f"{precision.value}: TensorRT explicit quantization from the quantize stage's symmetric Q/DQ nodes")
    if onnx_precision is OnnxPrecision.FP16_CAST:
        notes.append("fp16 on TensorRT 11: the ONNX is cast to FP16 on the host (inputs and outputs stay as declared)")
    sparse = _sparse_2_4(prune)
    if sparse and target.gpu.sm < (8, 0):
        notes.append(f"2:4 sparse weights need sparse tensor cores (compute capability 8.0+); {target.gpu.compute_capability} builds them dense")
    return TensorRTBuildPlan(
        target=target.name,
        gpu_name=target.gpu.name,
        compute_capability=target.gpu.cuda_compute_capability,
        precision=precision.value,
        tensorrt_major=major,
        api=api.value,
        network_typing=typing,
        onnx_precision=onnx_precision,
        builder_flags=flags,
        profiles=optimization_profiles(recipe, options.min_shape_profile),
        workspace_mb=target.build.workspace_mb,
        builder_optimization_level=options.builder_optimization_level,
        dla=dla,
        sparse_weights=sparse,
        timing_cache=options.timing_cache,
        notes=tuple(notes),
    )
