"""The openvino backend end to end on real OpenVINO (its CPU plugin runs here): builds for x86-64-cpu and for the
Core Ultra NPU (the CPU plugin standing in, labelled so), the manifest's OpenVINO record, self-checks on the
runtime's runner, bench, and the precision gating with each refusal named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.errors import BuildError, QuantizationError
from edgekit.pipeline import build
from edgekit.precision import Backend, Precision
from edgekit.quantize.gating import decide_precision, refusal_reason
from edgekit.target import BackendSupport, TargetProfile, get_target
from edgekit_runtime.backends import OpenVinoRunner, create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.hidden_module import hide_module
from tests.sources.onnx_models import image_batches, paddle_style_cnn, write_recipe

ov = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
VERSION = ov.__version__.split("-")[0]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_recipe(tmp_path_factory.mktemp("openvino"), paddle_style_cnn(opset=13, batch_dim="batch"))


def _ort_outputs(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_an_fp32_bundle_for_x86_records_the_compile_and_self_checks(recipe: Path, tmp_path: Path) -> None:
    result = build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "b", backend="openvino")
    section = result.manifest["backend"]
    assert section["name"] == "openvino" and section["selected_because"] == "--backend"
    assert section["openvino"] == {"device": "CPU", "inference_precision_hint": "f32", "version": VERSION,
                                   "cache_key": f"openvino-{VERSION}-cpu-f32", "graph": "onnx", "shapes": "dynamic"}
    bundle = open_bundle(tmp_path / "b", verify=True)
    with create_runner(bundle) as runner:
        assert isinstance(runner, OpenVinoRunner) and runner.providers == ("OpenVINO CPU (f32)",)
        assert self_check(bundle, runner).passed
        feeds = image_batches(count=1, batch=3)[0]
        np.testing.assert_allclose(runner.infer(feeds)["prob"], _ort_outputs(tmp_path / "b" / "model.onnx", feeds), rtol=1e-4, atol=1e-5)


def test_an_int8_bundle_runs_edgekits_own_qdq_graph(recipe: Path, tmp_path: Path) -> None:
    result = build(recipe, "x86-64-cpu", precision="int8", out=tmp_path / "b", backend="openvino")
    ops = {node.op_type for node in onnx.load(str(tmp_path / "b" / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert result.manifest["quantization"]["plan"]["backend"] == "openvino"
    assert result.manifest["backend"]["openvino"]["inference_precision_hint"] == "f32"  # float layers stay strict
    assert result.manifest["accuracy"]["value"] >= 0.5  # the recipe's cosine budget
    bundle = open_bundle(tmp_path / "b", verify=True)
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed


def test_an_npu_bundle_builds_with_the_cpu_plugin_standing_in(recipe: Path, tmp_path: Path) -> None:
    if "NPU" in ov.Core().available_devices:
        pytest.skip("this machine has an Intel NPU: nothing stands in")
    result = build(recipe, "intel-core-ultra-npu", precision="fp16", out=tmp_path / "b")
    record = result.manifest["backend"]["openvino"]
    assert result.manifest["backend"]["selected_because"] == "target preference"
    assert (record["device"], record["inference_precision_hint"], record["shapes"]) == ("NPU", "f16", "per-shape")
    assert record["cache_key"] == f"openvino-{VERSION}-npu-f16"
    assert record["host_stand_in"].startswith("CPU plugin on this host (no OpenVINO NPU here)")
    weights = onnx.load(str(tmp_path / "b" / "model.onnx")).graph.initializer
    assert any(w.data_type == onnx.TensorProto.FLOAT16 for w in weights)
    assert "not on the Intel Core Ultra 7 155H NPU" in (tmp_path / "b" / "report.html").read_text()
    bundle = open_bundle(tmp_path / "b", verify=True)
    with create_runner(bundle, device="CPU", inference_precision_hint="f32") as stand_in:
        assert self_check(bundle, stand_in).passed


def test_edgekit_bench_times_an_openvino_bundle_with_openvino(recipe: Path, tmp_path: Path) -> None:
    from edgekit.bench.compare import host_runner

    build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "b", backend="openvino")
    bundle = open_bundle(tmp_path / "b")
    runner = host_runner(bundle, bundle.io, 1)
    try:
        assert isinstance(runner, OpenVinoRunner) and runner.is_loaded and runner.threads == 1
    finally:
        runner.close()


# ------------------------------------------------------------------------------------------------ gating


def _x86_with_flags(flags: list[str]) -> TargetProfile:
    target = get_target("x86-64-cpu")
    return target.model_copy(update={"cpu": target.cpu.model_copy(update={"isa": flags})})


def test_bf16_needs_the_cpus_bf16_instructions() -> None:
    assert refusal_reason(_x86_with_flags(["avx2", "avx512f", "avx512_bf16"]), Backend.OPENVINO, Precision.BF16) is None
    assert refusal_reason(_x86_with_flags(["avx2", "amx_bf16"]), Backend.OPENVINO, Precision.BF16) is None
    with pytest.raises(QuantizationError) as caught:
        decide_precision(_x86_with_flags(["avx2", "avx512_vnni"]), Backend.OPENVINO, Precision.BF16)
    message = str(caught.value)
    assert "OpenVINO's CPU plugin computes bf16 only with avx512_bf16 or amx_bf16, which target 'x86-64-cpu' does not have (cpu.isa)" in message
    assert "use one of: fp32, int8" in message


def test_each_openvino_refusal_is_named() -> None:
    x86 = _x86_with_flags(["avx2", "avx512_bf16"])
    assert "computes fp16 only with avx512_fp16 or amx_fp16" in refusal_reason(x86, Backend.OPENVINO, Precision.FP16)
    assert "OpenVINO on CPU runs fp32, int8 (static QDQ) and bf16, fp16, not int8-dynamic" in refusal_reason(x86, Backend.OPENVINO, Precision.INT8_DYNAMIC)
    npu = get_target("intel-core-ultra-npu")
    assert refusal_reason(npu, Backend.OPENVINO, Precision.FP32) == "the NPU compiles FP32 layers to FP16: use fp16 or int8"
    assert "not bf16" in refusal_reason(npu, Backend.OPENVINO, Precision.BF16)
    assert refusal_reason(npu, Backend.OPENVINO, Precision.FP16) is None and refusal_reason(npu, Backend.OPENVINO, Precision.INT8) is None


def test_the_openvino_backend_names_its_device_and_only_it_does() -> None:
    with pytest.raises(ValueError, match="device .CPU, GPU or NPU. is required for the openvino backend"):
        BackendSupport(name=Backend.OPENVINO, precisions=(Precision.FP32,))
    with pytest.raises(ValueError, match="applies to no other backend"):
        BackendSupport(name=Backend.ONNXRUNTIME, precisions=(Precision.FP32,), device="CPU",
                       execution_providers=({"name": "CPUExecutionProvider"},))  # type: ignore[arg-type]
    assert [b.name for b in get_target("x86-64-cpu").backends] == [Backend.ONNXRUNTIME, Backend.OPENVINO]


def test_a_build_without_openvino_names_the_extra(recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "openvino")
    with pytest.raises(BuildError) as caught:
        build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "b", backend="openvino")
    assert "the openvino backend needs the OpenVINO runtime, which is not installed" in str(caught.value)
    assert "pip install 'edgekit[openvino]'" in str(caught.value)
