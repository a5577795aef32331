"""The calibration cache: keys, round trip, and corrupt files that are ignored and recomputed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.quantize.calibration import (
    CacheKey,
    CalibrationCache,
    CalibrationError,
    CalibratorSpec,
    TensorRange,
    calibrate,
    hash_calibration_data,
    hash_model_files,
)

from .conftest import mlp_model

ENTROPY = CalibratorSpec.create("entropy")


def test_round_trip(tmp_path: Path, mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    cache = CalibrationCache(tmp_path / "cache")
    key = CacheKey.create(mlp_path, mlp_batches, ENTROPY)
    assert cache.load(key) is None
    ranges = {"x": TensorRange(-2.5, 2.5, "entropy", True), "act": TensorRange(0.0, 1.25, "entropy", False)}
    path = cache.save(key, ranges)
    assert path == cache.path_for(key) and path.parent == tmp_path / "cache"
    assert cache.load(key) == ranges
    stored = json.loads(path.read_text())
    assert stored["key"]["calibrator"] == "entropy" and stored["key"]["options"]["num_bins"] == 2048
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_key_is_deterministic_and_follows_model_data_and_calibrator(tmp_path: Path, mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]]) -> None:
    key = CacheKey.create(mlp_path, mlp_batches, ENTROPY)
    reordered_keys = [{"labels": b["labels"], "x": b["x"].copy()} for b in mlp_batches]
    assert CacheKey.create(mlp_path, reordered_keys, ENTROPY).digest == key.digest

    changed_value = [dict(b) for b in mlp_batches]
    changed_value[2] = {**changed_value[2], "x": changed_value[2]["x"].copy()}
    changed_value[2]["x"][0, 0] += 1e-3
    reshaped = [{**b, "x": b["x"].reshape(4, 6)} for b in mlp_batches]
    retyped = [{**b, "labels": b["labels"].astype(np.int32)} for b in mlp_batches]
    reordered_batches = mlp_batches[::-1]
    data_hashes = {hash_calibration_data(d) for d in (mlp_batches, changed_value, reshaped, retyped, reordered_batches, mlp_batches[:2])}
    assert len(data_hashes) == 6

    other_model = tmp_path / "other.onnx"
    onnx.save(mlp_model(seed=99), str(other_model))
    variants = {
        CacheKey.create(other_model, mlp_batches, ENTROPY).digest,
        CacheKey.create(mlp_path, changed_value, ENTROPY).digest,
        CacheKey.create(mlp_path, mlp_batches, CalibratorSpec.create("entropy", num_bins=4096)).digest,
        CacheKey.create(mlp_path, mlp_batches, CalibratorSpec.create("percentile")).digest,
        CacheKey.create(mlp_path, mlp_batches, ENTROPY, tensor_names=["x"]).digest,
    }
    assert key.digest not in variants and len(variants) == 5


def test_model_hash_covers_external_data(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(path), save_as_external_data=True, location="mlp.bin", size_threshold=0)
    before = hash_model_files(path)
    weights = tmp_path / "mlp.bin"
    data = bytearray(weights.read_bytes())
    data[0] ^= 1
    weights.write_bytes(bytes(data))
    assert hash_model_files(path) != before


def test_corrupt_cache_file_is_ignored_with_a_warning_and_recomputed(
    tmp_path: Path, mlp_path: Path, mlp_batches: list[dict[str, np.ndarray]], caplog: pytest.LogCaptureFixture
) -> None:
    cache = CalibrationCache(tmp_path / "cache")
    first = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert not first.from_cache and first.cache_path is not None and first.cache_path.is_file()
    assert list(first.ranges) == ["x", "activated"]

    second = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert second.from_cache and second.ranges == first.ranges

    first.cache_path.write_text('{"format": "edgekit-calibration-cache", "ranges": {trunc')
    with caplog.at_level(logging.WARNING, logger="edgekit.quantize.calibration.cache"):
        third = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert not third.from_cache and third.ranges == first.ranges
    assert "ignoring calibration cache" in caplog.text and "recomputed" in caplog.text
    assert cache.load(third.key) == first.ranges  # rewritten whole


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ("[1, 2]", "not an edgekit calibration cache"),
        ('{"format": "edgekit-calibration-cache", "key": {"version": 0}, "ranges": {}}', "stored key does not match"),
        ("KEY", "'ranges' must be an object"),
        ("BAD_RANGE", "min 3.0 > max 1.0"),
    ],
)
def test_unusable_cache_contents_are_ignored(tmp_path: Path, document: str, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    key = CacheKey("m" * 64, "d" * 64, "minmax", (("symmetric", True),))
    cache = CalibrationCache(tmp_path)
    if document == "KEY":
        document = json.dumps({"format": "edgekit-calibration-cache", "key": key.to_json(), "ranges": [1]})
    elif document == "BAD_RANGE":
        bad = {"min": 3.0, "max": 1.0, "method": "minmax", "symmetric": False}
        document = json.dumps({"format": "edgekit-calibration-cache", "key": key.to_json(), "ranges": {"t": bad}})
    cache.path_for(key).write_text(document)
    with caplog.at_level(logging.WARNING):
        assert cache.load(key) is None
    assert reason in caplog.text


def test_unwritable_cache_and_unhashable_data_are_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    key = CacheKey("m" * 64, "d" * 64, "minmax", ())
    with pytest.raises(CalibrationError, match="cannot write the calibration cache") as info:
        CalibrationCache(blocker / "cache").save(key, {})
    assert "writable" in str(info.value)
    with pytest.raises(CalibrationError, match="calibration batch 0: 'x' is not a numeric NumPy array"):
        hash_calibration_data([{"x": np.array([object()])}])
    with pytest.raises(CalibrationError, match="calibration batch 1 is a tuple"):
        hash_calibration_data([{"x": np.zeros(1)}, ()])


def test_the_cache_records_what_the_calibration_pass_took_and_a_reuse_reports_it(tmp_path: Path, mlp_path: Path,
                                                                                  mlp_batches: list[dict[str, np.ndarray]]) -> None:
    """``--precision auto`` estimates a plain int8 build, which calibrates; when its ranges come from an earlier
    build's cache it counts what that calibration took, recorded in the cache file."""
    cache = CalibrationCache(tmp_path / "cache")
    first = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert not first.from_cache and first.seconds > 0
    assert cache.recorded_seconds(first.key) == pytest.approx(first.seconds, abs=1e-3)
    again = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert again.from_cache and again.ranges == first.ranges and again.seconds == pytest.approx(first.seconds, abs=1e-3)
    # a cache file written before the seconds were recorded: the ranges are reused, their cost is unknown (0)
    stored = json.loads(first.cache_path.read_text())
    del stored["seconds"]
    first.cache_path.write_text(json.dumps(stored))
    older = calibrate(mlp_path, mlp_batches, ENTROPY, cache=cache)
    assert older.from_cache and older.ranges == first.ranges and older.seconds == 0.0 and cache.recorded_seconds(first.key) is None
