"""OnnxRuntimeRunner against real ONNX Runtime sessions on tiny models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail

from edgekit_runtime.backends.onnxruntime import GRAPH_OPTIMIZATION_LEVELS, OnnxRuntimeRunner, _session_run
from edgekit_runtime.errors import BackendError, InputSignatureError
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import io_section, reference_logits

SIGNATURE = IOSignature.from_manifest(io_section())


def _cuda_ready() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers() and Path("/dev/nvidia0").exists()


def test_results_equal_a_plain_inference_session(model_path: Path, images: np.ndarray) -> None:
    plain = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (expected,) = plain.run(["logits"], {"image": images})
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        outputs = runner.infer({"image": images})
    assert list(outputs) == ["logits"]
    assert outputs["logits"].dtype == np.float32
    np.testing.assert_array_equal(outputs["logits"], expected)
    np.testing.assert_allclose(outputs["logits"], reference_logits(images), atol=1e-4)


@pytest.mark.parametrize("level", sorted(GRAPH_OPTIMIZATION_LEVELS))
def test_every_graph_optimization_level_runs(model_path: Path, images: np.ndarray, level: str) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, graph_optimization=level, intra_op_threads=1) as runner:
        logits = runner.infer({"image": images})["logits"]
    np.testing.assert_allclose(logits, reference_logits(images), atol=1e-4)


def test_optimized_model_is_written(model_path: Path, tmp_path: Path, images: np.ndarray) -> None:
    optimized = tmp_path / "optimized.onnx"
    with OnnxRuntimeRunner(model_path, SIGNATURE, optimized_model_path=optimized) as runner:
        runner.infer({"image": images})
    assert optimized.is_file()
    assert onnx.load(str(optimized)).graph.output[0].name == "logits"


def test_lifecycle_and_providers(model_path: Path, images: np.ndarray) -> None:
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[{"name": "CPUExecutionProvider", "options": {}}])
    assert runner.backend_name == "onnxruntime"
    assert runner.signature is SIGNATURE
    with pytest.raises(BackendError, match=r"OnnxRuntimeRunner.infer: the model is not loaded[\s\S]*runner.load\(\)"):
        runner.infer({"image": images})
    with pytest.raises(BackendError, match="OnnxRuntimeRunner.providers: the model is not loaded"):
        runner.providers
    with runner:
        assert runner.is_loaded
        assert runner.providers == ("CPUExecutionProvider",)
        assert runner.load() is runner  # loading twice is a no-op
    assert not runner.is_loaded
    runner.close()  # closing twice is safe


def test_infer_validates_feeds(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        with pytest.raises(InputSignatureError, match=r"input 'image': expected float32\[batch, 1, 8, 8\] \(batch in 1..128\), got float64"):
            runner.infer({"image": np.zeros((2, 1, 8, 8))})


def test_cuda_on_a_cpu_only_install_is_an_error_not_a_fallback(model_path: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA built in; the test needs a CPU-only install")
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[{"name": "CUDAExecutionProvider", "options": {"device_id": 0}}, "CPUExecutionProvider"])
    with pytest.raises(BackendError) as caught:
        runner.load()
    message = str(caught.value)
    assert "execution provider 'CUDAExecutionProvider' is not in the installed onnxruntime" in message
    assert "onnxruntime-gpu" in message and "CUDA and cuDNN" in message
    assert not runner.is_loaded


def test_provider_that_silently_falls_back_is_caught(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the pre-check believe CUDA is built in, as with onnxruntime-gpu on a box whose CUDA libraries
    are missing: ONNX Runtime then falls back to the CPU with only a warning, which must become an error."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA built in; the fallback cannot be provoked this way")
    available = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *available])
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=["CUDAExecutionProvider"])
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"), pytest.raises(BackendError) as caught:
        runner.load()
    message = str(caught.value)
    assert f"execution provider 'CUDAExecutionProvider' was requested for '{model_path}' but did not load" in message
    assert "fell back to CPUExecutionProvider" in message
    assert "nvidia-smi" in message


def test_unknown_provider_suggests_the_close_name(model_path: Path) -> None:
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=["CUDAExecutionProvide"])
    with pytest.raises(BackendError) as caught:
        runner.load()
    assert "unknown execution provider 'CUDAExecutionProvide'" in str(caught.value)
    assert "did you mean 'CUDAExecutionProvider'?" in str(caught.value)


def test_corrupt_model_file_is_named(tmp_path: Path) -> None:
    corrupt = tmp_path / "model.onnx"
    corrupt.write_bytes(b"\x08\x07not really protobuf" * 10)
    with pytest.raises(BackendError) as caught:
        OnnxRuntimeRunner(corrupt, SIGNATURE).load()
    message = str(caught.value)
    assert f"model file '{corrupt}' is not a valid ONNX model" in message
    assert "truncated or corrupt" in message


def test_missing_model_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=f"model file '{tmp_path / 'gone.onnx'}' does not exist"):
        OnnxRuntimeRunner(tmp_path / "gone.onnx", SIGNATURE).load()


def _with_input(name: str, dtype: str) -> IOSignature:
    io = io_section()
    io["inputs"][0].update(name=name, dtype=dtype)
    return IOSignature.from_manifest(io)


@pytest.mark.parametrize(("signature", "text"), [
    (_with_input("pixels", "float32"), "has inputs ['image'] but the signature lists ['pixels']"),
    (_with_input("image", "float16"), "tensor 'image' is float32 in the model but float16 in the signature"),
])  # fmt: skip
def test_signature_that_does_not_describe_the_model(model_path: Path, signature: IOSignature, text: str) -> None:
    with pytest.raises(BackendError) as caught:
        OnnxRuntimeRunner(model_path, signature).load()
    assert text in str(caught.value)
    assert "rebuild the bundle" in str(caught.value)


def test_signature_output_missing_from_model(model_path: Path) -> None:
    io = io_section()
    io["outputs"].append({"name": "probabilities", "dtype": "float32", "shape": ["batch", 10]})
    with pytest.raises(BackendError, match=r"has no output\(s\) \['probabilities'\]; its outputs: \['logits'\]"):
        OnnxRuntimeRunner(model_path, IOSignature.from_manifest(io)).load()


def _reshape_to_2x2(tmp_path: Path) -> tuple[Path, IOSignature]:
    """A model whose run fails on a valid signature: any length but 4 cannot be reshaped to 2x2."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape_to_2x2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        initializer=[helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])],
    )
    path = tmp_path / "reshape.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    signature = IOSignature.from_manifest({
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 2]}],
        "dims": {"n": {"min": 1, "max": 8}},
    })  # fmt: skip
    return path, signature


