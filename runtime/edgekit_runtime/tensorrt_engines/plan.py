"""The TensorRT build plan a bundle carries (``tensorrt/plan.json``): everything the engine build needs
besides the ONNX model, so that the host and the device build the same engine.

The host writes it (``edgekit.engines.tensorrt.plan``); the device reads it back with
:meth:`TensorRTBuildPlan.from_dict` and builds at first load when no matching engine is cached.
Its :attr:`~TensorRTBuildPlan.digest` is part of the engine cache key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from edgekit_runtime.tensorrt_engines.errors import PlanError

PLAN_SCHEMA_VERSION = 1
#: Bundle-relative path of the plan.
PLAN_PATH = "tensorrt/plan.json"
#: Precisions DLA runs; every other layer type or precision falls back to the GPU (or fails).
DLA_PRECISIONS = ("fp16", "int8")
#: Builder precision flags a weakly typed TensorRT 10 network may carry (names of ``trt.BuilderFlag`` members).
PRECISION_FLAGS = ("FP16", "BF16", "INT8", "FP8", "INT4", "FP4")


class NetworkTyping(str, Enum):
    WEAK = "weak"  # TensorRT 10 only: builder flags allow lower-precision kernels
    STRONG = "strong"  # every tensor's type comes from the ONNX model (required by TensorRT 11)


class OnnxPrecision(str, Enum):
    """How the bundle's ONNX model expresses the precision."""

    AS_EXPORTED = "as-exported"  # the FP32 export (fp32 builds, and TensorRT 10 fp16/bf16 via builder flags)
    FP16_CAST = "fp16-cast"  # cast to FP16 on the host (TensorRT 11 strong typing), inputs/outputs kept
    QDQ = "qdq"  # explicit Q/DQ nodes from the quantize stage (int8, fp8, int4, fp4 formats)


class TimingCachePolicy(str, Enum):
    SHARED = "shared"  # read the (GPU, TensorRT version) timing cache and write back what the build learnt
    READ_ONLY = "read-only"  # read it, never write it
    OFF = "off"  # no timing cache at all


