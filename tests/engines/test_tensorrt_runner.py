"""The TensorRT runner and its pycuda layer.

CPU tests: the runner is made from a real bundle's manifest, profile choice, and the errors a device
without TensorRT or CUDA gets. Tests marked ``gpu`` run the pycuda buffer/stream layer and the runner
for real; they skip with the reason where pycuda, a CUDA device or TensorRT is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.backends import BACKENDS, create_runner
from edgekit_runtime.backends.tensorrt import TensorRTRunner, choose_profile
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BackendError
from edgekit_runtime.tensorrt_engines.cache import DeviceIdentity, EngineCacheKey
from edgekit_runtime.tensorrt_engines.errors import CudaUnavailableError, PlanError, TensorRTUnavailableError
from edgekit_runtime.tensorrt_engines.plan import (
    PLAN_PATH,
    NetworkTyping,
    OnnxPrecision,
    OptimizationProfile,
    ShapeRange,
    TensorRTBuildPlan,
)
from tests.runtime.tiny_bundle import build_bundle, load_manifest, reference_logits, write_manifest


def linear_plan(*, static: bool = False) -> TensorRTBuildPlan:
    """A plan for the runtime tests' tiny linear bundle: image float32[batch, 1, 8, 8], batch 1..128."""
    full = ShapeRange("image", (1, 1, 8, 8), (4, 1, 8, 8), (128, 1, 8, 8)) if not static else ShapeRange("image", (2, 1, 8, 8), (2, 1, 8, 8), (2, 1, 8, 8))
    profiles = [OptimizationProfile("min-opt-max", (full,))]
    if not static:
        profiles.append(OptimizationProfile("min", (ShapeRange("image", (1, 1, 8, 8), (1, 1, 8, 8), (1, 1, 8, 8)),)))
    return TensorRTBuildPlan(target="nvidia-h100", gpu_name="NVIDIA H100 SXM5 80GB", compute_capability="9.0", precision="fp32",
                             tensorrt_major=10, api="tensorrt10", network_typing=NetworkTyping.WEAK,
                             onnx_precision=OnnxPrecision.AS_EXPORTED, builder_flags=(), profiles=tuple(profiles), workspace_mb=256)


def tensorrt_bundle(root: Path, plan: TensorRTBuildPlan, engine: dict[str, Any] | None = None, batches: int = 2) -> Path:
    build_bundle(root, backend="tensorrt", batches=batches)
    plan.write(root / PLAN_PATH)
    manifest = load_manifest(root)
    manifest["backend"]["tensorrt"] = {"api": plan.api, "plan": PLAN_PATH, "plan_digest": plan.digest, "engine": engine}
    write_manifest(root, manifest)
    return root


def test_tensorrt_is_registered() -> None:
    assert BACKENDS["tensorrt"] is TensorRTRunner and TensorRTRunner.backend_name == "tensorrt"


def test_runner_from_a_bundle(tmp_path: Path) -> None:
    key = EngineCacheKey.for_device("a" * 64, linear_plan().digest, DeviceIdentity.from_cuda("NVIDIA H100 80GB HBM3", "9.0", 132, "10.13.0"))
    root = tmp_path / "bundle"
    tensorrt_bundle(root, linear_plan())
    (root / "tensorrt" / "model.engine").write_bytes(b"engine")
    manifest = load_manifest(root)
    manifest["backend"]["tensorrt"]["engine"] = {"path": "tensorrt/model.engine", "key": key.to_dict()}
    write_manifest(root, manifest)
    bundle = open_bundle(root)
    runner = create_runner(bundle, cache_dir=tmp_path / "cache", cuda_graphs=True)
    assert isinstance(runner, TensorRTRunner) and not runner.is_loaded
    assert runner.plan == linear_plan() and runner.model_sha256 == bundle.manifest["model"]["sha256"]
    assert runner.onnx_path == root / "model.onnx" and runner.cache.root == tmp_path / "cache" and runner.cuda_graphs
    assert runner.shipped_engine is not None and runner.shipped_engine.key == key
    assert create_runner(bundle, use_bundle_engine=False).shipped_engine is None


