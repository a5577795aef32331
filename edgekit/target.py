"""Target profiles: validated device descriptions loaded from ``targets/*.yaml``, and their registry.

A profile says what a device is (CPU, GPU compute capability, DLA, NPU, memory, peak throughput,
power modes, software line) and what edgekit may build for it (backends in order of preference,
the precisions each can run there, ONNX Runtime execution providers with their options, build limits).
"""

from __future__ import annotations

import difflib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from edgekit.config import FieldError, StrictModel, closest, load_model
from edgekit.errors import TargetError
from edgekit.precision import Backend, Precision

#: Where the shipped profiles live (repo checkout or installed data).
TARGETS_DIR = Path(__file__).resolve().parent.parent / "targets"


class CPU(StrictModel):
    arch: Literal["x86_64", "arm64"]
    cores: int = Field(gt=0, le=4096, description="CPU cores the OS sees (sets default intra-op threads)")
    model: str | None = Field(default=None, description="CPU model and clocks, as the vendor names them")
    isa: list[str] | Literal["host"] | None = Field(
        default=None,
        description="instruction-set extensions that decide the CPU's int8 kernels, as /proc/cpuinfo names them "
        "(x86: avx2, avx512_vnni, avx_vnni, amx_int8; arm64: asimddp, i8mm), or 'host' to read them from the "
        "build machine (for a profile of the dev host itself)",
    )

    @field_validator("isa")
    @classmethod
    def _isa_names(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, list):
            bad = [flag for flag in value if not flag or not flag.replace("_", "").isalnum() or flag != flag.lower()]
            if bad:
                raise ValueError(f"cpu.isa entries are lowercase /proc/cpuinfo flag names such as avx512_vnni; got {bad}")
        return value


class GPU(StrictModel):
    """The target's GPU: a CUDA GPU (``api: cuda``, integrated on Jetson, discrete elsewhere) or an Intel GPU that
    OpenVINO's ``GPU`` device reaches (``api: openvino``: Arc discrete, or the Xe-LPG / Xe2 iGPU of a Core Ultra)."""

    name: str
    api: Literal["cuda", "openvino"] = Field(
        default="cuda", description="how models reach the GPU: 'cuda' (NVIDIA: TensorRT, ONNX Runtime's CUDA/TensorRT providers) "
        "or 'openvino' (Intel: the openvino backend with device GPU)",
    )
    architecture: str = Field(description="the GPU architecture, e.g. 'ampere', 'hopper', 'blackwell' (NVIDIA), 'xe-lpg' (Intel)")
    compute_capability: str | None = Field(
        default=None, pattern=r"^[1-9]\d*\.\d+$",
        description="CUDA compute capability, e.g. '8.7' (required with api: cuda; no CUDA GPU is below 1.0)"
    )
    cuda_cores: int | None = Field(default=None, gt=0)
    tensor_cores: int | None = Field(default=None, ge=0)
    xe_cores: int | None = Field(default=None, gt=0, description="Intel Xe-cores (api: openvino)")
    vector_engines: int | None = Field(default=None, gt=0, description="Intel Xe vector engines, all Xe-cores together (api: openvino)")
    memory_gb: float | None = Field(default=None, gt=0, description="the GPU's own memory (discrete GPUs only)")
    memory_bandwidth_gbps: float | None = Field(default=None, gt=0, description="GB/s of the GPU's own memory")
    max_clock_mhz: float | None = Field(
        default=None, gt=0, le=10000,
        description="the GPU's highest clock in MHz (vendor figure); edgekit estimate derives the FP32 CUDA-core peak "
        "as cuda_cores x 2 x clock where the profile quotes no FP32 figure",
    )

    @model_validator(mode="after")
    def _fields_of_its_api(self) -> "GPU":
        cuda_only = [key for key in ("compute_capability", "cuda_cores", "tensor_cores") if getattr(self, key) is not None]
        intel_only = [key for key in ("xe_cores", "vector_engines") if getattr(self, key) is not None]
        if self.api == "cuda" and self.compute_capability is None:
            raise ValueError("gpu.compute_capability is required for a CUDA GPU (or set gpu.api: openvino for an Intel GPU)")
        if self.api == "cuda" and intel_only:
            raise ValueError(f"gpu.{', gpu.'.join(intel_only)} describe Intel GPUs: set gpu.api: openvino, or remove them")
        if self.api == "openvino" and cuda_only:
            raise ValueError(f"gpu.{', gpu.'.join(cuda_only)} describe CUDA GPUs, not an OpenVINO GPU (gpu.api: openvino): remove them")
        return self

    @property
    def is_cuda(self) -> bool:
        return self.api == "cuda"

    @property
    def cuda_compute_capability(self) -> str:
        """``compute_capability`` of a CUDA GPU ('8.7'); a TargetError for an OpenVINO GPU (check :attr:`is_cuda` first)."""
        if self.compute_capability is None:
            raise TargetError(f"GPU '{self.name}' (gpu.api: {self.api}) has no CUDA compute capability",
                              hint="only CUDA GPUs (gpu.api: cuda) have gpu.compute_capability")
        return self.compute_capability

    @property
    def sm(self) -> tuple[int, int]:
        """The CUDA compute capability as (major, minor); only CUDA GPUs have one (check :attr:`is_cuda` first)."""
        major, minor = self.cuda_compute_capability.split(".")
        return int(major), int(minor)


