"""Recipes for any signature: scalar (rank-0) inputs, constant non-tensor arguments, stateful models.

The models are real (a small LSTM voice-activity model, built by a factory and saved as TorchScript),
exported to ONNX, run by ONNX Runtime and checked by the runtime's signature, self-check and agent
feeds. The real Silero VAD from the ``silero-vad`` package is used when it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from edgekit.bench.compare import bench_bundle
from edgekit.data import SEQUENCE_KEY, fit_batch, load_batches, random_batch, run_batches
from edgekit.errors import BuildError, ExportError, RecipeError, SourceError
from edgekit.io_signature import io_section
from edgekit.pipeline import build
from edgekit.recipe import load_recipe
from edgekit_runtime.agent.service import synthetic_feeds
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BundleError, InputSignatureError
from edgekit_runtime.signature import IOSignature, validate_feeds
from tests.sources.stateful_models import tiny_vad, tiny_vad_int_rate, vad_sequences

VAD_RECIPE = """\
name: tiny-vad
model:
  kind: factory
  factory: tests.sources.stateful_models:tiny_vad
inputs:
  - {name: x, dtype: float32, shape: [batch, 64]}
  - {name: state, dtype: float32, shape: [2, batch, 16]}
  - {name: sr, dtype: int64, shape: [], value: 16000}
outputs: [prob, stateN]
dims:
  batch: {min: 1, opt: 2, max: 4}
state:
  - {input: state, output: stateN}
data:
  samples: {callable: "tests.sources.stateful_models:vad_sequences", kwargs: {batch: 2}}
  calibration: {callable: "tests.sources.stateful_models:vad_sequences", kwargs: {batch: 2, seed: 2}}
  evaluation: {callable: "tests.sources.stateful_models:vad_sequences", kwargs: {batch: 2, sequences: 4, seed: 1}}
evaluation:
  metric: binary_decision
  output: prob
  budget: {min_value: 0.9}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


def write(tmp_path: Path, text: str, name: str = "vad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- recipe validation


def test_scalar_input_with_a_value_loads(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE))
    sr = recipe.inputs[2]
    assert sr.shape == () and sr.value == 16000
    assert [(s.input, s.output) for s in recipe.state] == [("state", "stateN")]
    assert recipe.shape_at(sr, "max") == ()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("shape: [], value: 16000}", "shape: [], value: 16000, low: 8000}", r"input 'sr': give either value \(16000.0\) or low/high, not both"),
        ("value: 16000}", "value: 16000.5}", r"input 'sr' is int64: value must be a whole number, got 16000.5"),
        ("{input: state, output: stateN}", "{input: h, output: stateN}", r"state\[0\]\.input 'h' is not one of inputs \['x', 'state', 'sr'\]"),
        ("{input: state, output: stateN}", "{input: state, output: hn}", r"state\[0\]\.output 'hn' is not one of outputs \['prob', 'stateN'\]"),
        ("{input: state, output: stateN}", "{input: state, output: stateN, zeros: [2, 16]}",
         r"state\[0\]\.zeros \[2, 16\] has rank 2; input 'state' has shape \[2, 'batch', 16\]"),
        ("{input: state, output: stateN}", "{input: state, output: stateN, zeros: [3, batch, 16]}", r"vad\.yaml:\d+:\d+: field 'state\[0\]\.zeros\[0\]': axis 0 is 3; input 'state' \[2, 'batch', 16\] fixes it at 2"),
        ("  budget: {min_value: 0.9}", "  budget: {min_value: 0.9}\n  detection: {boxes: {output: prob}, scores: {output: prob}}",
         r"options 'detection' are only used with metric 'detection', not 'binary_decision'"),
        ("metric: binary_decision", "metric: detection", r"metric 'detection' needs options: detection: \{boxes:"),
        ("  factory: tests.sources.stateful_models:tiny_vad", "  factory: tests.sources.stateful_models:tiny_vad\n  constant_args: {sr: 16000}",
         r"model\.constant_args\.sr: 'sr' is also listed under inputs"),
    ],
)
def test_bad_signature_recipes_say_what_and_where(tmp_path, old, new, message):
    assert old in VAD_RECIPE
    with pytest.raises(RecipeError, match=message) as info:
        load_recipe(write(tmp_path, VAD_RECIPE.replace(old, new)))
    assert str(tmp_path / "vad.yaml") in str(info.value)


