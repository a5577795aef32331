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


def _io(**changes: Any) -> dict[str, Any]:
    io = {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
          "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}], "dims": {"batch": {"min": 1, "opt": 1, "max": 4}}}  # fmt: skip
    for where, change in changes.items():
        io[where][0].update(change)
    return io


@pytest.mark.parametrize(("io", "message"), [
    (_io(outputs={"name": "scores"}), "the model has no output(s) ['scores']; its outputs: ['logits']"),
    (_io(inputs={"name": "pixels"}), "disagree on the inputs: the model's are ['image'], io lists ['pixels']"),
    (_io(inputs={"dtype": "float16"}), "tensor 'image' is float32 in the model but float16 in io"),
    (_io(outputs={"shape": ["batch", 10, 1]}), "tensor 'logits' has rank 2 in the model but 3 in io"),
])  # fmt: skip
def test_an_io_section_that_does_not_describe_the_model_is_named_at_load(model_path: Path, io: dict[str, Any], message: str) -> None:
    from edgekit_runtime.signature import IOSignature

    runner = OpenVinoRunner(model_path, IOSignature.from_manifest(io))
    with pytest.raises(BackendError) as caught:
        runner.load()
    assert str(caught.value).startswith(f"model '{model_path}' and manifest.json io")
    assert message in caught.value.message
    assert caught.value.hint == "the bundle's io section (manifest.json io) does not describe this model: rebuild the bundle"
    assert not runner.is_loaded


def test_a_run_openvino_rejects_is_a_backend_error(tmp_path: Path) -> None:
    """Inputs that pass the signature check but that a value-dependent op rejects (a Reshape to a pattern the data
    does not fit): a BackendError with OpenVINO's reason, not a bare RuntimeError."""
    import onnx
    from onnx import TensorProto, helper

    from edgekit_runtime.signature import IOSignature

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "reshape.onnx")
    io = {"inputs": [{"name": "x", "dtype": "float32", "shape": [3, 4]}, {"name": "shape", "dtype": "int64", "shape": [2]}],
          "outputs": [{"name": "y", "dtype": "float32", "shape": ["a", "b"]}],
          "dims": {"a": {"min": 1, "opt": 1, "max": 12}, "b": {"min": 1, "opt": 1, "max": 12}}}  # fmt: skip
    with OpenVinoRunner(tmp_path / "reshape.onnx", IOSignature.from_manifest(io)) as runner:
        assert runner.infer({"x": np.ones((3, 4), np.float32), "shape": np.array([2, 6])})["y"].shape == (2, 6)
        with pytest.raises(BackendError) as caught:
            runner.infer({"x": np.ones((3, 4), np.float32), "shape": np.array([5, 7])})
    assert f"failed to run '{tmp_path / 'reshape.onnx'}' on CPU: [CPU] Reshape node with name 'y'" in caught.value.message
    assert "conflicts with the reshape pattern" in caught.value.message and "Exception from src/" not in caught.value.message
    assert "value-dependent op" in caught.value.hint
