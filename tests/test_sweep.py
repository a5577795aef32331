"""``edgekit sweep``: every precision the target allows, built or estimated, with a table and a plot."""

from __future__ import annotations

import json

from edgekit.cli.main import main
from edgekit.report.sweep_plot import pareto_front
from tests.conftest import REPO, TINY_RECIPE

CALIBRATED = TINY_RECIPE.replace(
    '  evaluation: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{labels: true}}}}',
    '  evaluation: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{labels: true}}}}\n'
    '  calibration: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{count: 4}}}}',
).replace("budget: {{max_drop: 0.0}}", "budget: {{max_drop: 0.5}}")


def test_sweep_builds_every_cpu_precision(tiny_recipe, tmp_path, capsys):
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    out = tmp_path / "sweep"
    assert main(["sweep", str(recipe), "--target", "x86-64-cpu", "--out", str(out), "--iterations", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {row["variant"]: row for row in result["variants"]}
    # bf16 is a precision of the target's other backend (openvino), offered only where this CPU has bf16 (AVX-512 BF16
    # or AMX; not on an AVX2-only host): where listed, it is skipped, with the reason
    assert set(rows) - {"bf16"} == {"fp32", "fp16", "int8", "int8-dynamic", "int4"}
    if "bf16" in rows:
        bf16 = rows.pop("bf16")
        assert bf16["status"] == "skipped" and "other backend" in bf16["reason"], bf16
    assert all(row["status"] == "built" for row in rows.values()), rows
    assert rows["fp32"]["latency_vs_fp32"] == 1.0
    assert all(row["p50_ms"] > 0 and row["size_bytes"] > 0 for row in rows.values())
    assert rows["int8"]["size_bytes"] < rows["fp32"]["size_bytes"]
    page = (out / "sweep.html").read_text()
    assert "<svg" in page and "Pareto" in page and "int8-dynamic" in page


def test_sweep_builds_gpu_formats_and_evaluates_them_on_the_host_twin(tiny_recipe, tmp_path, capsys):
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    out = tmp_path / "thor"
    assert main(["sweep", str(recipe), "--target", "jetson-agx-thor", "--out", str(out), "--iterations", "5", "--json"]) == 0
    rows = {row["variant"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]}
    for name in ("fp8", "nvfp4", "mxfp4", "mxfp8"):
        assert rows[name]["status"] == "built", rows[name]
        assert rows[name]["metric_value"] is not None and rows[name].get("p50_ms") is None
        assert rows[name]["reason"] == "accuracy on the decoded host twin; latency needs the device"
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert manifest["precision"] == name and manifest["quantization"]["format"]["quantized_weights"] >= 1
    assert rows["fp8"]["size_bytes"] < rows["fp32"]["size_bytes"] and rows["nvfp4"]["size_bytes"] < rows["fp32"]["size_bytes"]


def test_sweep_estimates_formats_only_another_backend_runs(tiny_recipe, tmp_path, capsys):
    text = CALIBRATED.format(factory="tiny_net").replace("build:\n", "build:\n  backend: onnxruntime\n")
    recipe = tiny_recipe(text=text)
    out = tmp_path / "thor-ort"
    assert main(["sweep", str(recipe), "--target", "jetson-agx-thor", "--out", str(out), "--iterations", "5", "--json"]) == 0
    rows = {row["variant"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]}
    for name in ("fp8", "nvfp4", "mxfp4", "mxfp8"):
        assert rows[name]["status"] == "estimated", rows[name]
        assert rows[name]["metric_value"] is not None and rows[name]["p50_ms"] is None
        assert "exact codec" in rows[name]["reason"]
    for name in ("fp8", "nvfp4", "mxfp8"):  # activations quantized too (nvfp4 and mxfp8 as TensorRT does at run time)
        assert "weights and activations" in rows[name]["reason"], rows[name]
    assert "weights only" in rows["mxfp4"]["reason"]


def test_pareto_front():
    points = [(1.0, 0.90), (2.0, 0.95), (3.0, 0.94), (0.5, 0.80)]
    assert pareto_front(points, higher_is_better=True) == [3, 0, 1]
    assert pareto_front([(1.0, 0.1), (2.0, 0.05)], higher_is_better=False) == [0, 1]


def test_sweep_of_a_pruned_recipe_builds_both_variants_and_writes_nothing_beside_the_recipe(tiny_recipe, tmp_path, capsys):
    """The unpruned variants are the recipe built without its prune section, not a copy of the recipe written next to
    it (which failed in a read-only folder and was left behind)."""
    text = CALIBRATED.format(factory="tiny_net") + '  prune:\n    method: "magnitude"\n    sparsity: 0.5\n'
    recipe = tiny_recipe(text=text.replace("budget: {max_drop: 0.5}", "budget: {max_drop: 1.0}"))
    target = tmp_path / "two-precisions.yaml"
    target.write_text((REPO / "targets" / "x86-64-cpu.yaml").read_text().replace(
        "precisions: [fp32, fp16, int8, int8-dynamic, int4]", "precisions: [fp32, int8-dynamic]").replace(
        "name: x86-64-cpu", "name: two-precisions"))
    before = sorted(path.name for path in recipe.parent.iterdir())
    out = tmp_path / "sweep"
    assert main(["sweep", str(recipe), "--target", str(target), "--out", str(out), "--iterations", "3", "--json"]) == 0
    rows = {row["variant"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]}
    for name in ("fp32", "int8-dynamic", "fp32+pruned", "int8-dynamic+pruned"):
        assert rows[name]["status"] == "built", rows[name]
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert ((manifest.get("prune") or {}).get("method") == "magnitude") is name.endswith("+pruned"), manifest.get("prune")
        assert manifest["recipe"].get("prune_left_out", False) is not name.endswith("+pruned")  # said where it was left out
    assert sorted(path.name for path in recipe.parent.iterdir()) == sorted([*before, "sweep"])  # nothing else beside it


def _fp32_and_int8(recipe, target, backend):
    from edgekit.precision import Precision

    return [("fp32", Precision.FP32, False, True), ("int8", Precision.INT8, False, True)]


def test_an_internal_error_in_one_variant_is_a_failed_row_and_the_others_are_kept(tiny_recipe, tmp_path, monkeypatch, caplog):
    import edgekit.pipeline as pipeline
    import edgekit.sweep as sweep_module

    real_build = pipeline.build

    def build(recipe_path, target_name, precision=None, **kwargs):
        if precision.value == "int8":
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : simulated\nsecond line")
        return real_build(recipe_path, target_name, precision=precision, **kwargs)

    monkeypatch.setattr(pipeline, "build", build)
    monkeypatch.setattr(sweep_module, "_variants", _fp32_and_int8)
    out = tmp_path / "sweep"
    result = sweep_module.sweep(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")), "x86-64-cpu", out, iterations=3)
    rows = {row["variant"]: row for row in result.rows}
    assert rows["fp32"]["status"] == "built" and rows["fp32"]["p50_ms"] > 0
    assert rows["int8"] == {**rows["int8"], "status": "failed",
                            "reason": "internal error RuntimeError: [ONNXRuntimeError] : 1 : FAIL : simulated (trace in the log)"}
    assert "sweep variant int8 failed with an internal error" in caplog.text
    written = {row["variant"]: row["status"] for row in json.loads((out / "sweep.json").read_text())["variants"]}
    assert written == {"fp32": "built", "int8": "failed"} and (out / "sweep.html").is_file()


def test_the_rows_built_are_written_when_the_timing_fails(tiny_recipe, tmp_path, monkeypatch):
    import pytest

    import edgekit.bench.compare as compare
    import edgekit.sweep as sweep_module

    def broken_timing(bundles, iterations):
        raise RuntimeError("timing broke")

    monkeypatch.setattr(compare, "time_bundles_interleaved", broken_timing)
    monkeypatch.setattr(sweep_module, "_variants", lambda recipe, target, backend: _fp32_and_int8(recipe, target, backend)[:1])
    out = tmp_path / "sweep"
    with pytest.raises(RuntimeError, match="timing broke"):
        sweep_module.sweep(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")), "x86-64-cpu", out, iterations=3)
    written = json.loads((out / "sweep.json").read_text())["variants"]
    assert [(row["variant"], row["status"]) for row in written] == [("fp32", "built")]


def test_a_forced_resweep_removes_a_failed_variants_old_bundle(tiny_recipe, tmp_path, monkeypatch):
    import edgekit.pipeline as pipeline
    import edgekit.sweep as sweep_module
    from edgekit.errors import BuildError

    monkeypatch.setattr(sweep_module, "_variants", _fp32_and_int8)
    out = tmp_path / "sweep"
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    sweep_module.sweep(recipe, "x86-64-cpu", out, iterations=2)
    assert (out / "int8" / "manifest.json").is_file()
    real_build = pipeline.build

    def build(recipe_path, target_name, precision=None, **kwargs):
        if precision.value == "int8":
            raise BuildError("int8 refused this time")
        return real_build(recipe_path, target_name, precision=precision, **kwargs)

    monkeypatch.setattr(pipeline, "build", build)
    result = sweep_module.sweep(recipe, "x86-64-cpu", out, force=True, iterations=2)
    rows = {row["variant"]: row for row in result.rows}
    assert rows["int8"]["status"] == "failed" and rows["int8"]["reason"] == "int8 refused this time"
    assert not (out / "int8").exists()  # before: the previous run's int8 bundle stayed, looking like this run's
    assert (out / "fp32" / "manifest.json").is_file()


def test_sweep_default_out_uses_the_target_name_of_a_target_file(tiny_recipe, tmp_path, monkeypatch, capsys):
    import edgekit.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "_variants", lambda recipe, target, backend: _fp32_and_int8(recipe, target, backend)[:1])
    target_file = tmp_path / "tg" / "x86-64-cpu.yaml"
    target_file.parent.mkdir()
    target_file.write_text((REPO / "targets" / "x86-64-cpu.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(tiny_recipe()), "--target", str(target_file), "--iterations", "2"]) == 0
    assert (tmp_path / "bundles" / "sweep-tiny-x86-64-cpu" / "sweep.json").is_file()  # before: bundles/sweep-tiny-/…/tg/x86-64-cpu.yaml


def test_a_variant_with_fp32s_graph_has_no_speed_up_and_its_accuracy_note(tiny_recipe, tmp_path, monkeypatch):
    import edgekit.pipeline as pipeline
    import edgekit.sweep as sweep_module
    from edgekit.precision import Precision

    monkeypatch.setattr(sweep_module, "_variants",
                        lambda recipe, target, backend: [("fp32", Precision.FP32, False, True), ("fp16", Precision.FP16, False, True)])
    real_build = pipeline.build
    monkeypatch.setattr(pipeline, "build", lambda path, target, precision=None, **kw: real_build(path, target, precision=Precision.FP32, **kw))
    text = TINY_RECIPE.format(factory="tiny_net").replace(  # no data.evaluation: the manifest's accuracy has a note
        '  evaluation: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}\n', "").replace(
        '  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}',
        '  samples: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}')
    result = sweep_module.sweep(tiny_recipe(text=text), "x86-64-cpu", tmp_path / "sweep", iterations=2)
    rows = {row["variant"]: row for row in result.rows}
    assert rows["fp32"]["latency_vs_fp32"] == 1.0 and rows["fp16"]["p50_ms"] > 0
    assert rows["fp16"]["latency_vs_fp32"] is None
    assert "fp16 bundle holds the same model.onnx as fp32" in rows["fp16"]["reason"]
    assert rows["fp16"]["reason"].startswith("measured on data.samples (the recipe has no data.evaluation)")