def test_detection_options_must_name_outputs(tmp_path):
    text = VAD_RECIPE.replace("metric: binary_decision", "metric: detection").replace(
        "  budget: {min_value: 0.9}", "  budget: {min_value: 0.9}\n  detection: {boxes: {output: boxes}, scores: {output: prob}}")
    with pytest.raises(RecipeError, match=r"evaluation\.detection\.boxes\.output 'boxes' is not one of outputs \['prob', 'stateN'\]"):
        load_recipe(write(tmp_path, text))


# ---------------------------------------------------------------- data: scalars and sequences


def test_random_and_fitted_feeds_keep_scalars_rank_0(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE))
    feeds = random_batch(recipe, {"batch": 3}, np.random.default_rng(0))
    assert feeds["sr"].shape == () and feeds["sr"].dtype == np.int64 and int(feeds["sr"]) == 16000
    assert feeds["x"].shape == (3, 64) and feeds["state"].shape == (2, 3, 16)
    fitted = fit_batch(recipe.inputs, {"x": np.zeros((2, 64), np.float32), "state": np.zeros((2, 2, 16), np.float32),
                                "sr": np.array(16000, np.int64)}, {"batch": 4})
    assert fitted["sr"].shape == () and fitted["x"].shape == (4, 64)


def test_sequences_become_chunks_with_initial_state(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE))
    chunks = load_batches(recipe, recipe.data.samples, "samples")
    assert len(chunks) == 3 * 5
    assert [int(c[SEQUENCE_KEY]) for c in chunks[:6]] == [0, 0, 0, 0, 0, 1]
    assert chunks[0]["state"].shape == (2, 2, 16) and not chunks[0]["state"].any()  # zeros, batch from x


def test_stateful_data_must_be_sequences(tmp_path):
    text = VAD_RECIPE.replace('vad_sequences", kwargs: {batch: 2}}', 'flat_chunks"}', 1)
    recipe = load_recipe(write(tmp_path, text))
    with pytest.raises(RecipeError, match=r"data\.samples: sequence 0 is dict: the recipe has a state section, so the data are sequences") as info:
        load_batches(recipe, recipe.data.samples, "samples")
    assert "a list of sequences, each a list of consecutive chunks" in str(info.value)


def test_a_later_chunk_may_not_give_the_state(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE.replace('vad_sequences", kwargs: {batch: 2}}', 'chunks_with_state"}', 1)))
    with pytest.raises(RecipeError, match=r"sequence 0 chunk 1: gives state input 'state', which the previous call's output 'stateN' provides"):
        load_batches(recipe, recipe.data.samples, "samples")


def test_npz_sequences_are_one_folder_each(tmp_path):
    for number, sequence in enumerate(vad_sequences(sequences=2, chunks=3, batch=2)):
        folder = tmp_path / "seq" / f"s{number}"
        folder.mkdir(parents=True)
        for step, chunk in enumerate(sequence):
            np.savez(folder / f"{step:03d}.npz", **chunk)
    text = VAD_RECIPE.replace('{callable: "tests.sources.stateful_models:vad_sequences", kwargs: {batch: 2}}', "{npz_dir: seq}")
    recipe = load_recipe(write(tmp_path, text))
    chunks = load_batches(recipe, recipe.data.samples, "samples")
    assert [int(c[SEQUENCE_KEY]) for c in chunks] == [0, 0, 0, 1, 1, 1]
    (tmp_path / "flat").mkdir()
    np.savez(tmp_path / "flat" / "a.npz", **vad_sequences(1, 1, 2)[0][0])
    recipe = load_recipe(write(tmp_path, text.replace("npz_dir: seq", "npz_dir: flat")))
    with pytest.raises(RecipeError, match=r"no sequence folders with \.npz files in .*flat(?s:.*)one subfolder per sequence"):
        load_batches(recipe, recipe.data.samples, "samples")


