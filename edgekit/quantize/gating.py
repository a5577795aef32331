"""Target gating: what each precision needs from a device, and the decision for one build.

Each precision declares its requirement as a small check over (target, backend). Asking for a
precision the target cannot run is an error naming the precision, the target, the reason and the
alternatives, unless the recipe lists an explicit fallback order (``build.precision_fallback``),
in which case the decision, with its reason, goes into the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.target import TargetProfile

Check = Callable[[TargetProfile, Backend], "str | None"]


@dataclass(frozen=True)
class PrecisionRequirement:
    precision: Precision
    needs: str
    check: Check


def _cc(target: TargetProfile) -> tuple[int, int] | None:
    return target.gpu.sm if target.gpu is not None and target.gpu.is_cuda else None


def _gpu_at_least(major: int, minor: int, what: str) -> Check:
    def check(target: TargetProfile, backend: Backend) -> str | None:
        cc = _cc(target)
        if backend is Backend.TENSORRT or _runs_on_gpu(target, backend):
            if cc is None:
                return f"{what} needs an NVIDIA GPU with compute capability >= {major}.{minor}; '{target.name}' has no GPU"
            if cc < (major, minor):
                arch = target.gpu.architecture if target.gpu else "?"
                return f"{what} needs compute capability >= {major}.{minor}; this GPU is {cc[0]}.{cc[1]} ({arch})"
            return None
        return f"{what} has no CPU or NPU kernels in ONNX Runtime; it needs an NVIDIA GPU with compute capability >= {major}.{minor}"

    return check


def _runs_on_gpu(target: TargetProfile, backend: Backend) -> bool:
    if backend is Backend.TENSORRT:
        return True
    providers = {ep.name for ep in target.backend(backend).execution_providers}
    return bool(providers & {"CUDAExecutionProvider", "TensorrtExecutionProvider"})


def _anywhere(target: TargetProfile, backend: Backend) -> str | None:
    return None


def _int4(target: TargetProfile, backend: Backend) -> str | None:
    """ONNX Runtime runs int4 weight-only anywhere (MatMulNBits has CPU and CUDA kernels); TensorRT's int4 weight-only
    needs compute capability >= 8.0."""
    return _gpu_at_least(8, 0, "int4 weight-only on TensorRT")(target, backend) if backend is Backend.TENSORRT else None


def _dynamic_int8(target: TargetProfile, backend: Backend) -> str | None:
    if backend is not Backend.ONNXRUNTIME:
        return "int8-dynamic quantizes activations at run time (DynamicQuantizeLinear + MatMulInteger), which only ONNX Runtime's CPU kernels do; TensorRT runs static int8"
    providers = [ep.name for ep in target.backend(backend).execution_providers]
    if "CPUExecutionProvider" not in providers:
        return f"int8-dynamic runs on ONNX Runtime's CPU provider, which this target's providers ({', '.join(providers)}) do not include"
    if target.npu is not None and providers[0] != "CPUExecutionProvider":
        return f"the NPU ({target.npu.name}) runs static, pre-calibrated int8 only"
    return None


#: precision -> requirement. Every entry is exercised by tests/quantize/test_gating.py.
REQUIREMENTS: dict[Precision, PrecisionRequirement] = {
    Precision.FP32: PrecisionRequirement(Precision.FP32, "any device", _anywhere),
    Precision.FP16: PrecisionRequirement(Precision.FP16, "any device (on x86 CPUs without AVX-512 FP16 it is emulated, not faster)", _anywhere),
    Precision.BF16: PrecisionRequirement(Precision.BF16, "GPU compute capability >= 8.0 (Ampere+)", _gpu_at_least(8, 0, "bf16")),
    Precision.INT8: PrecisionRequirement(Precision.INT8, "any device with int8 kernels (static QDQ)", _anywhere),
    Precision.INT8_DYNAMIC: PrecisionRequirement(Precision.INT8_DYNAMIC, "ONNX Runtime CPU provider", _dynamic_int8),
    Precision.FP8: PrecisionRequirement(Precision.FP8, "GPU compute capability >= 8.9 (Ada, Hopper, Blackwell/Thor)", _gpu_at_least(8, 9, "fp8 (E4M3)")),
    Precision.INT4: PrecisionRequirement(Precision.INT4, "weight-only int4 kernels (ONNX Runtime MatMulNBits, TensorRT on compute capability >= 8.0)", _int4),
    Precision.MXFP8: PrecisionRequirement(Precision.MXFP8, "Blackwell tensor cores (compute capability >= 10.0)", _gpu_at_least(10, 0, "mxfp8")),
    Precision.MXFP4: PrecisionRequirement(Precision.MXFP4, "Blackwell tensor cores (compute capability >= 10.0)", _gpu_at_least(10, 0, "mxfp4")),
    Precision.NVFP4: PrecisionRequirement(Precision.NVFP4, "Blackwell tensor cores (compute capability >= 10.0)", _gpu_at_least(10, 0, "nvfp4")),
}

#: OpenVINO devices -> the float precisions their plugins compute in (INFERENCE_PRECISION_HINT), with the CPU flags
#: a CPU needs for each (any one of them); GPU (Intel iGPU/Arc) and NPU compute f16, never bf16.
OPENVINO_FLOAT_PRECISIONS: dict[str, dict[Precision, tuple[str, ...]]] = {
    "CPU": {Precision.BF16: ("avx512_bf16", "amx_bf16"), Precision.FP16: ("avx512_fp16", "amx_fp16")},
    "GPU": {Precision.FP16: ()},
    "NPU": {Precision.FP16: ()},
}


def _cpu_flags(target: TargetProfile) -> set[str]:
    """The target's CPU flags: its ``cpu.isa`` list, or this host's /proc/cpuinfo for ``isa: host``."""
    if isinstance(target.cpu.isa, list):
        return set(target.cpu.isa)
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace") if target.cpu.isa == "host" else ""
    except OSError:
        return set()
    return next((set(line.partition(":")[2].split()) for line in text.splitlines() if line.startswith("flags")), set())


def openvino_refusal(target: TargetProfile, precision: Precision) -> str | None:
    """Why OpenVINO cannot run ``precision`` on the target's device (None when it can)."""
    device = target.backend(Backend.OPENVINO).device or "CPU"
    if precision in (Precision.FP32, Precision.INT8):
        return "the NPU compiles FP32 layers to FP16: use fp16 or int8" if precision is Precision.FP32 and device == "NPU" else None
    floats = OPENVINO_FLOAT_PRECISIONS[device]
    if precision not in floats:
        return f"OpenVINO on {device} runs fp32, int8 (static QDQ) and {', '.join(p.value for p in floats) or 'no other float'}, not {precision.value}"
    needs = floats[precision]
    if needs and not needs_met(needs, _cpu_flags(target)):
        return (f"OpenVINO's CPU plugin computes {precision.value} only with {' or '.join(needs)}, which target '{target.name}' "
                f"does not have ({'this host' if target.cpu.isa == 'host' else 'cpu.isa'})")
    return None