@dataclass(frozen=True)
class ShapeRange:
    """One input's min/opt/max shapes in an optimisation profile."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise PlanError(f"input '{self.name}': min/opt/max shapes have different ranks ({self.min}, {self.opt}, {self.max})")
        if any(not lo <= mid <= hi for lo, mid, hi in zip(self.min, self.opt, self.max)) or any(lo < 0 for lo in self.min):
            raise PlanError(f"input '{self.name}': need 0 <= min <= opt <= max per dimension, got {self.min}, {self.opt}, {self.max}")

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(lo <= s <= hi for lo, s, hi in zip(self.min, shape, self.max))

    @property
    def static(self) -> bool:
        return self.min == self.max

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class OptimizationProfile:
    """A TensorRT optimisation profile: a shape range per input."""

    name: str
    shapes: tuple[ShapeRange, ...]

    def covers(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        return all(r.name in shapes and r.contains(shapes[r.name]) for r in self.shapes)

    def span(self) -> int:
        """How wide the profile is (sum of max - min over all dims): the narrowest covering one is picked."""
        return sum(hi - lo for r in self.shapes for lo, hi in zip(r.min, r.max))

    @property
    def static(self) -> bool:
        return all(r.static for r in self.shapes)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shapes": [r.to_dict() for r in self.shapes]}


@dataclass(frozen=True)
class DlaPolicy:
    """Run on DLA core ``core``; layers DLA cannot run go to the GPU only with ``gpu_fallback``."""

    core: int
    gpu_fallback: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"core": self.core, "gpu_fallback": self.gpu_fallback}


@dataclass(frozen=True)
class TensorRTBuildPlan:
    """How to build one bundle's TensorRT engine. Frozen; JSON round-trips through :meth:`to_dict`."""

    target: str
    gpu_name: str
    compute_capability: str  # "8.7"
    precision: str  # edgekit precision name: "fp32", "fp16", "int8", ...
    tensorrt_major: int
    api: str  # TensorRTApi value: "tensorrt10" | "tensorrt11"
    network_typing: NetworkTyping
    onnx_precision: OnnxPrecision
    builder_flags: tuple[str, ...]  # PRECISION_FLAGS members; only with weak typing
    profiles: tuple[OptimizationProfile, ...]
    workspace_mb: int
    builder_optimization_level: int = 3
    dla: DlaPolicy | None = None
    sparse_weights: bool = False
    timing_cache: TimingCachePolicy = TimingCachePolicy.SHARED
    notes: tuple[str, ...] = field(default=(), compare=False)
    schema_version: int = PLAN_SCHEMA_VERSION

    def __post_init__(self) -> None:
        unknown = [f for f in self.builder_flags if f not in PRECISION_FLAGS]
        if unknown:
            raise PlanError(f"unknown builder flag(s) {unknown}; known: {', '.join(PRECISION_FLAGS)}")
        if self.builder_flags and self.network_typing is NetworkTyping.STRONG:
            raise PlanError(f"builder flags {list(self.builder_flags)} need a weakly typed network; this plan is strongly typed")
        if not 0 <= self.builder_optimization_level <= 5:
            raise PlanError(f"builder_optimization_level must be 0..5, got {self.builder_optimization_level}")
        if self.workspace_mb <= 0:
            raise PlanError(f"workspace_mb must be positive, got {self.workspace_mb}")
        if not self.profiles:
            raise PlanError("a plan needs at least one optimisation profile")
        if self.dla is not None and self.precision not in DLA_PRECISIONS:
            raise PlanError(f"DLA runs only {' and '.join(DLA_PRECISIONS)}; this plan is {self.precision}")

    @property
    def workspace_bytes(self) -> int:
        return self.workspace_mb * (1 << 20)

    @property
    def compute_capability_tuple(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.profiles[0].shapes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "target": self.target,
            "gpu_name": self.gpu_name,
            "compute_capability": self.compute_capability,
            "precision": self.precision,
            "tensorrt_major": self.tensorrt_major,
            "api": self.api,
            "network_typing": self.network_typing.value,
            "onnx_precision": self.onnx_precision.value,
            "builder_flags": list(self.builder_flags),
            "profiles": [p.to_dict() for p in self.profiles],
            "workspace_mb": self.workspace_mb,
            "builder_optimization_level": self.builder_optimization_level,
            "dla": None if self.dla is None else self.dla.to_dict(),
            "sparse_weights": self.sparse_weights,
            "timing_cache": self.timing_cache.value,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def digest(self) -> str:
        """SHA-256 of the plan's canonical JSON without its notes (which do not change the engine)."""
        data = self.to_dict()
        data.pop("notes")
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> TensorRTBuildPlan:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PlanError(f"TensorRT build plan '{path}' is missing", hint="rebuild the bundle with `edgekit build --backend tensorrt`") from None
        except (OSError, ValueError) as err:
            raise PlanError(f"TensorRT build plan '{path}' cannot be read as JSON: {err}", hint="copy the bundle again or rebuild it") from err
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: object, *, where: str = "plan.json") -> TensorRTBuildPlan:
        """Parse a plan; a missing or malformed field raises :class:`PlanError` naming it."""
        if not isinstance(data, Mapping):
            raise PlanError(f"{where}: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise PlanError(
                f"{where}: schema_version {version!r} is not supported (this edgekit-runtime reads {PLAN_SCHEMA_VERSION})",
                hint="build the bundle and run it with the same edgekit release",
            )
        reader = _Fields(data, where)
        try:
            dla_data = data.get("dla")
            dla = None if dla_data is None else _Fields(dla_data, f"{where}: dla")
            return cls(
                target=reader.text("target"),
                gpu_name=reader.text("gpu_name"),
                compute_capability=reader.text("compute_capability"),
                precision=reader.text("precision"),
                tensorrt_major=reader.integer("tensorrt_major"),
                api=reader.text("api"),
                network_typing=reader.choice("network_typing", NetworkTyping),
                onnx_precision=reader.choice("onnx_precision", OnnxPrecision),
                builder_flags=tuple(reader.texts("builder_flags")),
                profiles=tuple(_profile(p, f"{where}: profiles[{i}]") for i, p in enumerate(reader.items("profiles"))),
                workspace_mb=reader.integer("workspace_mb"),
                builder_optimization_level=reader.integer("builder_optimization_level"),
                dla=None if dla is None else DlaPolicy(core=dla.integer("core"), gpu_fallback=dla.flag("gpu_fallback")),
                sparse_weights=reader.flag("sparse_weights"),
                timing_cache=reader.choice("timing_cache", TimingCachePolicy),
                notes=tuple(reader.texts("notes")),
            )
        except PlanError as err:
            if err.message.startswith(where):
                raise
            raise PlanError(f"{where}: {err.message}", hint=err.hint) from None


class _Fields:
    """Typed reads from one JSON object, each failure naming the field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise PlanError(f"{where}: expected a JSON object, got {data!r}")
        self.data, self.where = data, where

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise PlanError(f"{self.where}: field '{key}' is missing", hint="rebuild the bundle with the current edgekit")
        return self.data[key]

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or not value:
            raise PlanError(f"{self.where}: field '{key}' must be a non-empty string, got {value!r}")
        return value

    def integer(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise PlanError(f"{self.where}: field '{key}' must be an integer, got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise PlanError(f"{self.where}: field '{key}' must be true or false, got {value!r}")
        return value

    def items(self, key: str) -> list[Any]:
        value = self._get(key)
        if not isinstance(value, list):
            raise PlanError(f"{self.where}: field '{key}' must be a list, got {value!r}")
        return value

    def texts(self, key: str) -> list[str]:
        values = self.items(key)
        if not all(isinstance(v, str) for v in values):
            raise PlanError(f"{self.where}: field '{key}' must be a list of strings, got {values!r}")
        return values

    def choice(self, key: str, enum: type[Enum]) -> Any:
        value = self._get(key)
        allowed = [member.value for member in enum]
        if value not in allowed:
            raise PlanError(f"{self.where}: field '{key}' is {value!r}; expected one of {', '.join(allowed)}")
        return enum(value)

    def shape(self, key: str) -> tuple[int, ...]:
        values = self.items(key)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise PlanError(f"{self.where}: field '{key}' must be a list of integers, got {values!r}")
        return tuple(values)


def _profile(data: object, where: str) -> OptimizationProfile:
    fields = _Fields(data, where)
    shapes = []
    for index, entry in enumerate(fields.items("shapes")):
        shape = _Fields(entry, f"{where}.shapes[{index}]")
        shapes.append(ShapeRange(shape.text("name"), shape.shape("min"), shape.shape("opt"), shape.shape("max")))
    return OptimizationProfile(fields.text("name"), tuple(shapes))