def test_run_batches_carries_state_through_each_sequence(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE))
    model = tiny_vad()
    chunks = load_batches(recipe, recipe.data.samples, "samples")

    def run(feeds):
        with torch.inference_mode():
            prob, state = model(*(torch.from_numpy(np.require(feeds[n], requirements="C")) for n in ("x", "state", "sr")))
        return {"prob": prob.numpy(), "stateN": state.numpy()}

    used, outputs = run_batches(recipe, run, chunks)
    np.testing.assert_array_equal(used[1]["state"], outputs[0]["stateN"])  # step 1 gets step 0's state
    assert not used[5]["state"].any()  # a new sequence starts from zeros
    state = torch.zeros(2, 2, 16)
    with torch.inference_mode():
        for chunk, out in zip(chunks[:5], outputs[:5]):
            prob, state = model(torch.from_numpy(chunk["x"]), state, torch.tensor(16000))
            np.testing.assert_allclose(out["prob"], prob.numpy(), rtol=0, atol=0)


def test_state_of_another_shape_is_an_error(tmp_path):
    recipe = load_recipe(write(tmp_path, VAD_RECIPE))
    chunks = load_batches(recipe, recipe.data.samples, "samples")
    with pytest.raises(RecipeError, match=r"state: output 'stateN' is float32\[2, 16\] but feeds input 'state', which is float32\[2, 2, 16\]"):
        run_batches(recipe, lambda feeds: {"prob": feeds["x"][:, :1], "stateN": np.zeros((2, 16), np.float32)}, chunks)


# ---------------------------------------------------------------- io section and the runtime's checks


def _graph_with_rank_1_rate(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, sr], [y])
    onnx.save(helper.make_model(graph), str(path))


def test_io_section_rejects_a_scalar_the_graph_has_as_rank_1(tmp_path):
    _graph_with_rank_1_rate(tmp_path / "m.onnx")
    text = """\
        name: rate
        model: {kind: onnx, path: m.onnx}
        inputs:
          - {name: x, dtype: float32, shape: [batch, 64]}
          - {name: sr, dtype: int64, shape: [], value: 16000}
        outputs: [y]
        dims: {batch: {min: 1, opt: 1, max: 2}}
        data: {samples: {callable: "tests.sources.stateful_models:vad_chunks_without_rate"}}
        """
    recipe = load_recipe(write(tmp_path, text, "rate.yaml"))
    with pytest.raises(ExportError, match=r"input 'sr' has shape \[\] \(rank 0\) in the recipe but \[1\] \(rank 1\) in the ONNX graph(?s:.*)a scalar is shape: \[\]"):
        io_section(recipe, tmp_path / "m.onnx")


def test_runtime_signature_checks_scalars_and_keeps_values():
    io = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 64]}, {"name": "sr", "dtype": "int64", "shape": [], "value": 16000}],
          "outputs": [{"name": "prob", "dtype": "float32", "shape": ["batch", 1]}], "dims": {"batch": {"min": 1, "opt": 2, "max": 4}}}
    signature = IOSignature.from_manifest(io)
    assert signature.input("sr").value == 16000 and signature.to_dict()["inputs"][1]["value"] == 16000
    good = {"x": np.zeros((2, 64), np.float32), "sr": np.array(16000, np.int64)}
    assert validate_feeds(signature, good) == {"batch": 2}
    with pytest.raises(InputSignatureError, match=r"input 'sr': expected int64\[\], got int64\[1\] \(rank 1, expected rank 0\)"):
        validate_feeds(signature, {**good, "sr": np.array([16000], np.int64)})
    feeds = synthetic_feeds(signature, {})
    assert feeds["sr"].shape == () and int(feeds["sr"]) == 16000 and feeds["x"].shape == (2, 64)
    validate_feeds(signature, feeds)
    io["inputs"][1]["value"] = "16k"
    with pytest.raises(BundleError, match=r"io\.inputs\[1\] \('sr'\)\.value: expected a number or a boolean, got '16k'"):
        IOSignature.from_manifest(io)


