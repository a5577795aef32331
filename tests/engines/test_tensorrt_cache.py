"""Engine and timing cache keys, the cache directory, and getting an engine: bundle, cache or build.
A cached engine that fails to deserialize is evicted and rebuilt, never fatal."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import fields, replace
from pathlib import Path

import pytest

from edgekit.engines.tensorrt.cache import engine_key
from edgekit_runtime.tensorrt_engines.cache import (
    DeviceIdentity,
    EngineCache,
    EngineCacheKey,
    TimingCacheKey,
    default_cache_dir,
    engine_mismatch,
)
from edgekit_runtime.tensorrt_engines.errors import EngineBuildError
from edgekit_runtime.tensorrt_engines.materialise import BuildOutput, ShippedEngine, materialise_engine
from edgekit_runtime.tensorrt_engines.plan import TimingCachePolicy

ORIN = DeviceIdentity.from_cuda("Orin", "8.7", 16, "10.3.0")
KEY = EngineCacheKey.for_device("a" * 64, "b" * 64, ORIN)


def test_device_identity_carries_the_sm_count() -> None:
    assert ORIN == DeviceIdentity("Orin (16 SMs)", "8.7", "10.3.0")
    assert DeviceIdentity.from_cuda("Orin", "8.7", 8, "10.3.0") != ORIN  # Orin Nano is not AGX Orin
    assert ORIN.describe() == "TensorRT 10.3.0 on 'Orin (16 SMs)' (compute capability 8.7)"


@pytest.mark.parametrize("component", [f.name for f in fields(EngineCacheKey)])
def test_engine_key_changes_with_each_component(component: str) -> None:
    changed = replace(KEY, **{component: getattr(KEY, component) + "x"})
    assert changed.digest != KEY.digest


def test_engine_key_is_stable() -> None:
    assert EngineCacheKey.for_device("a" * 64, "b" * 64, DeviceIdentity.from_cuda("Orin", "8.7", 16, "10.3.0")).digest == KEY.digest
    assert len(KEY.digest) == 64 and KEY.digest == EngineCacheKey(**KEY.to_dict()).digest
    assert EngineCacheKey.from_dict(KEY.to_dict()) == KEY
    assert EngineCacheKey.from_dict({"model_sha256": "a"}) is None and EngineCacheKey.from_dict("key") is None


@pytest.mark.parametrize("component", [f.name for f in fields(TimingCacheKey)])
def test_timing_key_changes_with_gpu_and_version_only(component: str) -> None:
    timing = TimingCacheKey.for_device(ORIN)
    assert replace(timing, **{component: "other"}).digest != timing.digest
    other_model = EngineCacheKey.for_device("c" * 64, "d" * 64, ORIN)
    assert TimingCacheKey(other_model.gpu_name, other_model.compute_capability, other_model.tensorrt_version) == timing


def test_engine_key_from_a_model_file(tmp_path: Path) -> None:
    from edgekit.engines.tensorrt.plan import plan_tensorrt_build
    from edgekit.precision import Precision
    from edgekit.recipe import load_recipe
    from edgekit.target import get_target
    from tests.conftest import TINY_RECIPE

    (tmp_path / "r.yaml").write_text(TINY_RECIPE.format(factory="tiny_net"))
    plan = plan_tensorrt_build(load_recipe(tmp_path / "r.yaml"), get_target("jetson-agx-orin-64gb"), Precision.FP16)
    model = tmp_path / "model.onnx"
    model.write_bytes(b"model bytes")
    key = engine_key(model, plan, ORIN)
    assert key.model_sha256 == hashlib.sha256(b"model bytes").hexdigest()
    assert key.plan_digest == plan.digest and key.gpu_name == "Orin (16 SMs)"
    model.write_bytes(b"other model bytes")
    assert engine_key(model, plan, ORIN).digest != key.digest


def test_mismatch_names_both_sides() -> None:
    device = EngineCacheKey.for_device("a" * 64, "b" * 64, DeviceIdentity.from_cuda("NVIDIA H100 80GB HBM3", "9.0", 132, "10.13.0"))
    message = str(engine_mismatch(KEY, device, "bundle/tensorrt/model.engine"))
    assert "engine 'bundle/tensorrt/model.engine' cannot run on this device" in message
    assert "TensorRT 10.3.0 built it, this device has TensorRT 10.13.0" in message
    assert "built for 'Orin (16 SMs)' (compute capability 8.7), this device is 'NVIDIA H100 80GB HBM3 (132 SMs)' (compute capability 9.0)" in message
    assert "tensorrt/plan.json" in message


def test_default_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tensorrt"
    monkeypatch.delenv("EDGEKIT_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "edgekit" / "tensorrt"


def test_cache_layout_and_records(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    path = cache.store_engine(KEY, b"engine", {"build_seconds": 1.5})
    assert path == tmp_path / "engines" / f"{KEY.digest[:32]}.engine"
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["key"] == KEY.to_dict() and record["size_bytes"] == 6 and record["build_seconds"] == 1.5
    assert cache.load_engine(KEY) == b"engine"
    timing = TimingCacheKey.for_device(ORIN)
    assert cache.store_timing(timing, b"timing") == tmp_path / "timing" / f"{timing.digest[:32]}.cache"
    assert cache.load_timing(timing) == b"timing"
    assert cache.ort_tensorrt_ep_dir(KEY) == tmp_path / "ort-tensorrt-ep" / KEY.digest[:32]
    cache.evict_engine(KEY)
    assert cache.load_engine(KEY) is None and not path.exists()


def test_an_engine_filed_under_the_wrong_key_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = EngineCache(tmp_path)
    path = cache.store_engine(KEY, b"engine")
    record = json.loads(path.with_suffix(".json").read_text())
    record["key"]["tensorrt_version"] = "10.0.0"
    path.with_suffix(".json").write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        assert cache.load_engine(KEY) is None
    assert "its record does not match the key" in caplog.text


class Builds:
    """Counts builds and hands out engines; ``fails`` marks bytes that do not deserialize."""

    def __init__(self, engine: bytes = b"fresh engine", timing: bytes | None = b"learnt timing") -> None:
        self.engine, self.timing = engine, timing
        self.timing_seen: list[bytes | None] = []
        self.fails: set[bytes] = set()

    def build(self, timing: bytes | None) -> BuildOutput:
        self.timing_seen.append(timing)
        return BuildOutput(engine=self.engine, timing_cache=self.timing, seconds=0.25)

    def deserialize(self, data: bytes) -> str | None:
        return None if data in self.fails else f"engine<{data.decode()}>"


def test_builds_once_then_uses_the_cache(tmp_path: Path) -> None:
    cache, builds = EngineCache(tmp_path), Builds()
    first = materialise_engine(KEY, cache=cache, deserialize=builds.deserialize, build=builds.build)
    assert (first.source, first.engine, first.path) == ("built", "engine<fresh engine>", cache.engine_path(KEY))
    second = materialise_engine(KEY, cache=cache, deserialize=builds.deserialize, build=builds.build)
    assert (second.source, second.engine) == ("cache", "engine<fresh engine>")
    assert builds.timing_seen == [None]  # one build, which found no timing cache yet
    assert cache.load_timing(TimingCacheKey.for_device(ORIN)) == b"learnt timing"


def test_a_corrupt_cached_engine_is_rebuilt_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache, builds = EngineCache(tmp_path), Builds()
    cache.store_engine(KEY, b"truncated")
    builds.fails.add(b"truncated")
    with caplog.at_level(logging.WARNING):
        result = materialise_engine(KEY, cache=cache, deserialize=builds.deserialize, build=builds.build)
    assert result.source == "built" and result.engine == "engine<fresh engine>"
    assert "failed to deserialize (TensorRT returned no engine); evicted and rebuilt" in result.notes[0]
    assert "evicted and rebuilt" in caplog.text
    assert cache.load_engine(KEY) == b"fresh engine"


def test_a_deserializer_that_raises_counts_as_a_failure(tmp_path: Path) -> None:
    cache, builds = EngineCache(tmp_path), Builds()
    cache.store_engine(KEY, b"old")

    def deserialize(data: bytes) -> str | None:
        if data == b"old":
            raise RuntimeError("Serialization assertion magicTagRead == kMAGIC_TAG failed")
        return "ok"

    result = materialise_engine(KEY, cache=cache, deserialize=deserialize, build=builds.build)
    assert result.source == "built"
    assert "RuntimeError: Serialization assertion magicTagRead == kMAGIC_TAG failed" in result.notes[0]


def test_the_bundle_engine_is_used_only_on_its_own_device(tmp_path: Path) -> None:
    shipped_path = tmp_path / "model.engine"
    shipped_path.write_bytes(b"host engine")
    builds = Builds()
    same = materialise_engine(KEY, cache=EngineCache(tmp_path / "c1"), deserialize=builds.deserialize, build=builds.build,
                              shipped=ShippedEngine(shipped_path, KEY))
    assert (same.source, same.engine, same.path) == ("bundle", "engine<host engine>", shipped_path)

    nano = EngineCacheKey.for_device("a" * 64, "b" * 64, DeviceIdentity.from_cuda("Orin", "8.7", 8, "10.3.0"))
    other = materialise_engine(nano, cache=EngineCache(tmp_path / "c2"), deserialize=builds.deserialize, build=builds.build,
                               shipped=ShippedEngine(shipped_path, KEY))
    assert other.source == "built"
    assert "was not made for this device (it was built for 'Orin (16 SMs)' (compute capability 8.7), this device is 'Orin (8 SMs)'" in other.notes[0]

    unkeyed = materialise_engine(KEY, cache=EngineCache(tmp_path / "c3"), deserialize=builds.deserialize, build=builds.build,
                                 shipped=ShippedEngine(shipped_path, None))
    assert unkeyed.source == "built" and "records no cache key" in unkeyed.notes[0]

    builds.fails.add(b"host engine")
    broken = materialise_engine(KEY, cache=EngineCache(tmp_path / "c4"), deserialize=builds.deserialize, build=builds.build,
                                shipped=ShippedEngine(shipped_path, KEY))
    assert broken.source == "built" and "the bundle's engine" in broken.notes[0] and "failed to deserialize" in broken.notes[0]


@pytest.mark.parametrize(("policy", "read", "written"), [
    (TimingCachePolicy.SHARED, True, True),
    (TimingCachePolicy.READ_ONLY, True, False),
    (TimingCachePolicy.OFF, False, False),
])
def test_timing_cache_policy(tmp_path: Path, policy: TimingCachePolicy, read: bool, written: bool) -> None:
    cache, builds = EngineCache(tmp_path), Builds(timing=b"new timing")
    timing_key = TimingCacheKey.for_device(ORIN)
    cache.store_timing(timing_key, b"old timing")
    materialise_engine(KEY, cache=cache, deserialize=builds.deserialize, build=builds.build, timing_policy=policy)
    assert builds.timing_seen == [b"old timing" if read else None]
    assert cache.load_timing(timing_key) == (b"new timing" if written else b"old timing")


def test_a_fresh_engine_that_does_not_load_is_a_build_error(tmp_path: Path) -> None:
    cache, builds = EngineCache(tmp_path), Builds()
    builds.fails.add(b"fresh engine")
    with pytest.raises(EngineBuildError) as caught:
        materialise_engine(KEY, cache=cache, deserialize=builds.deserialize, build=builds.build)
    assert "the engine just built for TensorRT 10.3.0 on 'Orin (16 SMs)' (compute capability 8.7) failed to deserialize" in str(caught.value)
    assert "same TensorRT release" in str(caught.value)
    assert cache.load_engine(KEY) is None
