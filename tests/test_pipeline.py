"""The build pipeline end to end on a tiny model, and every bad input it must name clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.errors import AccuracyBudgetError, BuildError, ExportError, ParityError, RecipeError, SourceError, TargetError
from edgekit.pipeline import build
from edgekit_runtime.bundle import open_bundle
from tests.conftest import REPO, TINY_RECIPE

MANIFEST_KEYS = {
    "schema_version", "name", "created", "recipe", "target", "backend", "precision", "files", "io",
    "toolchain", "export", "accuracy", "benchmark", "golden", "model", "stages",
}


def test_build_writes_a_complete_verified_bundle(tiny_recipe, tmp_path):
    result = build(tiny_recipe(), "x86-64-cpu", out=tmp_path / "bundle")
    manifest = result.manifest
    assert MANIFEST_KEYS <= set(manifest)
    assert manifest["export"]["exporter"] == "dynamo"
    parity = manifest["export"]["parity"]
    assert parity["passed"] is True and parity["max_abs_diff"] < 1e-5
    assert {s["point"] for s in parity["shapes"]} == {"min", "opt", "max"}
    assert manifest["accuracy"]["metric"] == "top1" and manifest["accuracy"]["passed"]
    bench = manifest["benchmark"]
    assert bench["iterations"] == 5 and 0 < bench["p50_ms"] <= bench["p99_ms"] and bench["throughput_per_s"] > 0
    assert manifest["io"]["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 4, 4]}]
    assert manifest["io"]["outputs"][0]["shape"] == ["batch", 3]
    assert manifest["toolchain"]["torch"].startswith("2.") and manifest["toolchain"]["onnxruntime"]
    assert set(manifest["files"]) >= {"model.onnx", "report.html", "golden/inputs_000.npz", "golden/outputs_000.npz"}
    # The runtime verifies it; the model runs and matches the golden outputs.
    bundle = open_bundle(result.bundle_dir, verify=True)
    session = ort.InferenceSession(str(bundle.root / "model.onnx"), providers=["CPUExecutionProvider"])
    with np.load(bundle.root / "golden/inputs_000.npz") as inputs, np.load(bundle.root / "golden/outputs_000.npz") as outputs:
        got = session.run(None, {"image": inputs["image"]})[0]
        np.testing.assert_allclose(got, outputs["logits"], atol=1e-5)
    # No staging directories are left next to the bundle.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_fp16_bundle_keeps_float32_io(tiny_recipe, tmp_path):
    result = build(tiny_recipe(), "x86-64-cpu", precision="fp16", out=tmp_path / "b16")
    import onnx

    model = onnx.load(str(result.bundle_dir / "model.onnx"))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    assert result.manifest["precision"] == "fp16"
    assert result.manifest["golden"]["atol"] >= 1e-4


def test_existing_bundle_is_refused_without_force(tiny_recipe, tmp_path):
    out = tmp_path / "bundle"
    build(tiny_recipe(), "x86-64-cpu", out=out)
    before = (out / "manifest.json").read_text()
    with pytest.raises(BuildError, match=r"already holds a bundle.*\n.*--force"):
        build(tiny_recipe(), "x86-64-cpu", out=out)
    assert (out / "manifest.json").read_text() == before
    build(tiny_recipe(), "x86-64-cpu", out=out, force=True)
    assert json.loads((out / "manifest.json").read_text())["created"]


def test_non_bundle_directory_is_never_replaced(tiny_recipe, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(BuildError, match=r"not an edgekit bundle"):
        build(tiny_recipe(), "x86-64-cpu", out=out, force=True)
    assert (out / "notes.txt").read_text() == "keep me"


def test_unknown_target_names_close_matches(tiny_recipe, tmp_path):
    with pytest.raises(TargetError, match=r"unknown target 'x86-cpu'.*did you mean.*'x86-64-cpu'"):
        build(tiny_recipe(), "x86-cpu", out=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_factory_that_fails_to_import(tiny_recipe, tmp_path):
    text = TINY_RECIPE.format(factory="tiny_net").replace("tests.fixtures.tiny_models:tiny_net", "tests.fixtures.no_such_module:make")
    with pytest.raises(SourceError, match=r"model\.factory: cannot import module 'tests\.fixtures\.no_such_module'"):
        build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "b")


def test_factory_missing_function_lists_callables(tiny_recipe, tmp_path):
    with pytest.raises(SourceError, match=r"has no attribute 'tiny_nett'(?s:.*)hint: callables there: .*tiny_net"):
        build(tiny_recipe(factory="tiny_nett"), "x86-64-cpu", out=tmp_path / "b")


def test_factory_returning_no_module(tiny_recipe, tmp_path):
    with pytest.raises(SourceError, match=r"returned dict, not a torch\.nn\.Module"):
        build(tiny_recipe(factory="not_a_module"), "x86-64-cpu", out=tmp_path / "b")


def test_factory_that_raises(tiny_recipe, tmp_path):
    with pytest.raises(SourceError, match=r"'tests\.fixtures\.tiny_models:exploding_factory' raised RuntimeError: checkpoint file is corrupt"):
        build(tiny_recipe(factory="exploding_factory"), "x86-64-cpu", out=tmp_path / "b")


def test_unsupported_op_names_the_op(tiny_recipe, tmp_path):
    with pytest.raises(ExportError) as info:
        build(tiny_recipe(factory="histogram_net"), "x86-64-cpu", out=tmp_path / "b")
    message = str(info.value)
    assert "unsupported op aten" in message and "histc" in message
    assert "opset 18" in message and "custom op" in message
    assert not (tmp_path / "b").exists()


def test_parity_failure_names_output_and_numbers(tiny_recipe, tmp_path):
    with pytest.raises(ParityError) as info:
        build(tiny_recipe(factory="export_drift_net"), "x86-64-cpu", out=tmp_path / "b")
    message = str(info.value)
    assert "output 'logits'" in message and "max abs diff 0.5" in message
    assert "atol 0.0001" in message and "PyTorch" in message
    assert not (tmp_path / "b").exists()


def test_accuracy_budget_failure_fails_the_build(tiny_recipe, tmp_path):
    text = TINY_RECIPE.format(factory="tiny_net").replace("budget: {max_drop: 0.0}", "budget: {min_value: 1.01}")
    with pytest.raises(AccuracyBudgetError, match=r"outside the accuracy budget: top1 = 1 \(reference 1.*min_value 1\.01"):
        build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_data_with_wrong_dtype(tiny_recipe, tmp_path):
    text = TINY_RECIPE.format(factory="tiny_net").replace('samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}', 'samples: {callable: "tests.fixtures.tiny_models:wrong_dtype_batches"}')
    with pytest.raises(RecipeError, match=r"data\.samples batch 0: input 'image' has dtype float64, the recipe says float32"):
        build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "b")


def test_corrupt_onnx_input(tiny_recipe, tmp_path):
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"\x08\x07this is not a protobuf model" * 10)
    text = TINY_RECIPE.format(factory="tiny_net").replace("kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net", "kind: onnx\n  path: broken.onnx")
    with pytest.raises(SourceError, match=r"broken\.onnx is not a valid ONNX model(?s:.*)hint: check that the file was copied completely"):
        build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "b")


def test_interrupted_build_leaves_no_partial_bundle(tiny_recipe, tmp_path):
    """SIGINT in the middle of a build (during export) removes the staging directory."""
    recipe = tiny_recipe()
    out = tmp_path / "b"
    # The child restores Python's Ctrl-C handler: a test run started as a background job (`cmd &`, as CI
    # runners and nohup do) passes SIGINT down ignored, while a person's Ctrl-C reaches a foreground build.
    script = textwrap.dedent(f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(REPO)!r})
        import edgekit.export.onnx_export as ex
        original = ex.export_onnx
        def slow_export(*args, **kwargs):
            print("EXPORTING", flush=True)
            time.sleep(60)
        import edgekit.pipeline as pipeline
        pipeline.export_onnx = slow_export
        pipeline.build({str(recipe)!r}, "x86-64-cpu", out={str(out)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    line = ""
    while time.monotonic() < deadline and "EXPORTING" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"build exited early: {proc.stderr.read()}")
    staging = [p for p in tmp_path.iterdir() if p.name.startswith(".b.partial-")]
    assert staging, "the build should be writing into a staging directory"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the build did not stop within 60 s of SIGINT: {proc.communicate()[1][-2000:]}")
    assert proc.returncode != 0
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".b.")] == []


def test_a_killed_build_s_folders_are_removed_by_the_next_build(tiny_recipe, tmp_path, monkeypatch):
    """kill -9 during export leaves the staging folder beside --out and the work folder in TMPDIR (no cleanup
    runs); the next build into the same place removes both (their locks died with the process), and never a
    folder a running build holds."""
    import tempfile as tempfile_module

    from edgekit.bundle.leftovers import hold, release

    recipe, out, tmp = tiny_recipe(), tmp_path / "b", tmp_path / "tmp"
    tmp.mkdir()
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        import edgekit.pipeline as pipeline
        def slow_export(*args, **kwargs):
            print("EXPORTING", flush=True)
            time.sleep(60)
        pipeline.export_onnx = slow_export
        pipeline.build({str(recipe)!r}, "x86-64-cpu", out={str(out)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        assert proc.stdout.readline().strip() == "EXPORTING", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(timeout=60)
    staging = [p for p in tmp_path.iterdir() if p.name.startswith(".b.partial-")]
    work = [p for p in tmp.iterdir() if p.name.startswith("edgekit-build-")]
    assert len(staging) == 1 and len(work) == 1  # what the killed build left
    held = tmp / "edgekit-build-flock-held-by-a-running-build"
    older_version = tmp / "edgekit-build-abcd1234"  # an earlier edgekit's (never locked): not this one's to remove
    held.mkdir()
    older_version.mkdir()
    for folder in (*staging, *work, held, older_version):
        os.utime(folder, (time.time() - 3600, time.time() - 3600))  # older than the grace for a starting build
    fd = hold(held)
    try:
        monkeypatch.setattr(tempfile_module, "tempdir", str(tmp))
        build(recipe, "x86-64-cpu", out=out)
    finally:
        release(fd)
    assert (out / "manifest.json").is_file()
    assert not staging[0].exists() and not work[0].exists()
    assert held.is_dir() and older_version.is_dir()  # a running build's folder stays, and a folder of another kind
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".b.")) == []


def test_jetson_target_gets_a_tensorrt_bundle_built_on_the_device(tiny_recipe, tmp_path):
    result = build(tiny_recipe(), "jetson-orin-nano-8gb", out=tmp_path / "jetson")
    backend = result.manifest["backend"]
    assert backend["name"] == "tensorrt" and backend["selected_because"] == "target preference"
    assert backend["tensorrt"]["engine_built_on"] == "device"  # this host has no Orin GPU
    assert "tensorrt/plan.json" in result.manifest["files"]
    assert result.manifest["target"]["gpu"]["compute_capability"] == "8.7"
    # Evaluated and benchmarked with ONNX Runtime on this host's CPU, which the manifest says.
    assert result.manifest["benchmark"]["providers"] == ["CPUExecutionProvider"]


def test_jetson_target_with_the_onnxruntime_backend_lists_its_providers(tiny_recipe, tmp_path):
    result = build(tiny_recipe(), "jetson-orin-nano-8gb", out=tmp_path / "jetson-ort", backend="onnxruntime")
    backend = result.manifest["backend"]
    assert backend["name"] == "onnxruntime" and backend["selected_because"] == "--backend"
    assert [p["name"] for p in backend["execution_providers"]][:2] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]


def test_recipe_backend_the_target_lacks(tiny_recipe, tmp_path):
    text = TINY_RECIPE.format(factory="tiny_net").replace("build:\n", "build:\n  backend: tensorrt\n")
    with pytest.raises(TargetError, match=r"target 'x86-64-cpu' has no tensorrt backend"):
        build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "b")


def test_precision_applied_on_the_device_is_labelled_and_golden_is_widened(tiny_recipe, tmp_path):
    result = build(tiny_recipe(), "jetson-agx-thor", precision="bf16", out=tmp_path / "thor-bf16")
    manifest = result.manifest
    assert manifest["backend"]["name"] == "tensorrt" and manifest["precision"] == "bf16"
    assert "TensorRT applies bf16 through builder flags on the device" in manifest["accuracy"]["note"]
    assert manifest["golden"]["rtol"] == 0.05 and manifest["golden"]["min_cosine"] == 0.99


def test_accuracy_without_evaluation_data_is_measured_on_the_samples_and_says_so(tiny_recipe, tmp_path, caplog):
    from tests.conftest import TINY_RECIPE

    text = TINY_RECIPE.format(factory="tiny_net").replace(
        '  evaluation: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}\n', "").replace(
        '  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}',
        '  samples: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}')
    assert "  evaluation: {callable" not in text
    result = build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "bundle")  # still builds
    accuracy = result.manifest["accuracy"]
    assert accuracy["details"]["data"] == "samples"
    assert accuracy["note"].startswith("measured on data.samples (the recipe has no data.evaluation)")
    assert "not an accuracy on held-out data" in accuracy["note"]
    assert "accuracy measured on data.samples" in caplog.text and "add data.evaluation" in caplog.text
    with_evaluation = build(tiny_recipe(), "x86-64-cpu", out=tmp_path / "bundle2")
    assert with_evaluation.manifest["accuracy"]["details"]["data"] == "evaluation"
    assert with_evaluation.manifest["accuracy"]["note"] is None