# ---------------------------------------------------------------- builds


@pytest.fixture(scope="module")
def vad_bundle(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("vad")
    result = build(write(tmp_path, VAD_RECIPE), "x86-64-cpu", out=tmp_path / "bundle")
    return result


def test_stateful_scalar_model_builds_and_self_checks(vad_bundle):
    manifest = vad_bundle.manifest
    io = manifest["io"]
    assert io["inputs"][2] == {"name": "sr", "dtype": "int64", "shape": [], "value": 16000}
    assert io["state"] == [{"input": "state", "output": "stateN"}]
    assert manifest["export"]["parity"]["passed"] is True
    golden = manifest["golden"]
    assert golden["state"] == [{"input": "state", "output": "stateN"}]
    assert [(b["sequence"], b["step"]) for b in golden["batches"]] == [(s, i) for s in range(2) for i in range(5)]
    accuracy = manifest["accuracy"]
    assert accuracy["metric"] == "binary_decision" and accuracy["samples"] == 4 * 5 * 2
    assert accuracy["details"]["decisions"] == 40 and accuracy["value"] == 1.0
    bundle = open_bundle(vad_bundle.bundle_dir)
    result = self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io))
    assert result.passed and result.batches == 10


def _copy_bundle(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_self_check_replays_golden_sequences_with_the_devices_state(vad_bundle, tmp_path):
    root = _copy_bundle(vad_bundle.bundle_dir, tmp_path / "copy")
    # Recorded state inputs of later steps are replaced by what this runner computed: garbage there changes nothing.
    with np.load(root / "golden" / "inputs_003.npz") as npz:
        inputs = {k: npz[k] for k in npz.files}
    inputs["state"] = np.full_like(inputs["state"], 5.0)
    np.savez(root / "golden" / "inputs_003.npz", **inputs)
    bundle = open_bundle(root, verify=False)
    assert self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io)).passed
    # Without the state pairs the runtime would replay the recorded (now garbage) state and fail.
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["golden"]["state"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    bundle = open_bundle(root, verify=False)
    with pytest.raises(BundleError, match=r"self-check of bundle .* failed .*golden batch 3"):
        self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io))


def test_golden_steps_out_of_order_are_rejected(vad_bundle, tmp_path):
    root = _copy_bundle(vad_bundle.bundle_dir, tmp_path / "copy")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["golden"]["batches"][2]["step"] = 4
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"golden\.batches\[2\] is step 4 of sequence 0; expected step 2"):
        open_bundle(root, verify=False)


def test_bench_times_a_bundle_with_a_scalar_input(vad_bundle):
    report = bench_bundle(vad_bundle.bundle_dir, iterations=3, warmup=1, rounds=1)
    assert report.batch == 2 and report.dims == {"batch": 2}
    assert report.variants["bundle"]["p50_ms"] > 0


def test_stateful_int8_calibrates_on_carried_state(tmp_path):
    result = build(write(tmp_path, VAD_RECIPE), "x86-64-cpu", precision="int8", out=tmp_path / "int8")
    calibration = result.manifest["quantization"]["calibration"]
    assert calibration["batches"] == 15  # 3 sequences of 5 chunks, each with the state the FP32 model carried
    assert result.manifest["accuracy"]["passed"] is True