def needs_met(needs: tuple[str, ...], flags: set[str]) -> bool:
    return any(flag in flags for flag in needs)


#: What NVIDIA's DLA can run (DLA cores on AGX Orin / Orin NX): everything else falls back to the GPU.
DLA_PRECISIONS = (Precision.FP16, Precision.INT8)


def refusal_reason(target: TargetProfile, backend: Backend, precision: Precision, use_dla: bool = False) -> str | None:
    """Why ``precision`` cannot run on ``target`` with ``backend`` (None when it can)."""
    declared = target.backend(backend).precisions
    reason = openvino_refusal(target, precision) if backend is Backend.OPENVINO else REQUIREMENTS[precision].check(target, backend)
    if reason is None and precision not in declared:
        reason = f"the target profile does not list {precision.value} for {backend.value}"
    if reason is None and use_dla:
        if target.dla_cores == 0:
            reason = f"'{target.name}' has no DLA cores"
        elif precision not in DLA_PRECISIONS:
            reason = f"DLA runs only {' and '.join(p.value for p in DLA_PRECISIONS)}"
    return reason


def supported_precisions(target: TargetProfile, backend: Backend, use_dla: bool = False) -> list[Precision]:
    return [p for p in target.backend(backend).precisions if refusal_reason(target, backend, p, use_dla) is None]


@dataclass(frozen=True)
class PrecisionDecision:
    requested: Precision
    used: Precision
    reason: str | None  # why the requested precision was refused (None when used == requested)
    policy: str  # "as requested" | "recipe build.precision_fallback"

    def to_manifest(self) -> dict[str, str | None]:
        return {"requested": self.requested.value, "used": self.used.value, "refused_because": self.reason, "policy": self.policy}


def decide_precision(target: TargetProfile, backend: Backend, requested: Precision, fallback: tuple[Precision, ...] = (), use_dla: bool = False) -> PrecisionDecision:
    """The precision a build will use, or a QuantizationError naming precision, target, reason and alternatives."""
    reason = refusal_reason(target, backend, requested, use_dla)
    if reason is None:
        return PrecisionDecision(requested, requested, None, "as requested")
    for candidate in fallback:
        if refusal_reason(target, backend, candidate, use_dla) is None:
            return PrecisionDecision(requested, candidate, reason, "recipe build.precision_fallback")
    alternatives = supported_precisions(target, backend, use_dla)
    tried = f" (fallbacks tried: {', '.join(p.value for p in fallback)})" if fallback else ""
    others = other_backends_for(target, backend, requested)
    switch = (f"; or build it with {' or '.join(f'--backend {b.value}' for b in others)} (build.backend in the recipe), "
              f"which can run {requested.value} on this target" if others else "")  # fmt: skip
    raise QuantizationError(
        f"precision {requested.value} cannot run on target '{target.name}' ({backend.value}): {reason}{tried}",
        hint=f"use one of: {', '.join(p.value for p in alternatives) or 'none'}{switch}; or list a fallback order in the recipe, "
        f"e.g. build.precision_fallback: [{', '.join(p.value for p in alternatives[:2])}]",
    )


def other_backends_for(target: TargetProfile, backend: Backend, precision: Precision) -> list[Backend]:
    """The target's other backends, in its order of preference, that can run ``precision`` on it."""
    return [s.name for s in target.backends if s.name is not backend and refusal_reason(target, s.name, precision) is None]