class NPU(StrictModel):
    name: str
    vendor: str
    architecture: str | None = Field(default=None, description="NPU generation, e.g. 'Hexagon HTP v68', 'NPU 3720'")
    int8_tops: float | None = Field(default=None, gt=0, description="the NPU's own INT8 peak (not the platform total)")
    execution_provider: str = Field(description="The ONNX Runtime execution provider that reaches it")
    fp32_runs_as: Precision | None = Field(
        default=None,
        description="the precision the NPU compiles FP32 layers to (OpenVINO's NPU: fp16); leave it out where the NPU "
        "refuses float layers and the CPU execution provider runs them (edgekit estimate times them on the CPU)",
    )


class Memory(StrictModel):
    """System memory. On SoCs it is shared by CPU, GPU and accelerators (``shared_with_gpu``)."""

    gb: float = Field(gt=0)
    bandwidth_gbps: float | None = Field(default=None, gt=0, description="GB/s")
    shared_with_gpu: bool = False


class PeakThroughput(StrictModel):
    precision: Precision
    value: float = Field(gt=0)
    unit: Literal["TOPS", "TFLOPS"]
    engine: Literal["gpu", "dla", "npu", "cpu", "total"] = "gpu"
    sparse: bool = Field(default=False, description="True when the vendor figure assumes 2:4 sparsity")
    power_mode: str | None = Field(
        default=None, description="the power mode the figure is quoted at (a key of power_modes)"
    )
    derivation: str | None = Field(
        default=None, max_length=500,
        description="how a figure no vendor quotes was derived (e.g. cores x clock x FLOPs per cycle, with the source of "
        "each factor); edgekit estimate lists it with every estimate that uses the figure",
    )


class Software(StrictModel):
    jetpack: str | None = Field(default=None, description="JetPack release, e.g. '6.2'")
    jetson_linux: str | None = Field(default=None, description="Jetson Linux (L4T) release, e.g. '36.4.3'")
    tensorrt_major: int | None = Field(default=None, ge=7)
    cuda: str | None = Field(default=None, description="CUDA toolkit version, e.g. '12.6'")
    os: str | None = None


#: ONNX Runtime's execution providers by name (``onnxruntime.get_all_providers()`` of 1.32, and those of builds
#: it no longer lists); a test keeps it a superset of the installed ONNX Runtime's list.
ONNXRUNTIME_PROVIDERS = frozenset({
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider", "ROCMExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "TvmExecutionProvider", "VitisAIExecutionProvider",
    "QNNExecutionProvider", "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider",
    "CoreMLExecutionProvider", "ArmNNExecutionProvider", "ACLExecutionProvider", "DmlExecutionProvider",
    "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
    "CANNExecutionProvider", "AzureExecutionProvider", "SNPEExecutionProvider", "NvTensorRTRTXExecutionProvider",
    "CPUExecutionProvider",
})  # fmt: skip
#: The providers that run on a CUDA GPU.
CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})


