"""Golden files and their tolerances: derived per output from the built model, tight enough that another
model of the same signature fails the device's self-check, compressed on disk, and always in ranges the
runtime accepts."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.bundle.golden import REDUCED_PRECISION_MARGIN, derive_tolerances
from edgekit.bundle.manifest import write_manifest
from edgekit.errors import BuildError, BundleError
from edgekit.pipeline import build
from edgekit.recipe import ParitySpec
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.golden import compare_output, parse_tolerances
from tests.sources.onnx_models import paddle_style_cnn, write_recipe


def _two_outputs(seed: int) -> onnx.ModelProto:
    """The CNN with its logits as a second output: two outputs of very different magnitude."""
    model = paddle_style_cnn(opset=13, seed=seed, batch_dim="batch")
    model.graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4]))
    return model


def _build(tmp_path: Path, precision: str, model: onnx.ModelProto) -> Path:
    recipe = write_recipe(tmp_path, model)
    text = recipe.read_text().replace("outputs: [prob]", "outputs: [prob, logits]") if len(model.graph.output) == 2 else recipe.read_text()
    recipe.write_text(text)
    out = tmp_path / f"bundle-{precision}"
    build(recipe, "x86-64-cpu", precision=precision, out=out)
    return out


def _check(bundle_dir: Path, verify: bool = True):
    bundle = open_bundle(bundle_dir, verify=verify)
    return self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle), raise_on_failure=False)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_built_bundle_passes_and_another_model_of_its_signature_fails(tmp_path: Path, precision: str) -> None:
    bundle_dir = _build(tmp_path, precision, _two_outputs(seed=0))
    passed = _check(bundle_dir)
    assert passed.passed, passed.to_dict()
    # The same signature with other weights, as a device that got the wrong model.onnx would run it.
    onnx.save(_two_outputs(seed=1), str(bundle_dir / "model.onnx"))
    failed = _check(bundle_dir, verify=False)
    assert not failed.passed
    assert {check.name for check in failed.outputs if not check.passed} == {"prob", "logits"}
    with pytest.raises(BundleError, match=r"self-check of bundle .* failed .*output 'prob': max_abs_diff"):
        bundle = open_bundle(bundle_dir, verify=False)
        self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle))


def test_tolerances_are_per_output_and_come_from_the_measured_deviation(tmp_path: Path) -> None:
    bundle_dir = _build(tmp_path, "int8", _two_outputs(seed=0))
    golden = json.loads((bundle_dir / "manifest.json").read_text())["golden"]
    prob, logits = golden["outputs"]["prob"], golden["outputs"]["logits"]
    for entry in (prob, logits):
        measured = entry["measured"]
        assert measured["max_abs_diff"] > 0  # int8 deviates, and the tolerance is built from that
        every_element = max(1e-4, min(REDUCED_PRECISION_MARGIN * measured["max_abs_diff"], max(measured["max_abs_diff"], measured["max_abs_reference"])))
        if "outlier_fraction" in measured:  # a tighter atol that most elements meet, a few allowed outside it
            assert entry["atol"] < every_element
            assert entry["max_mismatched_fraction"] == pytest.approx(REDUCED_PRECISION_MARGIN * measured["outlier_fraction"])
        else:
            assert entry["atol"] == pytest.approx(every_element)
        cosine = measured["cosine_min"]
        assert entry["min_cosine"] == pytest.approx(min(0.9999, max(0.0, cosine - (REDUCED_PRECISION_MARGIN - 1) * (1 - cosine))))
        assert 0 <= entry["min_cosine"] <= cosine <= 1
    assert prob["atol"] < logits["atol"]  # a probability's tolerance is not the logits'
    assert prob["atol"] <= prob["measured"]["max_abs_reference"]
    assert golden["atol"] >= max(prob["atol"], logits["atol"])  # every element inside, for runtimes that read only these
    assert golden["min_cosine"] == min(prob["min_cosine"], logits["min_cosine"])
    report = (bundle_dir / "report.html").read_text()
    assert f"atol {prob['atol']:.2e}" in report and "output logits" in report  # the report lists each output's tolerance


def test_golden_files_are_compressed_and_uncompressed_ones_still_read(tmp_path: Path) -> None:
    bundle_dir = _build(tmp_path, "fp32", paddle_style_cnn(opset=13, batch_dim="batch"))
    files = sorted((bundle_dir / "golden").glob("*.npz"))
    assert len(files) == 4
    for path in files:
        with zipfile.ZipFile(path) as archive:
            assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_DEFLATED}
    for path in files:  # as bundles built before compression hold them
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
        np.savez(path, **arrays)
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    write_manifest(bundle_dir, {**manifest, "files": {}})  # the new hashes
    assert _check(bundle_dir).passed


# ---------------------------------------------------------------------------------------------- derivation


def _rows(cosine: float, rows: int = 3, width: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A reference and a 'built' output whose every row has exactly ``cosine`` to the reference row."""
    rng = np.random.default_rng(seed)
    reference = rng.normal(size=(rows, width))
    noise = rng.normal(size=(rows, width))
    noise -= (np.einsum("ij,ij->i", noise, reference) / np.einsum("ij,ij->i", reference, reference))[:, None] * reference
    noise *= (np.linalg.norm(reference, axis=1) / np.linalg.norm(noise, axis=1))[:, None]
    angle = np.arccos(cosine)
    return reference.astype(np.float32), (np.cos(angle) * reference + np.sin(angle) * noise).astype(np.float32)


