"""ONNX files from other toolchains: opset 11/12 graphs, ``dim_value: -1`` dims, real Paddle2ONNX models."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.errors import BuildError
from edgekit.pipeline import build
from edgekit.sources import onnx_file
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.sources.onnx_models import paddle_style_cnn, write_recipe


def _dequantize_axes(path: Path) -> list[bool]:
    """For each DequantizeLinear of the model: does it carry an axis attribute (per-channel)?"""
    model = onnx.load(str(path))
    return [any(a.name == "axis" for a in node.attribute) for node in model.graph.node if node.op_type == "DequantizeLinear"]


def _self_check(bundle_dir: Path):
    bundle = open_bundle(bundle_dir)
    return self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle))


def test_minus_one_dims_are_named_and_the_bundle_opens(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=11))
    manifest = build(recipe, "x86-64-cpu", out=tmp_path / "bundle").manifest
    io = manifest["io"]
    assert io["inputs"][0]["shape"] == ["batch", 3, 8, 8]
    output_shape = io["outputs"][0]["shape"]
    assert output_shape[1] == 4 and isinstance(output_shape[0], str)
    notes = manifest["export"]["source_notes"]
    assert "input 'x' axis 0: dim_value: -1 in the file, treated as the dynamic dim 'batch'" in notes
    assert any(note.startswith("output 'prob' axis 0: dim_value: -1 in the file") for note in notes)
    assert manifest["model"]["opset"] == 11  # FP32 needs no upgrade; the manifest says what the bundle holds
    assert manifest["export"]["opset_conversion"] is None
    assert _self_check(tmp_path / "bundle").passed


@pytest.mark.parametrize("batch_dim", [0, None])
def test_zero_and_missing_dims_are_dynamic_too(tmp_path: Path, batch_dim: int | None) -> None:
    model = paddle_style_cnn(opset=12, batch_dim=batch_dim)
    recipe = write_recipe(tmp_path, model)
    manifest = build(recipe, "x86-64-cpu", out=tmp_path / "bundle").manifest
    written = "dim_value: 0" if batch_dim == 0 else "no dim_value or dim_param"
    assert f"input 'x' axis 0: {written} in the file, treated as the dynamic dim 'batch'" in manifest["export"]["source_notes"]
    assert manifest["model"]["opset"] == 12


@pytest.mark.parametrize("opset", [11, 12])
def test_int8_upgrades_an_old_opset_and_records_it(tmp_path: Path, opset: int) -> None:
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=opset))
    manifest = build(recipe, "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert conversion["original_opset"] == opset and conversion["converted_opset"] == 13 and conversion["fallback"] is None
    assert "DequantizeLinear with an axis attribute" in conversion["reason"]
    assert conversion["max_abs_diff"] < 1e-5  # checked against the original on the samples
    assert manifest["export"]["opset"] == opset
    assert manifest["model"]["opset"] == 13
    axes = _dequantize_axes(tmp_path / "bundle" / "model.onnx")
    assert axes and any(axes)  # per-channel weights, as the recipe asked
    assert _self_check(tmp_path / "bundle").passed


def _failing_converter(model, opset):
    raise RuntimeError(f"No Adapter For Current Version $11 for Conv (asked for opset {opset})")


def test_int8_falls_back_to_per_tensor_when_the_upgrade_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnx's converter handled every opset-11/12 graph tried (subgraphs, functions, sequences, Softmax with
    # unknown rank); a converter that raises stands in for the files it cannot upgrade.
    monkeypatch.setattr(onnx_file, "_convert", _failing_converter)
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=11))
    manifest = build(recipe, "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert conversion["converted_opset"] is None
    assert "No Adapter For Current Version" in conversion["error"]
    assert conversion["fallback"].startswith("per-tensor int8 (quantization.per_channel: false)")
    assert manifest["quantization"]["plan"]["per_channel"] is False
    assert manifest["model"]["opset"] == 11
    axes = _dequantize_axes(tmp_path / "bundle" / "model.onnx")
    assert axes and not any(axes)  # per-tensor: what opset 11 supports, so ONNX Runtime loads it
    assert _self_check(tmp_path / "bundle").passed


def test_auto_on_a_file_that_cannot_be_upgraded_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_file, "_convert", _failing_converter)
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=11))
    with pytest.raises(BuildError) as caught:
        build(recipe, "x86-64-cpu", precision="auto", out=tmp_path / "bundle")
    text = f"{caught.value} {caught.value.hint}"
    assert "thirdparty.onnx is opset 11; --precision auto needs opset 13" in text
    assert "No Adapter For Current Version" in text
    assert "int8 with per-tensor scales" in text and "paddle2onnx --opset_version 13" in text
    assert "re-export" not in text


def test_a_converted_graph_that_disagrees_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upgrade is checked on the samples: a conversion that changes the results falls back."""
    other = paddle_style_cnn(opset=13, seed=5)
    monkeypatch.setattr(onnx_file, "_convert", lambda model, opset: other)
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=11))
    manifest = build(recipe, "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert "the converted graph's output 'prob' differs from the original's" in conversion["error"]
    assert conversion["fallback"] is not None and manifest["model"]["opset"] == 11


# ---------------------------------------------------------------------------------------------- real files

RAPIDOCR = importlib.util.find_spec("rapidocr_onnxruntime")
RAPIDOCR_MODELS = Path(RAPIDOCR.submodule_search_locations[0]) / "models" if RAPIDOCR and RAPIDOCR.submodule_search_locations else None

CLS_RECIPE = """\
name: ppocr-cls
model: {kind: onnx, path: cls.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 3, 48, 192]}
outputs: [save_infer_model/scale_0.tmp_1]
dims:
  batch: {min: 1, opt: 2, max: 4}
data:
  samples: {npz_dir: samples}
  calibration: {npz_dir: samples}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


@pytest.mark.skipif(RAPIDOCR_MODELS is None, reason="rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
def test_paddle2onnx_direction_classifier_builds_int8(tmp_path: Path) -> None:
    """PP-OCR's direction classifier: opset 11, batch written as dim_value -1, H/W as '?'."""
    assert RAPIDOCR_MODELS is not None
    shutil.copy(RAPIDOCR_MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx", tmp_path / "cls.onnx")
    (tmp_path / "samples").mkdir()
    rng = np.random.default_rng(0)
    for index in range(2):
        np.savez(tmp_path / "samples" / f"{index}.npz", x=rng.uniform(-1, 1, (2, 3, 48, 192)).astype(np.float32))
    (tmp_path / "cls.yaml").write_text(CLS_RECIPE)
    manifest = build(tmp_path / "cls.yaml", "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    assert manifest["export"]["opset_conversion"]["original_opset"] == 11
    assert manifest["model"]["opset"] == 13
    assert "input 'x' axis 0: dim_value: -1 in the file, treated as the dynamic dim 'batch'" in manifest["export"]["source_notes"]
    assert _self_check(tmp_path / "bundle").passed


def test_int8_below_opset_10_has_no_per_tensor_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_file, "_convert", _failing_converter)
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=9))
    with pytest.raises(BuildError, match=r"thirdparty\.onnx is opset 9; precision int8 needs opset 13 \(per-channel int8") as caught:
        build(recipe, "x86-64-cpu", precision="int8", out=tmp_path / "bundle")
    assert "an explicit precision that opset 9 supports (fp32, fp16)," in caught.value.hint


