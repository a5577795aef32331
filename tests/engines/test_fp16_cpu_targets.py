"""fp16 on a CPU target is not a speed-up (issue 29: a convolutional model ran ~2x slower than FP32 in fp16 on an
x86 CPU): every CPU-only target in the registry warns in the build log, the manifest and the report, and ``auto``
picks fp16 there only when its interleaved timing beats FP32."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgekit.engines.fp16 import CPU_FP16_NOTES
from edgekit.engines.onnxruntime import build_onnxruntime
from edgekit.pipeline import build
from edgekit.precision import Backend, Precision
from edgekit.recipe import load_recipe
from edgekit.target import default_registry
from tests.quantize.test_auto import Scripted, other, static
from tests.quantize.test_auto_never_slower import Retimed
from tests.sources.onnx_models import paddle_style_cnn, write_recipe


def _cpu_only_targets() -> list[str]:
    """Registered targets whose ONNX Runtime providers are all the CPU provider."""
    names = []
    for target in default_registry().all():
        try:
            support = target.backend(Backend.ONNXRUNTIME)
        except Exception:  # a target without ONNX Runtime (TensorRT only) has no CPU fp16 question
            continue
        if support.execution_providers and all(ep.name == "CPUExecutionProvider" for ep in support.execution_providers):
            names.append(target.name)
    return names


def test_the_cpu_only_targets_cover_both_architectures() -> None:
    arches = {default_registry().get(name).cpu.arch for name in _cpu_only_targets()}
    assert {"x86-64-cpu", "arm64-cpu", "raspberry-pi-5"} <= set(_cpu_only_targets())
    assert arches == set(CPU_FP16_NOTES)


@pytest.mark.parametrize("target_name", _cpu_only_targets())
def test_an_fp16_engine_for_a_cpu_target_carries_the_note(tmp_path: Path, target_name: str, caplog: pytest.LogCaptureFixture) -> None:
    recipe_path = write_recipe(tmp_path, paddle_style_cnn(opset=13, batch_dim="batch"))
    target = default_registry().get(target_name)
    with caplog.at_level(logging.WARNING, logger="edgekit.engines.onnxruntime"):
        engine = build_onnxruntime(tmp_path / "thirdparty.onnx", tmp_path / "model.onnx", target, load_recipe(recipe_path), Precision.FP16)
    note = CPU_FP16_NOTES[target.cpu.arch]
    assert engine.details["fp16"]["note"] == note
    assert f"fp16 on a CPU target ({target.cpu.arch}): {note}" in caplog.text


def test_an_fp16_build_of_a_conv_model_warns_in_the_manifest_and_the_report(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=13, batch_dim="batch"))
    result = build(recipe, "x86-64-cpu", precision="fp16", out=tmp_path / "bundle")
    note = CPU_FP16_NOTES["x86_64"]
    assert result.manifest["backend"]["fp16"]["note"] == note
    assert "often slower than FP32" in (tmp_path / "bundle" / "report.html").read_text()


def test_auto_does_not_pick_an_fp16_that_is_twice_as_slow(tmp_path: Path) -> None:
    """fp16 inside the budget (cosine 0.9999) but 1.9x FP32: FP32 is chosen, fp16's row says why."""
    engine = Scripted(tmp_path, {"static": 0.95, "fp16": 0.9999, "fp32": 1.0}, {"static": 70, "fp16": 190, "fp32": 100})
    result = engine.search([static("static"), other("fp16", Precision.FP16), other("fp32", Precision.FP32)])
    rows = {row.name: row for row in result.table}
    assert result.chosen.name == "fp32"
    assert rows["fp16"].status == "slower" and "1.900x FP32 on this host: a quantized plan is chosen only when it is faster than FP32" in rows["fp16"].detail


def test_auto_re_times_an_fp16_within_the_noise_of_fp32(tmp_path: Path) -> None:
    engine = Retimed(tmp_path, {"fp16": 0.9999, "fp32": 1.0}, {"fp16": 97})
    engine.timings = {"fp16": [97.0, 104.0]}
    result = engine.search([other("fp16", Precision.FP16), other("fp32", Precision.FP32)])
    assert result.chosen.name == "fp32"
    assert "not faster than FP32 twice" in {row.name: row for row in result.table}["fp16"].detail
