"""The OpenVINO runner on real OpenVINO (its CPU plugin runs on this host): bundles self-check, the NPU's
per-shape policy, and errors that name the manifest field and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.backends import OpenVinoRunner, create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BackendError
from tests.hidden_module import hide_module
from tests.runtime.tiny_bundle import load_manifest, reference_logits, save_manifest

ov = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit-runtime[openvino]')")


def _openvino_bundle(make_bundle: Callable[..., Path], **record: Any) -> Path:
    root = make_bundle(backend="openvino")
    if record:
        manifest = load_manifest(root)
        manifest["backend"]["openvino"].update(record)
        save_manifest(root, manifest)
    return root


def test_a_bundle_self_checks_on_the_cpu_plugin_at_strict_f32(make_bundle: Callable[..., Path]) -> None:
    bundle = open_bundle(_openvino_bundle(make_bundle))
    runner = create_runner(bundle)
    assert isinstance(runner, OpenVinoRunner) and runner.device == "CPU" and runner.threads == 1
    with runner:
        assert runner.compile_config() == {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": "NO",
                                           "INFERENCE_NUM_THREADS": "1"}
        assert runner.providers == ("OpenVINO CPU (f32)",)
        result = self_check(bundle, runner)
        image = np.random.default_rng(3).standard_normal((5, 1, 8, 8)).astype(np.float32)
        got = runner.infer({"image": image})["logits"]
    assert result.passed
    np.testing.assert_allclose(got, reference_logits(image), rtol=1e-5, atol=1e-5)


def test_outputs_are_copies_that_the_next_call_does_not_overwrite(make_bundle: Callable[..., Path]) -> None:
    rng = np.random.default_rng(4)
    first, second = (rng.standard_normal((3, 1, 8, 8)).astype(np.float32) for _ in range(2))
    with create_runner(open_bundle(_openvino_bundle(make_bundle))) as runner:
        kept = runner.infer({"image": first})["logits"]
        runner.infer({"image": second})
    np.testing.assert_allclose(kept, reference_logits(first), rtol=1e-5, atol=1e-5)


def test_the_per_shape_policy_compiles_once_for_each_input_shape(make_bundle: Callable[..., Path]) -> None:
    bundle = open_bundle(_openvino_bundle(make_bundle, shapes="per-shape"))
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed  # golden batches of 2 and 3 images
        for batch in (1, 2, 1):
            image = np.ones((batch, 1, 8, 8), np.float32)
            np.testing.assert_allclose(runner.infer({"image": image})["logits"], reference_logits(image), rtol=1e-5, atol=1e-5)
        assert sorted(key[0][0] for key in runner._per_shape) == [1, 2, 3]
        compiled_input = runner._core.read_model(str(runner.model_path)).input(0).get_partial_shape()
        assert compiled_input.is_dynamic  # the bundle's graph stays dynamic; each compile fixes one shape


def test_a_device_this_machine_lacks_is_named_with_the_stand_in_fix(make_bundle: Callable[..., Path]) -> None:
    if "NPU" in ov.Core().available_devices:
        pytest.skip("this machine has an Intel NPU")
    bundle = open_bundle(_openvino_bundle(make_bundle, device="NPU", inference_precision_hint="f16"))
    with pytest.raises(BackendError) as caught:
        create_runner(bundle).load()
    message = str(caught.value)
    assert "OpenVINO device NPU (manifest.json backend.openvino.device) is not present on this machine" in message
    assert "create_runner(bundle, device='CPU')" in message and "linux-npu-driver" in message
    with create_runner(bundle, device="CPU", inference_precision_hint="f32") as stand_in:
        assert self_check(bundle, stand_in).passed


def test_missing_openvino_names_the_extra(make_bundle: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "openvino")
    with pytest.raises(BackendError) as caught:
        create_runner(open_bundle(_openvino_bundle(make_bundle))).load()
    assert "backend is openvino (manifest.json backend.name), but OpenVINO is not installed" in str(caught.value)
    assert "pip install 'edgekit-runtime[openvino]'" in str(caught.value)


def test_manifest_mistakes_name_the_field(make_bundle: Callable[..., Path]) -> None:
    root = _openvino_bundle(make_bundle)
    with pytest.raises(BackendError, match=r"(?s)inference_precision_hint .fp16. is not one edgekit writes.*backend\.openvino\.inference_precision_hint"):
        create_runner(open_bundle(root), inference_precision_hint="fp16")
    with pytest.raises(BackendError, match=r"(?s)shapes .static. .*backend\.openvino\.shapes"):
        create_runner(open_bundle(root), shapes="static")
    with pytest.raises(BackendError, match="unknown openvino runner option"):
        create_runner(open_bundle(root), intra_op_threads=2)
    manifest = load_manifest(root)
    del manifest["backend"]["openvino"]
    save_manifest(root, manifest)
    with pytest.raises(BackendError, match=r"(?s)backend\.openvino\.device is missing.*--backend openvino"):
        create_runner(open_bundle(root))
