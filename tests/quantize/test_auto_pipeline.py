"""``--precision auto`` through the whole build: the manifest and the report say what was chosen and why."""

from __future__ import annotations

import pytest

from edgekit.errors import BuildError
from edgekit.pipeline import build
from tests.conftest import TINY_RECIPE

CALIBRATED = TINY_RECIPE.replace(
    '  evaluation: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{labels: true}}}}',
    '  evaluation: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{labels: true}}}}\n'
    '  calibration: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{count: 4}}}}',
).replace("budget: {{max_drop: 0.0}}", "budget: {{max_drop: 0.25}}")


def test_auto_build_records_the_search(tiny_recipe, tmp_path):
    result = build(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")), "x86-64-cpu", precision="auto", out=tmp_path / "auto")
    manifest = result.manifest
    decision = manifest["precision_decision"]
    assert decision["requested"] == "auto" and decision["policy"].startswith("auto: ")
    auto = manifest["quantization"]["auto"]
    statuses = {row["name"]: row["status"] for row in auto["candidates"]}
    assert list(statuses.values()).count("chosen") == 1
    assert manifest["precision"] == next(row["precision"] for row in auto["candidates"] if row["status"] == "chosen")
    assert manifest["accuracy"]["passed"] is True
    assert_label_matches_content(result.bundle_dir / "model.onnx", manifest)
    page = (result.bundle_dir / "report.html").read_text()
    assert "Plans the auto search tried" in page and "Precision and pruning" in page


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear",
                 "MatMulNBits"}


def assert_label_matches_content(model_path, manifest) -> None:  # type: ignore[no-untyped-def]
    """A bundle labelled int8 contains quantized ops; one labelled fp32 contains none, and says when its graph was rewritten."""
    import onnx

    ops = {node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node}
    auto = manifest["quantization"]["auto"]
    if manifest["precision"] in ("int8", "int8-dynamic", "int4"):
        assert ops & QUANTIZED_OPS, f"labelled {manifest['precision']} but no quantized op in {sorted(ops)}"
        assert auto["plan"] is not None
    else:
        assert not ops & QUANTIZED_OPS, f"labelled {manifest['precision']} but holds {sorted(ops & QUANTIZED_OPS)}"
        assert auto["plan"] is None
        assert (auto["graph"] == "float-rewrites") == any(note.startswith("fp32 (rewritten)") for note in auto["notes"])


def test_auto_needs_calibration_and_evaluation(tiny_recipe, tmp_path):
    with pytest.raises(BuildError, match=r"precision auto needs calibration data|needs calibration data"):
        build(tiny_recipe(), "x86-64-cpu", precision="auto", out=tmp_path / "b")


def test_auto_is_refused_for_tensorrt(tiny_recipe, tmp_path):
    with pytest.raises(BuildError, match=r"--precision auto searches ONNX Runtime plans; the tensorrt backend needs an explicit precision"):
        build(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")), "jetson-orin-nano-8gb", precision="auto", out=tmp_path / "b")