def test_runtime_failure_inside_the_model_is_a_backend_error(tmp_path: Path) -> None:
    path, signature = _reshape_to_2x2(tmp_path)
    with OnnxRuntimeRunner(path, signature) as runner:
        np.testing.assert_array_equal(runner.infer({"x": np.arange(4, dtype=np.float32)})["y"], [[0, 1], [2, 3]])
        with pytest.raises(BackendError, match=f"ONNX Runtime failed to run '{path}'"):
            runner.infer({"x": np.arange(5, dtype=np.float32)})


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"execution_providers": []}, "execution_providers must be a non-empty list"),
    ({"execution_providers": "CPUExecutionProvider"}, "execution_providers must be a non-empty list"),
    ({"execution_providers": [{"options": {}}]}, "execution_providers[0]: expected a provider name or {name, options}"),
    ({"execution_providers": [{"name": "CPUExecutionProvider", "options": [1]}]}, "options of CPUExecutionProvider must be an object"),
    ({"graph_optimization": "max"}, "graph_optimization 'max' is not one of all, extended, basic, disable"),
    ({"intra_op_threads": -2}, "intra_op_threads must be an int >= 0 or null, got -2"),
    ({"denormal_as_zero": "yes"}, "denormal_as_zero must be true or false, got 'yes'"),
])  # fmt: skip
def test_bad_constructor_arguments(model_path: Path, kwargs: dict, text: str) -> None:
    with pytest.raises(BackendError) as caught:
        OnnxRuntimeRunner(model_path, SIGNATURE, **kwargs)
    assert text in str(caught.value)