def test_auto_precision_runs_stateful_sequences(tmp_path):
    """auto judges each candidate over the recipe's sequences, the candidate carrying its own state."""
    result = build(write(tmp_path, VAD_RECIPE), "x86-64-cpu", precision="auto", out=tmp_path / "auto")
    manifest = result.manifest
    assert manifest["precision_decision"]["requested"] == "auto"
    evaluated = [c for c in manifest["quantization"]["auto"]["candidates"] if c["value"] is not None]
    assert evaluated and all(0.0 <= c["value"] <= 1.0 for c in evaluated)
    assert manifest["accuracy"]["passed"] is True and manifest["accuracy"]["samples"] == 4 * 5 * 2
    assert manifest["golden"]["state"] == [{"input": "state", "output": "stateN"}]
    assert manifest["golden"]["outputs"]["stateN"]["batch_axis"] == 1
    bundle = open_bundle(result.bundle_dir)
    assert self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io)).passed


# ---------------------------------------------------------------- constant non-tensor arguments


TORCHSCRIPT_LINES = "  kind: torchscript\n  path: vad.pt\n  constant_args: {sr: 16000}"


def _torchscript_recipe(tmp_path: Path, model_lines: str = TORCHSCRIPT_LINES) -> Path:
    torch.jit.save(torch.jit.script(tiny_vad_int_rate()), str(tmp_path / "vad.pt"))
    text = (VAD_RECIPE.replace("  kind: factory\n  factory: tests.sources.stateful_models:tiny_vad", model_lines)
            .replace("  - {name: sr, dtype: int64, shape: [], value: 16000}\n", ""))
    return write(tmp_path, text)


def test_torchscript_with_an_int_argument_exports_with_constant_args(tmp_path):
    result = build(_torchscript_recipe(tmp_path), "x86-64-cpu", out=tmp_path / "bundle")
    manifest = result.manifest
    assert manifest["io"]["constant_args"] == {"sr": 16000}
    assert manifest["model"]["constant_args"] == {"sr": 16000}
    # Outputs follow the inputs' dynamic batch (the TorchScript exporter alone fixes them at the example's 2).
    assert {o["name"]: o["shape"] for o in manifest["io"]["outputs"]} == {"prob": ["batch", 1], "stateN": [2, "batch", 16]}
    assert [i["name"] for i in manifest["io"]["inputs"]] == ["x", "state"]
    assert manifest["export"]["parity"]["passed"] is True
    # The exported graph computes what the tensor-rate model computes at 16 kHz.
    chunk = vad_sequences(1, 1, 2)[0][0]
    state = np.zeros((2, 2, 16), np.float32)
    bundle = open_bundle(result.bundle_dir)
    with OnnxRuntimeRunner(bundle.model_path, bundle.io).load() as runner:
        got = runner.infer({"x": chunk["x"], "state": state})
    with torch.inference_mode():
        prob, _ = tiny_vad()(torch.from_numpy(chunk["x"]), torch.from_numpy(state), torch.tensor(16000))
    np.testing.assert_allclose(got["prob"], prob.numpy(), atol=1e-5)


def test_unknown_constant_arg_names_the_parameters(tmp_path):
    with pytest.raises(SourceError, match=r"model\.constant_args\.rate: forward\(\) has no parameter 'rate' \(its parameters: x, state, sr\)"):
        build(_torchscript_recipe(tmp_path, TORCHSCRIPT_LINES.replace("sr: 16000", "rate: 16000")), "x86-64-cpu", out=tmp_path / "b")


def test_factory_constant_args_bind_by_name(tmp_path):
    lines = "  kind: factory\n  factory: tests.sources.stateful_models:tiny_vad_int_rate\n  constant_args: {sr: 8000}"
    text = (VAD_RECIPE.replace("  kind: factory\n  factory: tests.sources.stateful_models:tiny_vad", lines)
            .replace("  - {name: sr, dtype: int64, shape: [], value: 16000}\n", "").replace("metric: binary_decision", "metric: cosine")
            .replace("min_value: 0.9", "min_value: 0.999"))
    result = build(write(tmp_path, text), "x86-64-cpu", out=tmp_path / "bundle")
    assert result.manifest["io"]["constant_args"] == {"sr": 8000}
    assert result.manifest["accuracy"]["value"] >= 0.999


