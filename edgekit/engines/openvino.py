"""The OpenVINO engine build: the bundle keeps the ONNX graph (OpenVINO reads ONNX directly) and records how the
device compiles it: the device (CPU, GPU, NPU), the INFERENCE_PRECISION_HINT, the OpenVINO version and the
compiled-model cache key. The graph is the checked FP32 export (fp32, bf16: the hint does the rest), its FP16
conversion (fp16, for GPU and NPU) or edgekit's own QDQ graph from the quantize stage (int8).

Why the OpenVINO runtime directly and not ONNX Runtime's OpenVINO execution provider: docs/openvino.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.engines.onnxruntime import EngineBuild, convert_fp16
from edgekit.errors import BuildError
from edgekit.precision import Backend, Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile

#: edgekit precision -> OpenVINO INFERENCE_PRECISION_HINT. int8 runs the QDQ graph's int8 layers and keeps the
#: rest in f32 (strict), as fp32 does; the OpenVINO default (bf16 on CPUs that have it) is precision bf16.
PRECISION_HINTS: dict[Precision, str] = {Precision.FP32: "f32", Precision.BF16: "bf16", Precision.FP16: "f16", Precision.INT8: "f32"}
#: device -> how the runner meets dynamic dims: the NPU plugin compiles static shapes only, so its runner compiles
#: once per input shape it meets (the golden batches' shapes on the self-check, each served batch size after).
SHAPE_POLICY: dict[str, str] = {"CPU": "dynamic", "GPU": "dynamic", "NPU": "per-shape"}


def openvino_version() -> str:
    """The installed OpenVINO's version, or a BuildError naming the extra that installs it."""
    try:
        import openvino
    except ImportError:
        raise BuildError("the openvino backend needs the OpenVINO runtime, which is not installed",
                         hint="pip install 'edgekit[openvino]' (or 'edgekit-runtime[openvino]' on a device)") from None
    return str(openvino.__version__).split("-")[0]


def cache_key(version: str, device: str, hint: str) -> str:
    """The compiled-model cache key: a compiled blob is reused only by the same OpenVINO release, device and hint."""
    return f"openvino-{version}-{device.lower()}-{hint}"


def build_openvino(model_path: Path, out_path: Path, target: TargetProfile, recipe: Recipe, precision: Precision) -> EngineBuild:
    """Write the bundle's ``model.onnx`` and its OpenVINO compile record; the precision was gated before."""
    import onnx

    version = openvino_version()
    device = target.backend(Backend.OPENVINO).device or "CPU"
    hint = PRECISION_HINTS.get(precision)
    if hint is None:
        raise BuildError(f"precision {precision.value} has no OpenVINO inference precision (target '{target.name}')",
                         hint=f"use one of: {', '.join(p.value for p in PRECISION_HINTS)}")
    model = onnx.load(str(model_path), load_external_data=True)
    if precision is Precision.FP16:
        model = convert_fp16(model)
    large = model.ByteSize() > recipe.export.external_data_mb * 2**20
    onnx.save(model, str(out_path), save_as_external_data=large, location=out_path.name + ".data" if large else None)
    record: dict[str, Any] = {"device": device, "inference_precision_hint": hint, "version": version,
                              "cache_key": cache_key(version, device, hint), "graph": "onnx", "shapes": SHAPE_POLICY[device]}
    stand_in = host_stand_in(device)
    if stand_in:
        record["host_stand_in"] = stand_in
    return EngineBuild(model_path=out_path, backend=Backend.OPENVINO, precision=precision, execution_providers=[],
                       graph_optimization="openvino", details={"openvino": record})


def host_stand_in(device: str) -> str | None:
    """How this host checks a bundle for ``device`` when it lacks that device: the CPU plugin stands in (None
    when the device is here). The golden outputs and the report then say they were measured on the CPU."""
    import openvino as ov

    if device in ov.Core().available_devices:
        return None
    return f"CPU plugin on this host (no OpenVINO {device} here): evaluate, golden outputs and bench ran on the CPU, not the {device}"


def host_runner(engine: EngineBuild | dict[str, Any], model_path: Path, signature: Any, threads: int | None) -> Any:
    """The loaded runner that evaluate, golden and bench use on this host: the bundle's device when this host has
    it, else the CPU plugin as a stand-in (at f32 for an f16 hint: OpenVINO's CPU plugin would quietly run bf16)."""
    from edgekit_runtime.backends.openvino import OpenVinoRunner

    record = engine.details["openvino"] if isinstance(engine, EngineBuild) else engine
    device, hint = record["device"], record["inference_precision_hint"]
    if host_stand_in(device):
        device, hint = "CPU", ("f32" if hint == "f16" else hint)
    return OpenVinoRunner(model_path, signature, device=device, inference_precision_hint=hint, threads=threads,
                          shapes=record.get("shapes", "dynamic")).load()
