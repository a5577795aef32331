"""Calibration ranges stored as JSON, keyed by what they were computed from.

The key is the SHA-256 of the model file(s), the SHA-256 of the calibration data (each batch's arrays,
by input name, with dtype and shape), the calibrator's name and options, and the tensors asked for. A
cache file that cannot be read or does not match its key is ignored with a warning, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.quantize.calibration.errors import CalibrationError
from edgekit.quantize.calibration.observers import CalibratorSpec
from edgekit.quantize.calibration.onnx_files import external_data_files, load_model_proto
from edgekit.quantize.calibration.ranges import TensorRange
from edgekit_runtime.hashing import sha256_file

log = logging.getLogger(__name__)

CACHE_FORMAT = "edgekit-calibration-cache"
#: Bump when the calibrators change in a way that changes their ranges, so old caches stop matching.
CACHE_VERSION = 1


def hash_model_files(model_path: Path) -> str:
    """SHA-256 over the model file and each external-data file (by location, in sorted order)."""
    model_path = Path(model_path)
    digest = hashlib.sha256()
    digest.update(f"model\0{sha256_file(model_path)}\n".encode())
    for location, path in external_data_files(load_model_proto(model_path), model_path):
        digest.update(f"external\0{location}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def hash_calibration_data(batches: Iterable[Mapping[str, np.ndarray]]) -> str:
    """SHA-256 over the batches in order: per batch, per input name (sorted), the name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for index, batch in enumerate(batches):
        if not isinstance(batch, Mapping):
            raise CalibrationError(f"calibration batch {index} is a {type(batch).__name__}, not a dict of input name -> array")
        digest.update(f"batch\0{index}\0{len(batch)}\n".encode())
        for name in sorted(batch):
            array = batch[name]
            if isinstance(array, np.ndarray) and array.dtype.hasobject and all(isinstance(item, str) for item in array.reshape(-1)):
                digest.update(f"{name}\0strings\0{array.shape}\n".encode())  # a string input: each element's length and UTF-8
                for item in array.reshape(-1):
                    data = item.encode("utf-8")
                    digest.update(len(data).to_bytes(8, "little") + data)
                continue
            if not isinstance(array, np.ndarray) or array.dtype.hasobject:
                raise CalibrationError(f"calibration batch {index}: '{name}' is not a numeric NumPy array or an array of str ({type(array).__name__})")
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\n".encode())
            digest.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    model_sha256: str
    data_sha256: str
    calibrator: str
    options: tuple[tuple[str, Any], ...]
    tensor_names: tuple[str, ...] | None = None

    @classmethod
    def create(cls, model_path: Path, batches: Iterable[Mapping[str, np.ndarray]], calibrator: CalibratorSpec, tensor_names: Sequence[str] | None = None) -> CacheKey:
        return cls(
            model_sha256=hash_model_files(model_path),
            data_sha256=hash_calibration_data(batches),
            calibrator=calibrator.method,
            options=tuple(sorted(calibrator.options_json().items())),
            tensor_names=None if tensor_names is None else tuple(tensor_names),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": CACHE_VERSION,
            "model_sha256": self.model_sha256,
            "data_sha256": self.data_sha256,
            "calibrator": self.calibrator,
            "options": dict(self.options),
            "tensor_names": None if self.tensor_names is None else list(self.tensor_names),
        }

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


class CalibrationCache:
    """One JSON file per key under ``directory``: ``calibration-<digest>.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path_for(self, key: CacheKey) -> Path:
        return self.directory / f"calibration-{key.digest}.json"

    def load(self, key: CacheKey) -> dict[str, TensorRange] | None:
        """The cached ranges for ``key``, or ``None`` when there are none or the file is unusable."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return _ranges_from_json(data, key, path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, CalibrationError) as exc:
            log.warning("ignoring calibration cache %s (%s); the ranges will be recomputed", path, str(exc).splitlines()[0])
            return None

    def recorded_seconds(self, key: CacheKey) -> float | None:
        """The seconds the calibration pass behind ``key``'s ranges took when it ran (``None``: not recorded)."""
        try:
            seconds = json.loads(self.path_for(key).read_text(encoding="utf-8")).get("seconds")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            return None
        return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else None

    def save(self, key: CacheKey, ranges: Mapping[str, TensorRange], seconds: float | None = None) -> Path:
        """Write ``ranges`` for ``key`` atomically; returns the file's path (the pipeline bundles it). ``seconds``:
        what the calibration pass took, recorded so that a later build reusing the ranges knows what they cost."""
        path = self.path_for(key)
        document: dict[str, object] = {
            "format": CACHE_FORMAT,
            "key": key.to_json(),
            "ranges": {name: value.to_json() for name, value in ranges.items()},
        }
        if seconds is not None:
            document["seconds"] = round(seconds, 3)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".calibration-", suffix=".tmp", dir=self.directory)
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(document, stream, indent=1)
            os.replace(temporary, path)
        except OSError as exc:
            raise CalibrationError(f"cannot write the calibration cache {path}: {exc}", hint="make the cache directory writable") from None
        return path


def _ranges_from_json(data: object, key: CacheKey, path: Path) -> dict[str, TensorRange]:
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise CalibrationError(f"{path}: not an edgekit calibration cache")
    if data.get("key") != key.to_json():
        raise CalibrationError(f"{path}: stored key does not match (other model, data, calibrator or version)")
    ranges = data.get("ranges")
    if not isinstance(ranges, dict):
        raise CalibrationError(f"{path}: 'ranges' must be an object")
    return {name: TensorRange.from_json(value, f"{path}: ranges.{name}") for name, value in ranges.items()}