class ExecutionProvider(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z]+ExecutionProvider$")
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in ONNXRUNTIME_PROVIDERS:
            stems = {known.removesuffix("ExecutionProvider").lower(): known for known in sorted(ONNXRUNTIME_PROVIDERS)}
            close = [stems[stem] for stem in difflib.get_close_matches(name.removesuffix("ExecutionProvider").lower(), stems, n=1, cutoff=0.6)]
            raise FieldError((), f"'{name}' is not an ONNX Runtime execution provider: "
                                 + (f"did you mean '{close[0]}'?" if close else "onnxruntime.get_all_providers() lists their names"))
        return name


class BackendSupport(StrictModel):
    name: Backend
    precisions: tuple[Precision, ...] = Field(min_length=1)
    execution_providers: tuple[ExecutionProvider, ...] = ()
    device: Literal["CPU", "GPU", "NPU"] | None = Field(
        default=None, description="openvino only: the OpenVINO device the bundle compiles for (CPU, GPU = Intel iGPU/Arc, NPU)"
    )

    @model_validator(mode="after")
    def _each_listed_once(self) -> "BackendSupport":
        for index, precision in enumerate(self.precisions):
            if precision in self.precisions[:index]:
                raise FieldError(("precisions", index), f"precision '{precision.value}' is listed twice for {self.name.value}: remove one")
        names = [ep.name for ep in self.execution_providers]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise FieldError(("execution_providers", index, "name"),
                                 f"execution provider '{name}' is listed twice: keep one entry (with all its options)")
        return self

    @model_validator(mode="after")
    def _providers_only_for_ort(self) -> "BackendSupport":
        if self.execution_providers and self.name is not Backend.ONNXRUNTIME:
            raise ValueError("execution_providers apply only to the onnxruntime backend")
        if self.name is Backend.ONNXRUNTIME and not self.execution_providers:
            raise ValueError("the onnxruntime backend needs at least one execution provider")
        if (self.device is None) is (self.name is Backend.OPENVINO):
            raise ValueError("device (CPU, GPU or NPU) is required for the openvino backend and applies to no other backend")
        return self


class BuildLimits(StrictModel):
    workspace_mb: int = Field(default=1024, gt=0, le=1 << 22, description="TensorRT builder workspace limit")
    opset: int = Field(default=18, ge=13, le=23, description="ONNX opset to export at for this target")
    max_batch: int | None = Field(default=None, gt=0, le=2**31 - 1)


#: Precisions whose TensorRT kernels need a minimum GPU generation: BF16 from Ampere (8.0), FP8 from
#: Ada/Hopper (8.9), the FP4 and microscaling formats from Blackwell (10.0). Others run on every GPU edgekit targets.
TENSORRT_MIN_COMPUTE_CAPABILITY: dict[Precision, tuple[int, int]] = {
    Precision.BF16: (8, 0),
    Precision.FP8: (8, 9),
    Precision.MXFP8: (10, 0),
    Precision.MXFP4: (10, 0),
    Precision.NVFP4: (10, 0),
}


#: OpenVINO devices -> the float precisions besides fp32 their plugins compute in, with the CPU flags (any one) each
#: needs at build time; fp32 (not on the NPU, which compiles it to fp16) and int8 run on every device. Repeats the build's rule
#: (edgekit.quantize.gating.OPENVINO_FLOAT_PRECISIONS, which imports this module); a test keeps the two in step.
OPENVINO_DEVICE_FLOATS: dict[str, dict[Precision, tuple[str, ...]]] = {
    "CPU": {Precision.BF16: ("avx512_bf16", "amx_bf16"), Precision.FP16: ("avx512_fp16", "amx_fp16")},
    "GPU": {Precision.FP16: ()},
    "NPU": {Precision.FP16: ()},
}
#: Precisions ONNX Runtime runs only on a CUDA GPU (CUDA / TensorRT providers), with the compute capability each needs.
ONNXRUNTIME_GPU_ONLY: dict[Precision, tuple[int, int]] = {
    Precision.BF16: (8, 0), Precision.FP8: (8, 9), Precision.MXFP8: (10, 0), Precision.MXFP4: (10, 0), Precision.NVFP4: (10, 0),
}


