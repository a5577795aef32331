"""Engine and timing caches: what a serialized engine is keyed by, and where it lies on disk.

A TensorRT engine only runs with the TensorRT version that built it, on the GPU model it was built for.
So an engine is cached under the SHA-256 of (bundle model sha256, TensorRT version, GPU name, compute
capability, plan digest), and the builder's timing cache under (GPU name, compute capability, TensorRT
version)::

    <cache root>/                         $EDGEKIT_CACHE_DIR/tensorrt, default ~/.cache/edgekit/tensorrt
      engines/<key>.engine                a serialized engine
      engines/<key>.json                  its key (every component spelled out) and how it was made
      timing/<key>.cache                  a TensorRT timing cache, shared by every build on one GPU + version
      timing/<key>.json
      ort-tensorrt-ep/<engine key>/       ONNX Runtime TensorRT-EP engine and timing caches, keyed the same way

Nothing is ever written into a bundle directory (the device verifies that no unlisted file is there).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.tensorrt_engines.errors import EngineMismatchError

logger = logging.getLogger(__name__)

CACHE_ENV = "EDGEKIT_CACHE_DIR"
KEY_CHARS = 32  # of the SHA-256 hex digest, in file names


def default_cache_dir() -> Path:
    """``$EDGEKIT_CACHE_DIR/tensorrt``, or ``~/.cache/edgekit/tensorrt``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "edgekit")) / "tensorrt"


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class DeviceIdentity:
    """The GPU and TensorRT an engine is built with or loaded on."""

    gpu_name: str
    compute_capability: str  # "8.7"
    tensorrt_version: str  # "10.3.0"

    def describe(self) -> str:
        return f"TensorRT {self.tensorrt_version} on '{self.gpu_name}' (compute capability {self.compute_capability})"

    @classmethod
    def from_cuda(cls, name: str, compute_capability: str, multiprocessors: int, tensorrt_version: str) -> DeviceIdentity:
        """The identity of a CUDA device. Its name carries the SM count, because every Jetson Orin module
        reports the name "Orin" (an AGX Orin engine must not be taken for an Orin Nano's)."""
        return cls(f"{name} ({multiprocessors} SMs)", compute_capability, tensorrt_version)


@dataclass(frozen=True)
class TimingCacheKey:
    gpu_name: str
    compute_capability: str
    tensorrt_version: str

    @classmethod
    def for_device(cls, device: DeviceIdentity) -> TimingCacheKey:
        return cls(device.gpu_name, device.compute_capability, device.tensorrt_version)

    @property
    def digest(self) -> str:
        return _digest({"kind": "timing", **asdict(self)})


@dataclass(frozen=True)
class EngineCacheKey:
    model_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    plan_digest: str

    @classmethod
    def for_device(cls, model_sha256: str, plan_digest: str, device: DeviceIdentity) -> EngineCacheKey:
        return cls(model_sha256, device.tensorrt_version, device.gpu_name, device.compute_capability, plan_digest)

    @property
    def digest(self) -> str:
        return _digest({"kind": "engine", **asdict(self)})

    @property
    def device(self) -> DeviceIdentity:
        return DeviceIdentity(self.gpu_name, self.compute_capability, self.tensorrt_version)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> EngineCacheKey | None:
        """The key in ``data``, or None when it is not a complete key."""
        if not isinstance(data, dict):
            return None
        try:
            values = {name: data[name] for name in cls.__dataclass_fields__}
        except KeyError:
            return None
        if not all(isinstance(v, str) for v in values.values()):
            return None
        return cls(**values)

    def differences(self, other: EngineCacheKey) -> list[str]:
        """What differs between this key (an engine's) and ``other`` (the device's), in words."""
        found = []
        if self.tensorrt_version != other.tensorrt_version:
            found.append(f"TensorRT {self.tensorrt_version} built it, this device has TensorRT {other.tensorrt_version}")
        if (self.gpu_name, self.compute_capability) != (other.gpu_name, other.compute_capability):
            found.append(f"it was built for '{self.gpu_name}' (compute capability {self.compute_capability}), "
                         f"this device is '{other.gpu_name}' (compute capability {other.compute_capability})")
        if self.model_sha256 != other.model_sha256:
            found.append(f"it was built from model sha256 {self.model_sha256[:12]}..., the bundle's is {other.model_sha256[:12]}...")
        if self.plan_digest != other.plan_digest:
            found.append(f"it was built from plan {self.plan_digest[:12]}..., the bundle's is {other.plan_digest[:12]}...")
        return found


def engine_mismatch(engine: EngineCacheKey, device: EngineCacheKey, where: str) -> EngineMismatchError:
    """The error for an engine that cannot run here, naming both sides."""
    return EngineMismatchError(
        f"engine '{where}' cannot run on this device: " + "; ".join(engine.differences(device)),
        hint="TensorRT engines are tied to the TensorRT version and GPU that built them: let the device build its "
        "own from the bundle's tensorrt/plan.json (the runner does this unless the engine is forced), or rebuild "
        "the bundle on a host with the same GPU and TensorRT",
    )


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class EngineCache:
    """Serialized engines and timing caches under one root directory (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    def engine_path(self, key: EngineCacheKey) -> Path:
        return self.root / "engines" / f"{key.digest[:KEY_CHARS]}.engine"

    def timing_path(self, key: TimingCacheKey) -> Path:
        return self.root / "timing" / f"{key.digest[:KEY_CHARS]}.cache"

    def ort_tensorrt_ep_dir(self, key: EngineCacheKey) -> Path:
        return self.root / "ort-tensorrt-ep" / key.digest[:KEY_CHARS]

    def load_engine(self, key: EngineCacheKey) -> bytes | None:
        """The cached engine for ``key``; None when absent, or when its record names another key."""
        path = self.engine_path(key)
        if not path.is_file():
            return None
        recorded = _read_json(path.with_suffix(".json"))
        if EngineCacheKey.from_dict(recorded.get("key")) != key:
            logger.warning("ignoring cached engine %s: its record does not match the key it is filed under", path)
            return None
        return path.read_bytes()

    def store_engine(self, key: EngineCacheKey, engine: bytes, details: dict[str, Any] | None = None) -> Path:
        path = self.engine_path(key)
        _write_atomically(path, engine)
        record = {"key": key.to_dict(), "size_bytes": len(engine), **(details or {})}
        _write_atomically(path.with_suffix(".json"), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        return path

    def evict_engine(self, key: EngineCacheKey) -> None:
        for path in (self.engine_path(key), self.engine_path(key).with_suffix(".json")):
            path.unlink(missing_ok=True)

    def load_timing(self, key: TimingCacheKey) -> bytes | None:
        path = self.timing_path(key)
        return path.read_bytes() if path.is_file() else None

    def store_timing(self, key: TimingCacheKey, data: bytes) -> Path:
        path = self.timing_path(key)
        _write_atomically(path, data)
        _write_atomically(path.with_suffix(".json"), (json.dumps(asdict(key), indent=2, sort_keys=True) + "\n").encode())
        return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