def test_a_loose_budget_never_writes_min_cosine_below_zero() -> None:
    """The build that wrote min_cosine -2.69: its int8 output had cosine 0.08 with the reference."""
    reference, built = _rows(0.08)
    tolerances, measured = derive_tolerances([{"y": reference}], [{"y": built}], ParitySpec())
    assert measured["y"]["cosine_min"] == pytest.approx(0.08, abs=1e-4)
    assert tolerances.outputs["y"].min_cosine == 0.0
    section = {"batches": [], **tolerances.default.to_dict(), "outputs": {"y": tolerances.outputs["y"].to_dict()}}
    assert parse_tolerances(section, where="manifest.json").for_output("y") == tolerances.outputs["y"]


def test_close_outputs_keep_the_recipe_s_parity_tolerance_as_the_floor() -> None:
    reference, built = _rows(0.9999999)
    tolerances, _ = derive_tolerances([{"y": reference}], [{"y": reference}], ParitySpec(atol=1e-4, rtol=1e-3, min_cosine=0.9999))
    assert tolerances.outputs["y"].to_dict() == {"atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999, "max_mismatched_fraction": 0.0, "batch_axis": 0}
    tolerances, _ = derive_tolerances([{"y": reference}], [{"y": built}], ParitySpec(min_cosine=0.9999))
    assert tolerances.outputs["y"].min_cosine == 0.9999


def test_anticorrelated_or_non_finite_outputs_fail_the_build() -> None:
    reference, built = _rows(-0.5)
    with pytest.raises(BuildError, match=r"golden output 'y': the built model's rows point away from the reference \(cosine -0\.500"):
        derive_tolerances([{"y": reference}], [{"y": built}], ParitySpec())
    broken = reference.copy()
    broken[1, 3] = np.inf
    with pytest.raises(BuildError, match=r"golden output 'y': the built model computes NaN or infinity .*golden batch 0") as caught:
        derive_tolerances([{"y": reference}], [{"y": broken}], ParitySpec())
    assert "build a wider precision" in caught.value.hint


def test_a_device_applied_precision_widens_to_the_format_s_tolerance() -> None:
    reference = np.linspace(-300, 300, 64, dtype=np.float32).reshape(2, 32)
    tolerances, _ = derive_tolerances([{"boxes": reference}], [{"boxes": reference}], ParitySpec(), device_applied=(0.02, 0.999))
    assert tolerances.outputs["boxes"].to_dict() == {"atol": pytest.approx(0.02 * 300), "rtol": 0.02, "min_cosine": 0.999, "max_mismatched_fraction": 0.0, "batch_axis": 0}


def test_outputs_near_zero_on_the_golden_inputs_are_flagged_as_a_weak_check() -> None:
    """A text detector on random pixels: sigmoid maps of about 1e-6 everywhere, int8 cosine about 0.5."""
    reference, built = _rows(0.5)
    tolerances, measured = derive_tolerances([{"map": reference * 1e-6}], [{"map": built * 1e-6}], ParitySpec(), margin=3.0)
    assert tolerances.outputs["map"].atol == 1e-4 and tolerances.outputs["map"].min_cosine == 0.0
    assert "output 'map': the golden outputs stay within atol 0.0001 of zero" in measured["map"]["weak"]
    assert "give data.samples the model responds to" in measured["map"]["weak"]
    reference, built = _rows(0.999)
    assert "weak" not in derive_tolerances([{"y": reference}], [{"y": built}], ParitySpec(), margin=3.0)[1]["y"]


RAPIDOCR = importlib.util.find_spec("rapidocr_onnxruntime")
DET_RECIPE = """\
name: ppocr-det
model: {kind: onnx, path: det.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 3, 96, 96]}
outputs: [sigmoid_0.tmp_0]
dims:
  batch: {min: 1, opt: 1, max: 2}
data:
  samples: {npz_dir: samples}
  calibration: {npz_dir: samples}
build:
  benchmark: {warmup: 1, iterations: 2}
"""


@pytest.mark.slow  # int8 calibration of a 4.7 MB detector: about 30 s
@pytest.mark.skipif(RAPIDOCR is None or not RAPIDOCR.submodule_search_locations, reason="rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
def test_a_weak_golden_check_is_a_manifest_warning(tmp_path: Path) -> None:
    """PP-OCRv4's text detector on random pixels finds no text: its int8 maps are about 1e-6 everywhere."""
    assert RAPIDOCR is not None and RAPIDOCR.submodule_search_locations
    models = Path(RAPIDOCR.submodule_search_locations[0]) / "models"
    (tmp_path / "det.onnx").write_bytes((models / "ch_PP-OCRv4_det_infer.onnx").read_bytes())
    (tmp_path / "samples").mkdir()
    rng = np.random.default_rng(0)
    for index in range(2):
        np.savez(tmp_path / "samples" / f"{index}.npz", x=rng.uniform(-1, 1, (1, 3, 96, 96)).astype(np.float32))
    (tmp_path / "det.yaml").write_text(DET_RECIPE)
    manifest = build(tmp_path / "det.yaml", "x86-64-cpu", precision="int8", out=tmp_path / "bundle").manifest
    golden = manifest["golden"]
    assert [w.split(": ")[0] for w in golden["warnings"]] == ["output 'sigmoid_0.tmp_0'"]
    assert golden["outputs"]["sigmoid_0.tmp_0"]["measured"]["max_abs_reference"] < 1e-4
    assert _check(tmp_path / "bundle").passed  # weak, but still the bundle it was built as


def test_a_few_far_elements_do_not_loosen_the_tolerance_of_all_the_others() -> None:
    """An int8 softmax's worst element was 0.31 off while 99.9 % were within 0.003: the tolerance follows
    the many, allows the few (times the margin), and still fails a model whose elements are all off."""
    rng = np.random.default_rng(4)
    reference = rng.uniform(0, 1, size=(4, 2500)).astype(np.float32)
    built = reference + rng.normal(0, 1e-3, size=reference.shape).astype(np.float32)
    built.reshape(-1)[rng.choice(built.size, 5, replace=False)] += 0.5
    tolerances, measured = derive_tolerances([{"p": reference}], [{"p": built}], ParitySpec(), margin=3.0)
    tolerance = tolerances.outputs["p"]
    assert tolerance.atol < 0.02 and tolerances.default.atol >= 0.5  # old runtimes read only the default: every element inside
    assert measured["p"]["outlier_fraction"] == pytest.approx(5 / 10_000)
    assert tolerance.max_mismatched_fraction == pytest.approx(15 / 10_000)
    assert compare_output("p", reference, built, **tolerance.to_dict()).passed
    wrong = reference + rng.normal(0, 0.02, size=reference.shape).astype(np.float32)  # cosine still 0.9994
    check = compare_output("p", reference, wrong, **tolerance.to_dict())
    assert not check.passed and check.cosine_min > tolerance.min_cosine  # the element check catches it
    assert "0.150% may be" in check.describe(**tolerance.to_dict())


def test_an_output_mixing_ranges_gets_a_band_relative_to_the_golden_value() -> None:
    """Boxes in pixels beside scores in 0..1 in one tensor: boxes off by about 1 %, scores by 0.005. One
    absolute band would be the boxes' 3 px x margin and accept any score; the relative band does not."""
    rng = np.random.default_rng(5)
    boxes, scores = rng.uniform(20, 300, size=(2, 50, 4)), rng.uniform(0, 1, size=(2, 50, 3))
    reference = np.concatenate([boxes, scores], axis=2).astype(np.float32)
    built = reference * (1 + rng.uniform(-0.01, 0.01, size=reference.shape)).astype(np.float32)
    built[..., 4:] = scores + rng.uniform(-0.005, 0.005, size=scores.shape)
    tolerances, measured = derive_tolerances([{"det": reference}], [{"det": built}], ParitySpec(), margin=3.0)
    band = tolerances.outputs["det"]
    assert 0 < measured["det"]["relative_error"] <= 0.05 and band.rtol == pytest.approx(3.0 * measured["det"]["relative_error"])
    assert band.atol < 0.05 < tolerances.default.atol  # the default (every element, absolute) stays for old runtimes
    assert compare_output("det", reference, built, **band.to_dict()).passed
    wrong_scores = built.copy()
    wrong_scores[..., 4:] = 1 - wrong_scores[..., 4:]
    check = compare_output("det", reference, wrong_scores, **band.to_dict())
    assert not check.passed and check.cosine_min > band.min_cosine  # the boxes hide it from the cosine, not from the band
    assert compare_output("det", reference, wrong_scores, **tolerances.default.to_dict()).passed  # one absolute band accepts them


def test_an_output_of_one_range_keeps_one_absolute_band() -> None:
    reference, built = _rows(0.999)
    tolerances, measured = derive_tolerances([{"y": reference}], [{"y": built}], ParitySpec(), margin=3.0)
    assert "relative_error" not in measured["y"] and tolerances.outputs["y"].rtol == ParitySpec().rtol
