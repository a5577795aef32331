"""OnnxRuntimeRunner through IOBinding: device buffers per input shape, device-resident runs, CUDA graphs.

The CPU tests bind host memory (``io_binding=True`` on the CPU provider), which exercises the same code as
the GPU; the ``gpu`` tests need onnxruntime-gpu's CUDA provider and an NVIDIA GPU, and skip without them
(scripts/check_ort_gpu.sh runs them on a lent GPU machine).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit_runtime.agent.config import BundlesConfig
from edgekit_runtime.agent.loading import load_bundle
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.backends.ort_device_io import KEPT_SHAPES, DeviceBinding
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import build_bundle, io_section, linear_weights, reference_logits

SIGNATURE = IOSignature.from_manifest(io_section())
CUDA = {"name": "CUDAExecutionProvider", "options": {"device_id": 0}}
CUDA_GRAPH = {"name": "CUDAExecutionProvider", "options": {"device_id": 0, "enable_cuda_graph": True}}


def _cuda_ready() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers() and Path("/dev/nvidia0").exists()


needs_cuda = pytest.mark.skipif(not _cuda_ready(), reason="needs onnxruntime-gpu with CUDAExecutionProvider and a visible NVIDIA GPU")


def _images(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def _write_fp16_model(path: Path) -> Path:
    """The tiny linear classifier with float16 weights, input and output (as an fp16 bundle's graph)."""
    weight, bias = linear_weights()
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["image"], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "weight"], ["product"]),
         helper.make_node("Add", ["product", "bias"], ["logits"])],
        "linear_digits_fp16",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT16, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, ["batch", 10])],
        initializer=[numpy_helper.from_array(weight.astype(np.float16), "weight"), numpy_helper.from_array(bias.astype(np.float16), "bias")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _fp16_signature() -> IOSignature:
    section = io_section()
    for tensor in (*section["inputs"], *section["outputs"]):
        tensor["dtype"] = "float16"
    return IOSignature.from_manifest(section)


# -- on the CPU: the same binding code over host memory ----------------------------------------------------


def test_bound_runs_equal_session_run_across_shapes(model_path: Path) -> None:
    plain = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    with OnnxRuntimeRunner(model_path, SIGNATURE, io_binding=True) as runner:
        binding = runner.device_binding
        assert binding is not None and binding.device == "cpu" and not binding.cuda_graph
        for seed, batch in enumerate((4, 2, 4, 7, 2)):  # shapes come back: their buffers are reused
            images = _images(batch, seed)
            (expected,) = plain.run(["logits"], {"image": images})
            logits = runner.infer({"image": images})["logits"]
            np.testing.assert_array_equal(logits, expected)
        assert binding.describe()["shapes_kept"] == 3


def test_a_reused_buffer_takes_the_new_values(model_path: Path) -> None:
    """The same shape twice with different values: the second call must not answer from the first's buffer."""
    with OnnxRuntimeRunner(model_path, SIGNATURE, io_binding=True) as runner:
        first, second = _images(3, 1), _images(3, 2)
        np.testing.assert_allclose(runner.infer({"image": first})["logits"], reference_logits(first), atol=1e-4)
        np.testing.assert_allclose(runner.infer({"image": second})["logits"], reference_logits(second), atol=1e-4)


def test_the_callers_feeds_are_never_written_to(model_path: Path) -> None:
    """On the CPU an OrtValue made from a numpy array wraps its memory: a slot made from the first call's feeds must
    own a copy, or the next call of that shape writes its values into the first caller's array."""
    with OnnxRuntimeRunner(model_path, SIGNATURE, io_binding=True) as runner:
        first, second = _images(3, 1), _images(3, 2)
        kept = first.copy()
        logits = runner.infer({"image": first})["logits"]
        runner.infer({"image": second})
        np.testing.assert_array_equal(first, kept)
        np.testing.assert_allclose(logits, reference_logits(first), atol=1e-4)


def test_kept_shapes_are_bounded(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, io_binding=True) as runner:
        for batch in range(1, KEPT_SHAPES + 5):
            images = _images(batch, batch)
            np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), atol=1e-4)
        assert runner.device_binding is not None and runner.device_binding.describe()["shapes_kept"] == KEPT_SHAPES


