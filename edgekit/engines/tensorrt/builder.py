"""``edgekit build --backend tensorrt``: the bundle's ONNX, its build plan, and the engine when this host
can build it.

A TensorRT engine runs only with the TensorRT version and on the GPU model that built it, so the bundle's
portable artifact is the ONNX model plus ``tensorrt/plan.json``. The engine is built here only when this
host's GPU matches the target (same compute capability, same integrated/discrete kind, same model name
and the same TensorRT major); it then ships as ``tensorrt/model.engine`` with its cache key. Otherwise
the device builds it at first load from the same plan (``edgekit_runtime.backends.tensorrt``).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgekit.engines.onnxruntime import EngineBuild
from edgekit.engines.tensorrt.cache import engine_key
from edgekit.engines.tensorrt.plan import TensorRTOptions, plan_tensorrt_build
from edgekit.engines.tensorrt.version import HostProbe, probe_host
from edgekit.errors import BuildError
from edgekit.precision import Backend, Precision
from edgekit.prune.report import PruneReport
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile
from edgekit_runtime.tensorrt_engines.cache import EngineCache, EngineCacheKey, default_cache_dir
from edgekit_runtime.tensorrt_engines.ep_options import tensorrt_ep_options
from edgekit_runtime.tensorrt_engines.plan import PLAN_PATH, OnnxPrecision, TensorRTBuildPlan

log = logging.getLogger(__name__)

#: Bundle-relative path of an engine built on the host.
ENGINE_PATH = "tensorrt/model.engine"
_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla", "quadro", "jetson"})
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class EnginePlacement:
    where: Literal["host", "device"]
    reason: str


def gpu_model_token(cuda_name: str) -> str:
    """The token that names a GPU model in CUDA's device name: the first one with a digit ("h100", "4090"),
    else the first that is not a vendor word ("orin", "thor")."""
    tokens: list[str] = [t for t in re.findall(r"[a-z0-9]+", cuda_name.lower()) if t not in _VENDOR_WORDS]
    with_digit = [t for t in tokens if any(c.isdigit() for c in t) and any(c.isalpha() for c in t) or t.isdigit()]
    return (with_digit or tokens or [""])[0]


def decide_engine_placement(plan: TensorRTBuildPlan, target: TargetProfile, probe: HostProbe) -> EnginePlacement:
    """Build on this host only when its GPU and TensorRT match the target's; else defer to the device."""
    gpu = probe.gpu
    if gpu is None:
        return EnginePlacement("device", f"this host cannot build TensorRT engines ({probe.reason})")
    here = f"this host's GPU '{gpu.name}' (compute capability {gpu.compute_capability}, TensorRT {gpu.tensorrt})"
    there = f"target '{target.name}' ('{plan.gpu_name}', compute capability {plan.compute_capability}, TensorRT {plan.tensorrt_major})"
    if gpu.compute_capability != plan.compute_capability:
        return EnginePlacement("device", f"{here} differs from {there} in compute capability")
    if gpu.tensorrt.major != plan.tensorrt_major:
        return EnginePlacement("device", f"{here} differs from {there} in TensorRT major")
    if gpu.integrated != target.memory.shared_with_gpu:
        kinds = {True: "an integrated (shared-memory) GPU", False: "a discrete GPU"}
        return EnginePlacement("device", f"{here} is {kinds[gpu.integrated]}, {there} is {kinds[target.memory.shared_with_gpu]}")
    token = gpu_model_token(gpu.name)
    names = " ".join((target.gpu.name if target.gpu else "", target.display_name, target.family)).lower()
    if not token or token not in re.findall(r"[a-z0-9]+", names):
        return EnginePlacement("device", f"{here} is not the GPU model of {there} ('{token}' is not in its names)")
    return EnginePlacement("host", f"{here} matches {there}")


@dataclass(frozen=True)
class HostEngine:
    """An engine built (or found in the cache) on this host."""

    key: EngineCacheKey
    path: Path
    source: str  # "cache" | "built"
    notes: tuple[str, ...]