@pytest.mark.parametrize(("key", "value", "text"), [
    ("execution_providers", 1, "execution_providers must be a non-empty list, got 1"),
    ("execution_providers", {"name": "CPUExecutionProvider"}, "execution_providers must be a non-empty list, got {"),
    ("graph_optimization", [1], "graph_optimization [1] is not one of all, extended, basic, disable"),
    ("graph_optimization", 3, "graph_optimization 3 is not one of all, extended, basic, disable"),
    ("intra_op_threads", 10**30, f"intra_op_threads must be at most 1024, got {10**30}"),
    ("intra_op_threads", 2.5, "intra_op_threads must be an int >= 0 or null, got 2.5"),
])  # fmt: skip
def test_a_wrongly_typed_manifest_backend_field_is_named_with_the_fix(make_bundle: Callable[..., Path], key: str, value: object,
                                                                       text: str) -> None:  # fmt: skip
    """A manifest whose ``backend`` values are well-formed JSON of the wrong type or range: a BackendError naming the
    bundle, manifest.json backend.KEY and what to write there, before any session is made (not a TypeError from a
    set lookup or from ONNX Runtime's bindings)."""
    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.bundle import open_bundle
    from tests.runtime.tiny_bundle import load_manifest, save_manifest

    root = make_bundle()
    manifest = load_manifest(root)
    manifest["backend"][key] = value
    save_manifest(root, manifest)
    with pytest.raises(BackendError) as caught:
        create_runner(open_bundle(root, verify=True))
    assert caught.value.message.startswith(f"bundle '{root}' (manifest.json backend): {text}")
    assert f"(manifest.json backend.{key})" in caught.value.hint


@pytest.mark.parametrize("flush", [True, False])
def test_denormal_as_zero_reaches_the_session(model_path: Path, images: np.ndarray, flush: bool) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, denormal_as_zero=flush) as runner:
        options = runner.session.get_session_options()
        if flush:
            assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"
        else:
            with pytest.raises(RuntimeError, match="does not have configuration with key"):
                options.get_session_config_entry("session.set_denormal_as_zero")
        np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), rtol=1e-5, atol=1e-5)


def test_provider_options_are_converted_to_onnx_runtime_strings(model_path: Path, images: np.ndarray) -> None:
    options = {"use_arena": False, "device_id": 0, "gpu_mem_limit_gb": 1.5, "arena_extend_strategy": "kSameAsRequested"}
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[{"name": "CPUExecutionProvider", "options": options}])
    assert runner.execution_providers[0].ort_options() == {
        "use_arena": "0", "device_id": "0", "gpu_mem_limit_gb": "1.5", "arena_extend_strategy": "kSameAsRequested"
    }  # fmt: skip
    with runner:  # ONNX Runtime accepts them
        assert runner.infer({"image": images})["logits"].shape == (4, 10)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs onnxruntime-gpu with CUDAExecutionProvider and a visible NVIDIA GPU")
def test_cuda_provider_really_loads_and_matches_the_cpu(model_path: Path, images: np.ndarray) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"]) as gpu:
        assert gpu.providers[0] == "CUDAExecutionProvider"
        on_gpu = gpu.infer({"image": images})["logits"]
    np.testing.assert_allclose(on_gpu, reference_logits(images), atol=1e-3, rtol=1e-3)


# -- the compiled session call behind InferenceSession.run ----------------------------------------------


def test_validated_feeds_skip_the_python_checks_of_session_run(model_path: Path, images: np.ndarray) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        run, retry = _session_run(runner.session)
        assert run == runner.session._sess.run and retry == (EPFail,)
        expected = runner.session.run(["logits"], {"image": images})[0]
        np.testing.assert_array_equal(runner.infer({"image": images})["logits"], expected)


def test_a_failing_run_is_explained_the_same_either_way(tmp_path: Path) -> None:
    """The compiled call and ``session.run`` fail with the same first line, so the BackendError is the same."""
    path, signature = _reshape_to_2x2(tmp_path)
    bad = {"x": np.arange(5, dtype=np.float32)}
    messages = []
    with OnnxRuntimeRunner(path, signature) as runner:
        for run, retry in (_session_run(runner.session), (runner.session.run, ())):
            runner._run, runner._retry_publicly = run, retry
            with pytest.raises(BackendError) as caught:
                runner.infer(bad)
            messages.append((str(caught.value), caught.value.hint, type(caught.value.__cause__)))
    assert messages[0] == messages[1]
    assert messages[0][0].startswith(f"ONNX Runtime failed to run '{path}': ")


class _FakeCompiled:
    def __init__(self, *, fail: BaseException | None = None, capture: bool = False) -> None:
        self.fail, self.capture, self.calls = fail, capture, 0

    def run(self, names: list[str], feeds: dict, run_options: object) -> list:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return [np.zeros((1, 10), np.float32)]

    def is_webgpu_graph_capture_enabled(self) -> bool:
        return self.capture