# ---------------------------------------------------------------- the real Silero VAD (skips when the package is absent)


def _silero_onnx() -> Path | None:
    spec = importlib.util.find_spec("silero_vad")  # finds the files without importing the package (it imports torchaudio)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"
    return path if path.is_file() else None


SILERO_RECIPE = """\
name: silero-vad
model: {{kind: onnx, path: "{path}"}}
inputs:
  - {{name: input, dtype: float32, shape: [batch, 512]}}
  - {{name: state, dtype: float32, shape: [2, batch, 128]}}
  - {{name: sr, dtype: int64, shape: [], value: 16000}}
outputs: [output, stateN]
dims:
  batch: {{min: 1, opt: 1, max: 4}}
state:
  - {{input: state, output: stateN}}
data:
  samples: {{callable: "tests.sources.stateful_models:audio_sequences"}}
  evaluation: {{callable: "tests.sources.stateful_models:audio_sequences", kwargs: {{sequences: 3, seed: 1}}}}
evaluation:
  metric: binary_decision
  output: output
  budget: {{min_value: 0.99}}
build:
  benchmark: {{warmup: 1, iterations: 3}}
"""


def test_real_silero_vad_builds_with_scalar_rate_and_state(tmp_path):
    path = _silero_onnx()
    if path is None:
        pytest.skip("the silero-vad package is not installed (pip install --no-deps silero-vad puts its ONNX files in the venv)")
    result = build(write(tmp_path, SILERO_RECIPE.format(path=path), "silero.yaml"), "x86-64-cpu", out=tmp_path / "bundle")
    manifest = result.manifest
    assert manifest["io"]["inputs"][2] == {"name": "sr", "dtype": "int64", "shape": [], "value": 16000}
    assert manifest["golden"]["state"] == [{"input": "state", "output": "stateN"}]
    bundle = open_bundle(result.bundle_dir)
    assert self_check(bundle, OnnxRuntimeRunner(bundle.model_path, bundle.io)).batches == 12
    # evaluation ran the sequences call by call: the same numbers as a hand-written loop with the state carried
    import onnxruntime as ort

    from tests.sources.stateful_models import audio_sequences

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    recipe = load_recipe(tmp_path / "silero.yaml")
    chunks = load_batches(recipe, recipe.data.evaluation, "evaluation")
    with OnnxRuntimeRunner(bundle.model_path, bundle.io).load() as runner:
        outputs = run_batches(recipe, runner.infer, chunks)[1]
    state = np.zeros((2, 1, 128), np.float32)
    for chunk, out in zip(audio_sequences(sequences=3, seed=1)[0], outputs):
        prob, state = session.run(None, {"input": chunk["input"], "state": state, "sr": chunk["sr"]})
        np.testing.assert_allclose(out["output"], prob, atol=1e-5)


def test_a_pruned_stateful_int8_build_calibrates_on_the_pruned_models_state(tmp_path, monkeypatch):
    """The quantized graph is the pruned model's: the state it sees in each sequence is the pruned model's own, not the
    unpruned accuracy reference's (which carried a different state through the calibration sequences)."""
    import edgekit.pipeline as pipeline

    runs: list[object] = []
    real = pipeline.run_batches

    def recording(recipe, run, batches):
        runs.append(run)
        return real(recipe, run, batches)

    monkeypatch.setattr(pipeline, "run_batches", recording)
    text = VAD_RECIPE.replace("build:\n", "build:\n  prune: {method: magnitude, sparsity: 0.5}\n", 1)
    result = build(write(tmp_path, text), "x86-64-cpu", precision="int8", out=tmp_path / "int8")
    assert result.manifest["prune"]["method"] == "magnitude"
    calibrating = runs[0]  # stage_quantize's run over the calibration sequences comes first
    assert getattr(calibrating, "module", None) is not None
    zeroed = sum(int((p == 0).sum()) for p in calibrating.module.parameters())
    assert zeroed > 0, "calibration carried state through the unpruned model"