def test_auto_upgrades_an_opset_11_file_for_its_search(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, paddle_style_cnn(opset=11))
    manifest = build(recipe, "x86-64-cpu", precision="auto", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert conversion["converted_opset"] == 13 and "sensitivity analysis" in conversion["reason"]
    assert manifest["precision_decision"]["requested"] == "auto"
    assert _self_check(tmp_path / "bundle").passed


def test_a_file_newer_than_the_targets_opset_is_converted_down_to_it(tmp_path: Path) -> None:
    """A file stamped opset 22 built for a Raspberry Pi 5 (its profile builds at opset 18): the bundle holds the
    graph converted to opset 18, checked against the original on the samples, so an older device runtime loads it."""
    model = paddle_style_cnn(opset=13)
    model.opset_import[0].version = 22  # every op of this graph reads the same at 13 and 22
    recipe = write_recipe(tmp_path, model)
    manifest = build(recipe, "raspberry-pi-5", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert (conversion["original_opset"], conversion["converted_opset"], conversion["fallback"]) == (22, 18, None)
    assert conversion["reason"] == "raspberry-pi-5 builds at opset 18" and conversion["max_abs_diff"] < 1e-5
    assert manifest["export"]["opset"] == 22 and manifest["model"]["opset"] == 18  # the file, and what the bundle holds
    assert _self_check(tmp_path / "bundle").passed


def test_an_op_with_no_older_version_keeps_the_files_opset_and_says_so(tmp_path: Path) -> None:
    """Gelu exists from opset 20 only: converting to 18 fails, the file's opset stays, and the manifest says what the
    device's runtime must then load (the agent's self-check refuses the bundle where it cannot)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["prob"])], "gelu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 3, 8, 8])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    manifest = build(write_recipe(tmp_path, model), "raspberry-pi-5", out=tmp_path / "bundle").manifest
    conversion = manifest["export"]["opset_conversion"]
    assert conversion["converted_opset"] is None and "No Previous Version of Gelu" in conversion["error"]
    assert conversion["fallback"].startswith("the device's runtime must load opset 20")
    assert manifest["model"]["opset"] == 20


@pytest.mark.parametrize("location", ["../../../etc/hostname", "/etc/hostname"])
def test_external_data_outside_the_files_folder_is_refused_never_read(tmp_path: Path, location: str) -> None:
    """A file from elsewhere whose external data points out of its folder: onnx refuses to read it (nothing of
    /etc ends up in a bundle), and the hint says where the data must be, not that the copy was incomplete."""
    from onnx import TensorProto

    from edgekit.errors import SourceError

    model = paddle_style_cnn(opset=13)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    with pytest.raises(SourceError) as info:
        build(write_recipe(tmp_path, model), "x86-64-cpu", out=tmp_path / "bundle")
    assert "is not a valid ONNX model" in info.value.message and "/etc/hostname" in info.value.message
    assert info.value.hint.startswith(f"its external data files must sit in {tmp_path}")
    assert not (tmp_path / "bundle").exists()