class _FakeSession:
    """``session.run`` as ONNX Runtime's: on EPFail it switches to the fallback providers (a new compiled
    session) and runs again."""

    def __init__(self, compiled: _FakeCompiled) -> None:
        self._sess = compiled
        self.public_calls = 0

    def run(self, names: list[str], feeds: dict, run_options: object = None) -> list:
        self.public_calls += 1
        try:
            return self._sess.run(names, feeds, run_options)
        except EPFail:
            self._sess = _FakeCompiled()
            return self._sess.run(names, feeds, run_options)


def _through_compiled_run(runner: OnnxRuntimeRunner) -> Callable[[dict], dict]:
    """What the serving path does with :meth:`OnnxRuntimeRunner.compiled_run`, asking again after a recovery."""
    def call(feeds: dict) -> dict:
        run, names, recover = runner.compiled_run()
        try:
            outputs = run(names, feeds, None)
        except Exception as err:
            outputs = recover(feeds, err)
        return dict(zip(names, outputs, strict=True))

    return call


@pytest.mark.parametrize("call_of", [lambda runner: runner.infer, _through_compiled_run], ids=["infer", "compiled_run"])
def test_ep_failure_is_left_to_the_fallback_of_session_run(
    model_path: Path, images: np.ndarray, call_of: Callable[[OnnxRuntimeRunner], Callable[..., dict]]
) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        failing = _FakeCompiled(fail=EPFail("CUDA error: device lost"))
        session = _FakeSession(failing)
        runner._session = session
        runner._run, runner._retry_publicly = _session_run(session)
        call = call_of(runner)
        assert call({"image": images})["logits"].shape == (1, 10)
        assert session.public_calls == 1 and failing.calls == 2  # tried directly, then by session.run
        assert runner._run == session._sess.run  # the fallback's new compiled session from now on
        call({"image": images})
        assert session.public_calls == 1 and session._sess.calls == 2  # the fallback's compiled session, directly
        runner._session = None  # not a real session: nothing to release


def test_graph_capture_or_missing_internals_use_session_run() -> None:
    capturing = _FakeSession(_FakeCompiled(capture=True))
    assert _session_run(capturing) == (capturing.run, ())

    class Plain:
        def run(self, names: list[str], feeds: dict, run_options: object = None) -> list:
            return []

    plain = Plain()
    assert _session_run(plain) == (plain.run, ())


def test_compiled_run_is_the_compiled_session_call_and_matches_infer(model_path: Path, images: np.ndarray) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        run, names, recover = runner.compiled_run()
        assert run == runner.session._sess.run and names == ["logits"]  # no frame of the runner in between
        assert recover == runner._after_failed_run
        np.testing.assert_array_equal(run(names, {"image": images}, None)[0], runner.infer({"image": images})["logits"])
    with pytest.raises(BackendError, match="compiled_run"):
        runner.compiled_run()  # closed


def test_compiled_run_fails_as_infer_does(tmp_path: Path) -> None:
    path, signature = _reshape_to_2x2(tmp_path)
    with OnnxRuntimeRunner(path, signature) as runner:
        call = _through_compiled_run(runner)
        np.testing.assert_array_equal(call({"x": np.arange(4, dtype=np.float32)})["y"], [[0, 1], [2, 3]])
        errors = []
        for run in (call, runner.infer):
            with pytest.raises(BackendError) as caught:
                run({"x": np.arange(5, dtype=np.float32)})
            errors.append((str(caught.value), caught.value.hint, type(caught.value.__cause__)))
        assert errors[0] == errors[1]
        assert errors[0][0].startswith(f"ONNX Runtime failed to run '{path}': ")


def test_compiled_run_of_a_two_output_model_returns_both_in_order(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Neg", ["x"], ["negated"])],
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"]) for name in ("same", "negated")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    signature = IOSignature.from_manifest({
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "outputs": [{"name": name, "dtype": "float32", "shape": ["n"]} for name in ("same", "negated")],
        "dims": {"n": {"min": 1, "max": 8}},
    })  # fmt: skip
    x = np.arange(3, dtype=np.float32)
    with OnnxRuntimeRunner(path, signature) as runner:
        outputs = _through_compiled_run(runner)({"x": x})
    assert list(outputs) == ["same", "negated"]
    np.testing.assert_array_equal(outputs["same"], x)
    np.testing.assert_array_equal(outputs["negated"], -x)