def backend_refusal(profile: "TargetProfile", backend: "BackendSupport", precision: Precision) -> str | None:
    """Why ``backend`` cannot build ``precision`` on the device ``profile`` describes (None when it can): the static
    rules of the build's gating (edgekit.quantize.gating), checked when the profile loads. Whether the CPU has the flags
    OpenVINO's CPU plugin needs for bf16 / fp16 (``cpu.isa``, or the build host's for ``isa: host``) only the build checks."""
    cc = profile.gpu.sm if profile.gpu is not None and profile.gpu.is_cuda else None
    if backend.name is Backend.TENSORRT:
        if precision is Precision.INT8_DYNAMIC:
            return "int8-dynamic quantizes activations at run time, which only ONNX Runtime's CPU provider does; TensorRT runs static int8"
        need = TENSORRT_MIN_COMPUTE_CAPABILITY.get(precision)
        if need is not None and cc is not None and cc < need:
            return (f"tensorrt precision '{precision.value}' needs compute capability {need[0]}.{need[1]} or newer; "
                    f"this GPU is {profile.gpu.compute_capability}")  # type: ignore[union-attr]
        return None
    if backend.name is Backend.OPENVINO:
        device = backend.device or "CPU"
        floats = OPENVINO_DEVICE_FLOATS[device]
        if precision is Precision.FP32 and device == "NPU":
            return "the OpenVINO NPU compiles FP32 layers to FP16: list fp16 or int8"
        if precision in (Precision.FP32, Precision.INT8):
            return None
        if precision not in floats:
            return f"OpenVINO on {device} runs fp32, int8 and {', '.join(p.value for p in floats)}, not {precision.value}"
        return None  # the CPU flags a float needs (floats[precision]) are the build's check: a profile may list bf16 for CPUs that have them
    providers = [ep.name for ep in backend.execution_providers]
    if precision is Precision.INT8_DYNAMIC:
        if "CPUExecutionProvider" not in providers:
            return "int8-dynamic runs on ONNX Runtime's CPU provider, which these execution_providers do not include"
        if profile.npu is not None and providers[0] != "CPUExecutionProvider":
            return f"the NPU ({profile.npu.name}) runs static, pre-calibrated int8 only"
    need = ONNXRUNTIME_GPU_ONLY.get(precision)
    if need is not None:
        if not CUDA_PROVIDERS & set(providers):
            return f"{precision.value} has no CPU or NPU kernels in ONNX Runtime: it needs the CUDA or TensorRT execution provider"
        if cc is not None and cc < need:
            return f"onnxruntime precision '{precision.value}' needs compute capability {need[0]}.{need[1]} or newer; this GPU is {profile.gpu.compute_capability}"  # type: ignore[union-attr]
    return None