def test_slots_without_a_cuda_graph_are_bounded_when_graphs_are_on(model_path: Path) -> None:
    """With CUDA graphs on, the shapes captured keep their slots for the session's life; the shapes past
    max_cuda_graphs run without a graph, and only the KEPT_SHAPES most recently used of those keep theirs."""
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    binding = DeviceBinding(ort, session, ["logits"], device="cpu", cuda_graph=True, max_cuda_graphs=2)
    for batch in range(1, 3 * KEPT_SHAPES):
        images = _images(batch, batch)
        np.testing.assert_allclose(binding.run({"image": images})[0], reference_logits(images), atol=1e-4)
    assert binding.describe()["graphs_captured"] == 2
    assert binding.describe()["shapes_kept"] == 2 + KEPT_SHAPES
    kept = sorted(key[0][1][0] for key in binding._slots)  # noqa: SLF001 - which shapes kept their buffers
    assert kept == [1, 2, *range(3 * KEPT_SHAPES - KEPT_SHAPES, 3 * KEPT_SHAPES)]  # the graphs' two, the latest plain ones
    images = _images(1, 99)  # a captured shape still runs on its own slot
    np.testing.assert_allclose(binding.run({"image": images})[0], reference_logits(images), atol=1e-4)


def test_resident_run_takes_and_returns_ortvalues(model_path: Path) -> None:
    images = _images(5, 9)
    with OnnxRuntimeRunner(model_path, SIGNATURE, io_binding=True) as runner:
        binding = runner.device_binding
        assert binding is not None
        (logits,) = binding.run_resident({"image": binding.to_device(images)})
        assert isinstance(logits, ort.OrtValue) and logits.device_name().lower() == "cpu"
        np.testing.assert_allclose(logits.numpy(), reference_logits(images), atol=1e-4)


def test_the_cpu_provider_runs_session_run_unless_asked(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        assert runner.device_binding is None


def test_cuda_graph_without_io_binding_is_refused(model_path: Path) -> None:
    with pytest.raises(BackendError, match="enable_cuda_graph needs io_binding"):
        OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[CUDA_GRAPH], io_binding=False)
    with pytest.raises(BackendError, match="io_binding must be true, false or null"):
        OnnxRuntimeRunner(model_path, SIGNATURE, io_binding="yes")  # type: ignore[arg-type]


def test_the_manifest_can_turn_binding_on(tmp_path: Path) -> None:
    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.bundle import open_bundle
    from tests.runtime.tiny_bundle import write_manifest

    root = build_bundle(tmp_path / "bundle")
    manifest = open_bundle(root).manifest
    manifest["backend"]["io_binding"] = True
    write_manifest(root, manifest)
    with create_runner(open_bundle(root, verify=True)) as runner:
        assert runner.device_binding is not None


# -- on an NVIDIA GPU with onnxruntime-gpu ----------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_binds_device_buffers_and_matches_the_reference(tmp_path: Path, model_path: Path, precision: str) -> None:
    path, signature, dtype, atol = (model_path, SIGNATURE, np.float32, 1e-3) if precision == "fp32" else \
        (_write_fp16_model(tmp_path / "fp16.onnx"), _fp16_signature(), np.float16, 5e-2)  # fmt: skip
    with OnnxRuntimeRunner(path, signature, execution_providers=[CUDA, "CPUExecutionProvider"]) as runner:
        assert runner.providers[0] == "CUDAExecutionProvider"
        binding = runner.device_binding
        assert binding is not None and binding.describe()["device"] == "cuda:0"
        for seed, batch in enumerate((4, 1, 4)):
            images = _images(batch, seed)
            logits = runner.infer({"image": images.astype(dtype)})["logits"]
            assert logits.dtype == dtype
            np.testing.assert_allclose(logits.astype(np.float32), reference_logits(images.astype(dtype).astype(np.float32)), atol=atol, rtol=atol)
        (resident,) = binding.run_resident({"image": binding.to_device(_images(2, 5).astype(dtype))})
        assert resident.device_name().lower() == "cuda"
        np.testing.assert_allclose(resident.numpy().astype(np.float32), reference_logits(_images(2, 5).astype(dtype).astype(np.float32)), atol=atol, rtol=atol)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_replay_one_graph_per_shape_with_fresh_values(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[CUDA_GRAPH, "CPUExecutionProvider"]) as runner:
        binding = runner.device_binding
        assert binding is not None and binding.cuda_graph
        for round_ in range(4):  # capture on the first calls, replay on the later ones: results must follow the inputs
            for batch in (4, 2):
                images = _images(batch, 10 * round_ + batch)
                np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), atol=1e-3, rtol=1e-3)
        assert binding.graphs_captured == 2


