"""ONNX Runtime on the GPU: TensorRT and CUDA execution-provider options derived from a build plan.

The TensorRT EP builds its own engines; they are cached in a directory keyed like edgekit's engines
(:class:`EngineCacheKey` when the device is known, else the plan digest), because ONNX Runtime's own
engine file names do not include the TensorRT version. Precision flags follow the plan: FP16 only for
an fp16 plan, INT8 only for an int8 plan whose precision comes from Q/DQ nodes; nothing is switched on
behind the recipe's back. Whether a requested provider really loaded is checked by
:class:`~edgekit_runtime.backends.onnxruntime.OnnxRuntimeRunner` (``session.get_providers()``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit_runtime.tensorrt_engines.cache import KEY_CHARS, EngineCache, EngineCacheKey, TimingCacheKey
from edgekit_runtime.tensorrt_engines.plan import NetworkTyping, OnnxPrecision, TensorRTBuildPlan, TimingCachePolicy

Option = str | int | float | bool


def _shapes(plan: TensorRTBuildPlan, point: str) -> str:
    """ONNX Runtime's explicit-profile syntax: ``image:1x1x8x8,mask:1x128``."""
    profile = plan.profiles[0]
    return ",".join(f"{r.name}:{'x'.join(str(d) for d in getattr(r, point))}" for r in profile.shapes)


def tensorrt_ep_options(plan: TensorRTBuildPlan, cache_dir: Path, *, key: EngineCacheKey | None = None,
                        device_id: int = 0) -> dict[str, Option]:
    """``TensorrtExecutionProvider`` options equivalent to ``plan``, with caches under ``cache_dir``."""
    cache = EngineCache(cache_dir)
    if key is not None:
        engine_dir = cache.ort_tensorrt_ep_dir(key)
        timing_dir = cache.root / "ort-tensorrt-ep" / f"timing-{TimingCacheKey(key.gpu_name, key.compute_capability, key.tensorrt_version).digest[:KEY_CHARS]}"
    else:  # the device is not known yet (host side): key by the plan; the device passes its key
        engine_dir = cache.root / "ort-tensorrt-ep" / f"plan-{plan.digest[:KEY_CHARS]}"
        timing_dir = cache.root / "ort-tensorrt-ep" / f"timing-{plan.target}"
    flags = set(plan.builder_flags)
    options: dict[str, Option] = {
        "device_id": device_id,
        "trt_max_workspace_size": plan.workspace_bytes,
        "trt_builder_optimization_level": plan.builder_optimization_level,
        # FP16: a weakly typed fp16 plan sets the flag; a strongly typed one carries FP16 in the ONNX itself.
        "trt_fp16_enable": "FP16" in flags,
        # INT8 with explicit Q/DQ: the EP must be allowed INT8 kernels; no calibration table is used.
        "trt_int8_enable": "INT8" in flags or (plan.precision == "int8" and plan.onnx_precision is OnnxPrecision.QDQ),
        "trt_int8_use_native_calibration_table": False,
        "trt_sparsity_enable": plan.sparse_weights,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(engine_dir),
        "trt_timing_cache_enable": plan.timing_cache is not TimingCachePolicy.OFF,
        "trt_timing_cache_path": str(timing_dir),
        "trt_dla_enable": plan.dla is not None,
    }
    if plan.network_typing is NetworkTyping.WEAK and "BF16" in flags:
        options["trt_bf16_enable"] = True
    if plan.dla is not None:
        options["trt_dla_core"] = plan.dla.core
    if not plan.profiles[0].static:
        options.update(trt_profile_min_shapes=_shapes(plan, "min"), trt_profile_opt_shapes=_shapes(plan, "opt"),
                       trt_profile_max_shapes=_shapes(plan, "max"))
    return options


def gpu_execution_providers(plan: TensorRTBuildPlan, cache_dir: Path, *, key: EngineCacheKey | None = None,
                            device_id: int = 0) -> list[dict[str, Any]]:
    """The manifest's ``execution_providers`` for running the bundle's ONNX with ONNX Runtime on the GPU:
    the TensorRT EP, the CUDA EP for what TensorRT does not take, and the CPU last."""
    return [
        {"name": "TensorrtExecutionProvider", "options": tensorrt_ep_options(plan, cache_dir, key=key, device_id=device_id)},
        {"name": "CUDAExecutionProvider", "options": {"device_id": device_id}},
        {"name": "CPUExecutionProvider", "options": {}},
    ]