def test_runner_option_and_plan_errors(tmp_path: Path) -> None:
    bundle = open_bundle(tensorrt_bundle(tmp_path / "bundle", linear_plan()))
    with pytest.raises(BackendError) as caught:
        create_runner(bundle, intra_op_threads=2)
    assert "unknown tensorrt runner option(s): intra_op_threads" in str(caught.value)
    assert "cache_dir, device_id, cuda_graphs, use_bundle_engine" in str(caught.value)
    with pytest.raises(BackendError, match="device_id must be an int >= 0, got -1"):
        create_runner(bundle, device_id=-1)
    plain = open_bundle(build_bundle(tmp_path / "no-plan", backend="tensorrt"))
    with pytest.raises(PlanError, match=r"tensorrt/plan.json' is missing[\s\S]*edgekit build --backend tensorrt"):
        create_runner(plain)


def test_loading_without_tensorrt_says_how_to_install_it(tmp_path: Path) -> None:
    """Real on this machine: no TensorRT, so load() fails with the install hint, and nothing is left open."""
    try:
        import tensorrt

        if hasattr(tensorrt, "Builder"):
            pytest.skip("TensorRT is installed here; the gpu-marked tests cover loading")
    except ImportError:
        pass
    bundle = open_bundle(tensorrt_bundle(tmp_path / "bundle", linear_plan()))
    runner = create_runner(bundle, cache_dir=tmp_path / "cache")
    with pytest.raises(TensorRTUnavailableError, match=r"TensorRT is not installed[\s\S]*hint: on (x86-64|a Jetson)"):
        runner.load()
    assert not runner.is_loaded
    with pytest.raises(BackendError, match=r"TensorRTRunner.infer: the model is not loaded[\s\S]*runner.load\(\)"):
        runner.infer({"image": np.zeros((1, 1, 8, 8), np.float32)})
    assert not (tmp_path / "cache").exists()


def test_choose_profile_prefers_the_narrowest() -> None:
    profiles = linear_plan().profiles
    assert choose_profile(profiles, {"image": (1, 1, 8, 8)}) == 1  # the batch-1 profile
    assert choose_profile(profiles, {"image": (64, 1, 8, 8)}) == 0
    with pytest.raises(BackendError) as caught:
        choose_profile(profiles, {"image": (200, 1, 8, 8)})
    assert "no optimisation profile of the engine covers the input shapes image[200, 1, 8, 8]" in str(caught.value)
    assert "rebuild the bundle with wider dims" in str(caught.value)


# -- on an NVIDIA GPU ----------------------------------------------------------------------------------


@pytest.fixture
def cuda_device() -> Any:
    from edgekit_runtime.backends.cuda_buffers import CudaDevice

    try:
        device = CudaDevice(0)
    except CudaUnavailableError as err:
        pytest.skip(f"needs pycuda and a CUDA device: {err.message}")
    yield device
    device.close()


@pytest.mark.gpu
def test_device_info(cuda_device: Any) -> None:
    info = cuda_device.info()
    assert info.name and info.multiprocessors > 0 and info.total_memory_bytes > 0
    major, minor = info.compute_capability.split(".")
    assert int(major) >= 5 and minor.isdigit()


@pytest.mark.gpu
def test_pinned_round_trip_through_the_device(cuda_device: Any) -> None:
    stream = cuda_device.stream()
    assert isinstance(stream.handle, int)
    source, target = cuda_device.buffers("a"), cuda_device.buffers("b")
    data = np.arange(4 * 1000, dtype=np.float32).reshape(4, 1000)
    source.upload(data, stream)
    assert target.reserve(data.shape, data.dtype)  # first allocation moves the address
    cuda_device.driver.memcpy_dtod_async(target.device.ptr, source.device.ptr, data.nbytes, stream.raw)
    out = target.download(data.shape, data.dtype, stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, data)
    assert not target.reserve((2, 1000), np.dtype(np.float32))  # smaller fits: no reallocation
    assert target.reserve((8, 1000), np.dtype(np.float32))  # larger reallocates
    for buffers in (source, target):
        buffers.free()