@pytest.mark.gpu
@needs_cuda
def test_golden_self_check_passes_on_the_gpu_as_the_agent_loads_it(tmp_path: Path) -> None:
    for name, providers in (("plain", [CUDA, "CPUExecutionProvider"]), ("graph", [CUDA_GRAPH, "CPUExecutionProvider"])):
        root = build_bundle(tmp_path / name, execution_providers=providers)
        loaded = load_bundle(root, BundlesConfig(dir=tmp_path, allow_unsigned=True))
        try:
            assert loaded.check.passed and loaded.check.providers[0] == "CUDAExecutionProvider"
            assert loaded.runner.device_binding is not None and loaded.runner.device_binding.cuda_graph == (name == "graph")
        finally:
            loaded.runner.close()


def _tensorrt_libraries_present() -> bool:
    import ctypes.util

    return ctypes.util.find_library("nvinfer") is not None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(_tensorrt_libraries_present(), reason="TensorRT's libraries are here: its provider would load")
def test_tensorrt_missing_falls_to_cuda_with_the_manifests_options(model_path: Path, images: np.ndarray, caplog: pytest.LogCaptureFixture) -> None:
    """A bundle built for an NVIDIA target lists TensorRT, then CUDA: without TensorRT's libraries the runner
    runs on CUDA with CUDA's own options (ONNX Runtime's own retry would drop them) and says so."""
    providers = [{"name": "TensorrtExecutionProvider", "options": {"trt_fp16_enable": False}}, CUDA_GRAPH, "CPUExecutionProvider"]
    with caplog.at_level("WARNING"), OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=providers) as runner:
        assert runner.providers[0] == "CUDAExecutionProvider"
        assert runner.providers_that_failed == ("TensorrtExecutionProvider",)
        assert runner.device_binding is not None and runner.device_binding.cuda_graph  # enable_cuda_graph survived
        np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), atol=1e-3, rtol=1e-3)
    assert "TensorrtExecutionProvider did not load" in caplog.text


def test_two_bindings_over_one_session_never_share_a_graph_id(model_path: Path) -> None:
    """Graph ids are ONNX Runtime's per session: a second binding must not reuse the first's ids (on the GPU
    it would replay the first's graph on the first's buffers). On the CPU the ids are given out the same way."""
    from edgekit_runtime.backends.ort_device_io import DeviceBinding

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    first = DeviceBinding(ort, session, ["logits"], device="cpu", cuda_graph=True)
    second = DeviceBinding(ort, session, ["logits"], device="cpu", cuda_graph=True)
    for binding, batch in ((first, 1), (second, 4), (first, 3)):
        images = _images(batch, batch)
        np.testing.assert_allclose(binding.run({"image": images})[0], reference_logits(images), atol=1e-4)
    ids = sorted(slot.graph_id for binding in (first, second) for slot in binding._slots.values())
    assert ids == [0, 1, 2]


def test_cuda_runs_fp32_as_fp32_unless_the_manifest_asks_for_tf32(model_path: Path) -> None:
    """ONNX Runtime's CUDA provider defaults to TF32 for FP32 MatMul/Conv; edgekit turns it off by default
    (an FP32 bundle's golden self-check failed on an H100 with it on) and keeps an explicit choice."""
    runner = OnnxRuntimeRunner(model_path, SIGNATURE, execution_providers=[CUDA, {"name": "CUDAExecutionProvider", "options": {"use_tf32": True}}])
    assert runner.execution_providers[0].ort_options() == {"use_tf32": "0", "device_id": "0"}
    assert runner.execution_providers[1].ort_options() == {"use_tf32": "1"}