def build_engine(onnx_path: Path, plan: TensorRTBuildPlan, cache_dir: Path | None = None,
                 logger: logging.Logger | None = None, *, device_id: int = 0) -> HostEngine:
    """Build (or take from the cache) the engine for ``onnx_path`` under ``plan`` on this host's GPU."""
    from edgekit_runtime.tensorrt_engines.build import build_serialized_engine
    from edgekit_runtime.tensorrt_engines.materialise import materialise_engine

    logger = logger or log
    probe = probe_host(device_id)
    if probe.gpu is None:
        raise BuildError(f"cannot build a TensorRT engine on this host: {probe.reason}",
                         hint="build without an engine (the device builds it at first load), or run on a machine with the target's GPU")
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))

    def check(data: bytes) -> bytes | None:  # only bytes travel on; deserializing proves they load here
        return data if runtime.deserialize_cuda_engine(data) is not None else None

    key = engine_key(Path(onnx_path), plan, probe.gpu.identity)
    cache = EngineCache(cache_dir if cache_dir is not None else default_cache_dir())
    result = materialise_engine(key, cache=cache, deserialize=check, timing_policy=plan.timing_cache,
                                build=lambda timing: build_serialized_engine(Path(onnx_path), plan, timing_cache=timing))
    for note in result.notes:
        logger.info("%s", note)
    assert result.path is not None  # cache and build results always have a file
    return HostEngine(key, result.path, result.source, result.notes)


def write_bundle_onnx(model_path: Path, out_path: Path, plan: TensorRTBuildPlan, recipe: Recipe) -> Path:
    """The bundle's ``model.onnx`` as the plan needs it: cast to FP16 for TensorRT 11 fp16, checked for
    Q/DQ nodes when the precision comes from them, else the graph as the earlier stages left it."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=True)
    if plan.onnx_precision is OnnxPrecision.FP16_CAST:
        from edgekit.engines.onnxruntime import convert_fp16

        model = convert_fp16(model)
    if plan.onnx_precision is OnnxPrecision.QDQ and not any(node.op_type in _QDQ_OPS for node in model.graph.node):
        raise BuildError(
            f"{model_path}: the {plan.precision} TensorRT plan takes its precision from Q/DQ nodes, but the model has none",
            hint="run the quantize stage first (build.precision: int8/int4 writes symmetric Q/DQ for the tensorrt backend); "
            "TensorRT implicit INT8 calibration is not used (TensorRT 11 removed it)",
        )
    large = model.ByteSize() > recipe.export.external_data_mb * 2**20
    onnx.save(model, str(out_path), save_as_external_data=large, location=out_path.name + ".data" if large else None)
    return out_path


def build_tensorrt(
    model_path: Path,
    out_path: Path,
    target: TargetProfile,
    recipe: Recipe,
    precision: Precision,
    *,
    prune: PruneReport | Mapping[str, Any] | None = None,
    options: TensorRTOptions = TensorRTOptions(),
    cache_dir: Path | None = None,
    probe: Callable[[], HostProbe] = probe_host,
) -> EngineBuild:
    """The ``Backend.TENSORRT`` entry of ``edgekit.engines.BUILDERS``: writes ``model.onnx``,
    ``tensorrt/plan.json`` and, when this host matches the target, ``tensorrt/model.engine``."""
    plan = plan_tensorrt_build(recipe, target, precision, prune, options)
    bundle_dir = out_path.parent
    write_bundle_onnx(model_path, out_path, plan, recipe)
    plan.write(bundle_dir / PLAN_PATH)
    placement = decide_engine_placement(plan, target, probe())
    log.info("TensorRT engine for %s: built on the %s (%s)", target.name, placement.where, placement.reason)
    engine: dict[str, Any] | None = None
    if placement.where == "host":
        built = build_engine(out_path, plan, cache_dir)
        (bundle_dir / ENGINE_PATH).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built.path, bundle_dir / ENGINE_PATH)
        engine = {"path": ENGINE_PATH, "key": built.key.to_dict(), "source": built.source}
    section = {
        "api": plan.api,
        "tensorrt_major": plan.tensorrt_major,
        "network_typing": plan.network_typing.value,
        "onnx_precision": plan.onnx_precision.value,
        "plan": PLAN_PATH,
        "plan_digest": plan.digest,
        "engine": engine,
        "engine_built_on": placement.where,
        "placement_reason": placement.reason,
        # ONNX Runtime's TensorRT EP with the same plan; cache paths are relative to the device's cache root.
        "onnxruntime_tensorrt_ep": tensorrt_ep_options(plan, Path(".")),
        "notes": list(plan.notes),
    }
    return EngineBuild(
        model_path=out_path,
        backend=Backend.TENSORRT,
        precision=precision,
        # What evaluates the same ONNX on a host without the engine: CUDA when present, else the CPU.
        execution_providers=[{"name": "CUDAExecutionProvider", "options": {"device_id": 0}}, {"name": "CPUExecutionProvider", "options": {}}],
        graph_optimization=recipe.build.graph_optimization,
        details={"tensorrt": section},
    )
