"""create_runner and the BACKENDS registry, driven by real bundles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.backends import BACKENDS, OnnxRuntimeRunner, create_runner
from edgekit_runtime.errors import BundleError
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BackendError
from tests.runtime.tiny_bundle import load_manifest, save_manifest


def test_runner_follows_the_manifest_backend_section(bundle_dir: Path) -> None:
    runner = create_runner(open_bundle(bundle_dir))
    assert isinstance(runner, OnnxRuntimeRunner)
    assert runner.model_path == bundle_dir / "model.onnx"
    assert runner.graph_optimization == "extended"
    assert runner.intra_op_threads == 1
    assert [p.name for p in runner.execution_providers] == ["CPUExecutionProvider"]
    assert not runner.is_loaded


def test_overrides_replace_manifest_options(bundle_dir: Path) -> None:
    runner = create_runner(open_bundle(bundle_dir), intra_op_threads=2, graph_optimization="disable")
    assert (runner.intra_op_threads, runner.graph_optimization) == (2, "disable")
    with pytest.raises(BackendError) as caught:
        create_runner(open_bundle(bundle_dir), threads=2)
    assert "unknown onnxruntime runner option(s): threads" in str(caught.value)
    assert "intra_op_threads" in str(caught.value)


# tensorrt needs a GPU and TensorRT: tests/engines/test_tensorrt_runner.py covers it (marked gpu).
@pytest.mark.parametrize("name", sorted(set(BACKENDS) - {"tensorrt"}))
def test_every_registered_backend_runs_a_bundle(make_bundle: Callable[..., Path], name: str) -> None:
    if name == "openvino":  # an optional extra: the bare, Python 3.10 and arm64 checks run without it
        pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit-runtime[openvino]')")
    bundle = open_bundle(make_bundle(backend=name))
    runner = create_runner(bundle)
    assert isinstance(runner, BACKENDS[name])
    assert runner.backend_name == name
    assert self_check(bundle, runner).passed


def _with_backend(bundle_dir: Path, name: str) -> Path:
    manifest = load_manifest(bundle_dir)
    manifest["backend"]["name"] = name
    save_manifest(bundle_dir, manifest)
    return bundle_dir


def test_unknown_backend_lists_the_known_ones(bundle_dir: Path) -> None:
    bundle = open_bundle(_with_backend(bundle_dir, "tflite"))
    with pytest.raises(BackendError) as caught:
        create_runner(bundle)
    assert "unknown backend 'tflite' in manifest.json backend.name" in str(caught.value)
    assert "backends this edgekit-runtime knows: onnxruntime" in str(caught.value) and "tensorrt" in str(caught.value)


def test_tensorrt_bundle_without_its_plan_says_how_to_build_one(bundle_dir: Path) -> None:
    bundle = open_bundle(_with_backend(bundle_dir, "tensorrt"))
    with pytest.raises(BundleError) as caught:
        create_runner(bundle)
    assert "tensorrt/plan.json' is missing" in str(caught.value)
    assert "edgekit build --backend tensorrt" in str(caught.value)