class TargetProfile(StrictModel):
    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=64, description="the file's stem; names output folders")
    display_name: str
    vendor: str
    family: str
    cpu: CPU
    gpu: GPU | None = None
    dla_cores: int = Field(default=0, ge=0, le=16, description="NVIDIA Deep Learning Accelerator cores (0 where none)")
    npu: NPU | None = None
    memory: Memory
    peak_throughput: tuple[PeakThroughput, ...] = Field(
        default=(), description="vendor peak figures, per precision and engine"
    )
    power_modes: dict[str, float] = Field(default_factory=dict, description="mode name -> watts")
    software: Software = Software()
    backends: tuple[BackendSupport, ...] = Field(min_length=1, description="in order of preference")
    build: BuildLimits = BuildLimits()
    notes: str | None = Field(default=None, description="what the numbers do not say (caveats, other accelerators)")

    @field_validator("power_modes")
    @classmethod
    def _positive_watts(cls, value: dict[str, float]) -> dict[str, float]:
        for mode, watts in value.items():
            if not mode.strip():
                raise ValueError("a power mode needs a name (an empty key is not one nvpmodel or a datasheet would use)")
            if watts <= 0:
                raise ValueError(f"power mode '{mode}' must have a positive wattage, got {watts}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "TargetProfile":
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend listed twice: {names}")
        if Backend.TENSORRT in names and (self.gpu is None or not self.gpu.is_cuda):
            raise ValueError("the tensorrt backend needs a gpu section with a CUDA GPU (gpu.api: cuda)")
        if self.dla_cores and (self.gpu is None or not self.gpu.is_cuda):
            raise ValueError("dla_cores needs a gpu section with a CUDA GPU (DLA ships on NVIDIA Jetson modules)")
        openvino_gpu = any(b.name is Backend.OPENVINO and b.device == "GPU" for b in self.backends)
        if openvino_gpu and (self.gpu is None or self.gpu.api != "openvino"):
            raise ValueError("the openvino backend's device GPU needs a gpu section with gpu.api: openvino (an Intel GPU)")
        cuda_providers = {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & {ep.name for b in self.backends for ep in b.execution_providers}
        if cuda_providers and (self.gpu is None or not self.gpu.is_cuda):
            raise ValueError(f"execution providers {', '.join(sorted(cuda_providers))} need a gpu section with a CUDA GPU (gpu.api: cuda)")
        engines_here = {"gpu": self.gpu is not None, "dla": self.dla_cores > 0, "npu": self.npu is not None}
        for index, peak in enumerate(self.peak_throughput):
            if not engines_here.get(peak.engine, True):
                section = {"gpu": "a gpu section", "dla": "dla_cores above 0", "npu": "an npu section"}[peak.engine]
                raise FieldError(("peak_throughput", index, "engine"),
                                 f"a peak for engine '{peak.engine}' needs {section} in this profile "
                                 f"(add it, or quote the figure under the engine this device has)")
            if peak.power_mode is not None and peak.power_mode not in self.power_modes:
                raise ValueError(
                    f"peak_throughput names power mode '{peak.power_mode}', which is not a key of power_modes "
                    f"({', '.join(self.power_modes) or 'none defined'})"
                )
        if self.npu is not None:
            providers = {ep.name for b in self.backends for ep in b.execution_providers}
            openvino_npu = any(b.name is Backend.OPENVINO and b.device == "NPU" for b in self.backends)
            if self.npu.execution_provider not in providers and not openvino_npu:
                raise ValueError(
                    f"npu.execution_provider '{self.npu.execution_provider}' is not among the onnxruntime backend's "
                    f"execution_providers ({', '.join(sorted(providers)) or 'none'})"
                )
        for index, backend in enumerate(self.backends):
            for item, precision in enumerate(backend.precisions):
                reason = backend_refusal(self, backend, precision)
                if reason is not None:
                    raise FieldError(("backends", index, "precisions", item),
                                     f"{reason} (remove {precision.value} from the {backend.name.value} precisions)")
        return self

    @property
    def default_backend(self) -> Backend:
        return self.backends[0].name

    def backend(self, name: Backend | str) -> BackendSupport:
        name = Backend(name)
        for support in self.backends:
            if support.name is name:
                return support
        raise TargetError(
            f"target '{self.name}' has no {name.value} backend",
            hint=f"its backends: {', '.join(b.name.value for b in self.backends)}",
        )

    def precisions(self, backend: Backend | str | None = None) -> tuple[Precision, ...]:
        return self.backend(backend or self.default_backend).precisions

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def target_json_schema() -> dict[str, Any]:
    """The JSON Schema of a target profile file (``edgekit schema target``), for editors and CI."""
    schema = TargetProfile.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgekit target profile"
    return schema


def load_target_file(path: Path) -> TargetProfile:
    """Load and validate one target profile file."""
    profile = load_model(Path(path), TargetProfile, TargetError, "target profile")
    if profile.name != Path(path).stem:
        raise TargetError(
            f"{path}: name '{profile.name}' does not match the file name '{Path(path).stem}'",
            hint=f"rename the file to {profile.name}.yaml or set name: {Path(path).stem}",
        )
    return profile


#: The file names a target profile may have.
PROFILE_SUFFIXES = (".yaml", ".yml")


class TargetRegistry:
    """The target profiles in a directory (``NAME.yaml`` or ``NAME.yml``), looked up by name."""

    def __init__(self, directory: Path = TARGETS_DIR) -> None:
        self.directory = Path(directory)

    def files(self) -> dict[str, list[Path]]:
        """Profile name -> its files in the directory (``NAME.yaml`` or ``NAME.yml``; both is an error on lookup)."""
        found: dict[str, list[Path]] = {}
        for suffix in PROFILE_SUFFIXES:
            for path in sorted(self.directory.glob(f"*{suffix}")):
                found.setdefault(path.stem, []).append(path)
        return found

    def names(self) -> list[str]:
        return sorted(self.files())

    def get(self, name: str) -> TargetProfile:
        """A registered target by name, or an explicit path to a ``.yaml``/``.yml`` profile. Anything else
        (``../x``, a folder, a missing file) is a :class:`TargetError` naming the known targets: a name is
        never joined to the registry's folder unless it is one of its profiles."""
        files = self.files()
        known = sorted(files)
        if name in known:
            if len(files[name]) > 1:
                raise TargetError(f"target '{name}' has two profiles in {self.directory}: {', '.join(p.name for p in files[name])}",
                                  hint="keep one of them")  # fmt: skip
            return load_target_file(files[name][0])
        candidate = Path(name)
        if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
            return load_target_file(candidate)
        if candidate.suffix in (".yaml", ".yml") or name in (".", "..") or any(sep in name for sep in ("/", "\\", os.sep)):
            raise TargetError(
                f"target '{name}' is neither a known target name nor an existing .yaml file"
                + (" (it is a directory)" if candidate.is_dir() else ""),
                hint=f"pass a name from `edgekit targets` or the path of a profile file ending in .yaml; known: {', '.join(known)}",
            )
        close = closest(name, known)
        raise TargetError(
            f"unknown target '{name}'" + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""),
            hint=f"`edgekit targets` lists them all; known: {', '.join(known)}",
        )

    def all(self) -> list[TargetProfile]:
        return [self.get(n) for n in self.names()]


#: The environment variable naming a folder of profiles to use instead of :data:`TARGETS_DIR`.
TARGETS_DIR_ENV = "EDGEKIT_TARGETS_DIR"


def targets_dir() -> Path:
    """The folder the registry reads: ``$EDGEKIT_TARGETS_DIR`` when set and not empty, else :data:`TARGETS_DIR`.
    A set variable naming a missing, unreadable or profile-less folder is a :class:`TargetError` naming the variable."""
    value = os.environ.get(TARGETS_DIR_ENV, "")
    if not value:
        return TARGETS_DIR
    folder = Path(value).expanduser()
    hint = f"point {TARGETS_DIR_ENV} at a folder of NAME.yaml target profiles, or unset it to use {TARGETS_DIR}"
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise TargetError(f"{TARGETS_DIR_ENV}={value}: {why}", hint=hint)
    try:
        entries = [entry.name for entry in os.scandir(folder)]
    except OSError as exc:
        raise TargetError(f"{TARGETS_DIR_ENV}={value}: cannot read the folder ({exc.strerror or exc})", hint=hint) from exc
    if not any(Path(entry).suffix in PROFILE_SUFFIXES for entry in entries):
        raise TargetError(f"{TARGETS_DIR_ENV}={value}: the folder has no target profiles (*.yaml, *.yml)", hint=hint)
    return folder


@lru_cache(maxsize=None)
def _registry_of(directory: Path) -> TargetRegistry:
    return TargetRegistry(directory)


def default_registry() -> TargetRegistry:
    """The registry of ``$EDGEKIT_TARGETS_DIR`` when set (it replaces the shipped ``targets/``), else of ``targets/``."""
    return _registry_of(targets_dir())


def get_target(name: str) -> TargetProfile:
    """Look up a target of :func:`default_registry` by name (or load a ``.yaml`` path)."""
    return default_registry().get(name)
