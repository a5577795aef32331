"""The golden check's batch axis: a recurrent state ``[2, batch, hidden]`` is compared sample by sample
along axis 1 (its rows along axis 0 are h and c, not samples), the axis is recorded per output for the
runtime, and bundles without the key read as axis 0. Also: the TorchScript export marks the outputs' batch
dim dynamic (state outputs included), so ONNX Runtime runs another batch size with the shapes it declares."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgekit.bundle.golden import derive_tolerances, output_batch_axes
from edgekit.errors import BuildError
from edgekit.export.onnx_export import export_onnx, legacy_output_axes
from edgekit.recipe import ParitySpec, load_recipe
from edgekit_runtime.errors import BundleError
from edgekit_runtime.golden import compare_output, parse_tolerances

HIDDEN = 8


def _state(batch: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(2, batch, HIDDEN)).astype(np.float32)


def test_a_sample_whose_state_points_away_fails_along_its_batch_axis() -> None:
    reference = _state()
    built = reference.copy()
    built[:, 2, :] *= -1  # sample 2's h and c reversed; the others exact
    along_samples = compare_output("stateN", reference, built, atol=10.0, rtol=0.0, min_cosine=0.9, batch_axis=1)
    assert along_samples.cosine_min == pytest.approx(-1.0)
    assert not along_samples.passed
    assert "samples along axis 1" in along_samples.describe(atol=10.0, rtol=0.0, min_cosine=0.9, batch_axis=1)
    # Rows along axis 0 (h, then c, over all samples) hide it: 3 of 4 samples agree.
    assert compare_output("stateN", reference, built, atol=10.0, rtol=0.0, min_cosine=0.0).cosine_min > 0.2


def test_a_batch_axis_the_output_lacks_is_a_shape_error() -> None:
    check = compare_output("prob", np.zeros((4, 1)), np.zeros((4, 1)), atol=1.0, rtol=0.0, min_cosine=0.0, batch_axis=3)
    assert not check.passed and "has no batch axis 3" in check.shape_error


def test_bundles_without_batch_axis_read_axis_0_and_bad_values_are_named() -> None:
    section = {"atol": 0.1, "rtol": 0.0, "min_cosine": 0.9, "outputs": {"prob": {"atol": 0.1, "rtol": 0.0, "min_cosine": 0.9}}}
    assert parse_tolerances(section, where="m.json").for_output("prob").batch_axis == 0
    section["outputs"]["prob"]["batch_axis"] = 1
    assert parse_tolerances(section, where="m.json").for_output("prob").batch_axis == 1
    for bad in ("1", -1, True):
        section["outputs"]["prob"]["batch_axis"] = bad
        with pytest.raises(BundleError, match=r"golden\.outputs\['prob'\]\.batch_axis must be an int >= 0 \(the axis of the batch's samples\)"):
            parse_tolerances(section, where="m.json")


def test_derived_tolerances_record_the_axis_and_measure_per_sample() -> None:
    reference = [_state(seed=1), _state(seed=2)]
    built = [r + np.random.default_rng(3).normal(scale=0.01, size=r.shape).astype(np.float32) for r in reference]
    tolerances, measured = derive_tolerances([{"stateN": r} for r in reference], [{"stateN": b} for b in built], ParitySpec(),
                                             batch_axes={"stateN": 1})
    assert tolerances.outputs["stateN"].batch_axis == 1 and measured["stateN"]["cosine_min"] > 0.99
    section = {"batches": [], "atol": 1.0, "rtol": 0.0, "min_cosine": 0.0, "outputs": {"stateN": tolerances.outputs["stateN"].to_dict()}}
    assert parse_tolerances(section, where="m.json").for_output("stateN") == tolerances.outputs["stateN"]
    flipped = [b.copy() for b in built]
    flipped[0][:, 1, :] *= -1
    with pytest.raises(BuildError, match=r"golden output 'stateN': the built model's rows \(samples along axis 1\) point away from the reference \(cosine -1\.000, golden batch 0\)"):
        derive_tolerances([{"stateN": r} for r in reference], [{"stateN": f} for f in flipped], ParitySpec(), batch_axes={"stateN": 1})
    with pytest.raises(BuildError) as raised:
        derive_tolerances([{"stateN": r} for r in reference], [{"stateN": f} for f in flipped], ParitySpec(), batch_axes={"stateN": 1},
                          state_outputs=["stateN"])
    assert "'stateN' is recurrent state fed to the next call" in raised.value.hint
    assert "build.quantization.exclude_nodes" in raised.value.hint


class _TinyRecurrent(nn.Module):
    """x [batch, 16] with an LSTM-cell state [2, batch, 8] (started inside a branch when all zeros) and a pinned non-tensor rate; a per-window
    energy [batch, frames] whose frame count follows the input length (another dynamic size)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell = nn.LSTMCell(16, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor, rate: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if bool((state == 0).all()):  # a branch (ONNX If), as Silero's decoder has: the exporter fixes its outputs' shapes
            h, c = self.cell(x * (rate / 16000.0))
        else:
            h, c = self.cell(x * (rate / 16000.0), (state[0], state[1]))
        energy = (x * x).unfold(1, 4, 4).mean(-1)  # [batch, 16 / 4]
        return torch.sigmoid(self.head(h)), torch.stack([h, c]), energy


RECIPE = """\
name: tiny-recurrent
model: {{kind: torchscript, path: {path}, constant_args: {{rate: 16000}}}}
inputs:
  - {{name: x, dtype: float32, shape: [batch, 16]}}
  - {{name: state, dtype: float32, shape: [2, batch, 8]}}
outputs: [prob, stateN, energy]
dims:
  batch: {{min: 1, opt: 3, max: 4}}
state:
  - {{input: state, output: stateN}}
export: {{exporter: legacy}}
data:
  samples: {{callable: "tests.sources.stateful_models:vad_sequences"}}
"""


def test_torchscript_export_marks_every_outputs_batch_dim_dynamic(tmp_path, capfd) -> None:
    from edgekit.sources import load_source

    torch.jit.save(torch.jit.script(_TinyRecurrent().eval()), str(tmp_path / "m.pt"))
    (tmp_path / "r.yaml").write_text(textwrap.dedent(RECIPE.format(path=tmp_path / "m.pt")))
    recipe = load_recipe(tmp_path / "r.yaml")
    module = load_source(recipe, tmp_path).module
    example = {"x": np.ones((3, 16), np.float32), "state": np.zeros((2, 3, HIDDEN), np.float32)}
    args = tuple(torch.from_numpy(example[name]) for name in ("x", "state"))
    assert legacy_output_axes(module, args, recipe) == {"prob": {0: "batch"}, "stateN": {1: "batch"}, "energy": {0: "batch"}}
    export_onnx(module, recipe, example, 17, tmp_path / "m.onnx")
    shapes = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in onnx.load(str(tmp_path / "m.onnx")).graph.output}
    assert shapes == {"prob": ["batch", 1], "stateN": [2, "batch", HIDDEN], "energy": ["batch", 4]}
    io = {"outputs": [{"name": name, "shape": shape} for name, shape in shapes.items()]}
    assert output_batch_axes(recipe, io) == {"prob": 0, "stateN": 1, "energy": 0}
    # Batch 1 through a model exported at batch 3: the declared output shapes hold (no "Expected shape" warning).
    options = ort.SessionOptions()
    options.log_severity_level = 1
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    prob, state, energy = session.run(None, {"x": example["x"][:1], "state": example["state"][:, :1]})
    assert prob.shape == (1, 1) and state.shape == (2, 1, HIDDEN) and energy.shape == (1, 4)
    assert "Expected shape" not in capfd.readouterr().err
    with torch.no_grad():
        expected = module(torch.from_numpy(example["x"][:1]), torch.from_numpy(example["state"][:, :1]))
    np.testing.assert_allclose(state, expected[1].numpy(), atol=1e-5)