@pytest.mark.gpu
def test_cuda_graph_replays_a_captured_copy(cuda_device: Any) -> None:
    stream = cuda_device.stream()
    source, target = cuda_device.buffers("a"), cuda_device.buffers("b")
    first = np.full((256,), 3.0, np.float32)
    source.upload(first, stream)
    target.reserve(first.shape, first.dtype)
    stream.synchronize()
    stream.begin_capture()
    cuda_device.driver.memcpy_dtod_async(target.device.ptr, source.device.ptr, first.nbytes, stream.raw)
    graph = stream.end_capture()
    second = np.full((256,), 7.0, np.float32)
    source.upload(second, stream)
    graph.launch(stream)
    out = target.download(second.shape, second.dtype, stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, second)


@pytest.fixture
def tensorrt_ready(cuda_device: Any) -> None:
    try:
        from edgekit_runtime.tensorrt_engines.version import detect_tensorrt

        detect_tensorrt()
    except TensorRTUnavailableError as err:
        pytest.skip(f"needs TensorRT: {err.message}")


@pytest.mark.gpu
def test_runner_builds_caches_and_self_checks(tmp_path: Path, tensorrt_ready: None) -> None:
    bundle = open_bundle(tensorrt_bundle(tmp_path / "bundle", linear_plan()))
    cache = tmp_path / "cache"
    with create_runner(bundle, cache_dir=cache) as runner:
        assert runner.materialised is not None and runner.materialised.source == "built"
        assert self_check(bundle, runner).passed
        for batch in (1, 5, 128):  # the batch-1 profile, then the full one, set per call
            image = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
            np.testing.assert_allclose(runner.infer({"image": image})["logits"], reference_logits(image), rtol=1e-3, atol=1e-3)
    with create_runner(bundle, cache_dir=cache) as again:
        assert again.materialised is not None and again.materialised.source == "cache"
    engine_file = next((cache / "engines").glob("*.engine"))
    engine_file.write_bytes(b"corrupt")
    with create_runner(bundle, cache_dir=cache) as rebuilt:
        assert rebuilt.materialised is not None and rebuilt.materialised.source == "built"
        assert "failed to deserialize" in rebuilt.materialised.notes[0]
    assert json.loads(engine_file.with_suffix(".json").read_text())["key"]["model_sha256"] == bundle.manifest["model"]["sha256"]


@pytest.mark.gpu
def test_runner_with_cuda_graphs_on_static_shapes(tmp_path: Path, tensorrt_ready: None) -> None:
    root = tmp_path / "bundle"
    tensorrt_bundle(root, linear_plan(static=True), batches=1)
    manifest = load_manifest(root)
    manifest["io"]["inputs"][0]["shape"] = [2, 1, 8, 8]
    manifest["io"]["outputs"][0]["shape"] = [2, 10]
    manifest["io"]["dims"] = {}
    write_manifest(root, manifest)
    bundle = open_bundle(root)
    with create_runner(bundle, cache_dir=tmp_path / "cache", cuda_graphs=True) as runner:
        for seed in range(4):
            image = np.random.default_rng(seed).standard_normal((2, 1, 8, 8)).astype(np.float32)
            np.testing.assert_allclose(runner.infer({"image": image})["logits"], reference_logits(image), rtol=1e-3, atol=1e-3)


def test_calls_share_the_stream_so_they_are_not_concurrent_safe(tmp_path: Path) -> None:
    """One stream, its buffers and the execution contexts serve every call: a server runs the runner on one instance."""
    runner = create_runner(open_bundle(tensorrt_bundle(tmp_path / "bundle", linear_plan())), cache_dir=tmp_path / "cache")
    assert runner.concurrent_calls_safe is False

