"""Parity on the cases the plain numbers miss: outputs with the same inf/NaN in both models, and a PyTorch model
that fails on the random inputs (token ids out of an embedding's range). Real tiny torch modules, exported with
torch.onnx and run by ONNX Runtime, against recipes written as YAML files."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edgekit.errors import ParityError
from edgekit.export.parity import OutputComparison, ParityReport, check_parity, compare_output, parity_failure
from edgekit.recipe import Recipe, load_recipe
from edgekit.torch_reference import TorchReference


class MaskedNet(torch.nn.Module):
    """Linear [batch, 4] -> [batch, 3] with the last column masked to -inf (attention-style masking)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).masked_fill(torch.arange(3) == 2, float("-inf"))


class PooledEmbedding(torch.nn.Module):
    """An embedding of 50 tokens, summed over the sequence: ids of 50 and above are out of its range."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids).sum(1)


def masked_net() -> torch.nn.Module:
    return MaskedNet().eval()


def pooled_embedding() -> torch.nn.Module:
    return PooledEmbedding().eval()


def masked_samples() -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(0).random((2, 4)).astype(np.float32)}]


def token_samples() -> list[dict[str, np.ndarray]]:
    return [{"ids": np.random.default_rng(0).integers(0, 50, (2, 5)).astype(np.int64)}]


MASKED_RECIPE = """\
name: masked
model: {kind: factory, factory: "tests.export.test_parity_cases:masked_net"}
inputs:
  - {name: x, dtype: float32, shape: [batch, 4]}
outputs: [y]
dims:
  batch: {min: 1, opt: 2, max: 8}
data:
  samples: {callable: "tests.export.test_parity_cases:masked_samples"}
"""

TOKENS_RECIPE = """\
name: tokens
model: {kind: factory, factory: "tests.export.test_parity_cases:pooled_embedding"}
inputs:
  - {name: ids, dtype: int64, shape: [batch, seq]}
outputs: [pooled]
dims:
  batch: {min: 1, opt: 2, max: 4}
  seq: {min: 1, opt: 5, max: 8}
data:
  samples: {callable: "tests.export.test_parity_cases:token_samples"}
"""


def _recipe(tmp_path: Path, text: str) -> Recipe:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return load_recipe(path)


def _onnx_runner(module: torch.nn.Module, recipe: Recipe, samples: dict[str, np.ndarray], path: Path):
    names = [spec.name for spec in recipe.inputs]
    axes = {spec.name: {axis: dim for axis, dim in enumerate(spec.shape) if isinstance(dim, str)} for spec in recipe.inputs}
    torch.onnx.export(module, tuple(torch.from_numpy(samples[name]) for name in names), str(path), input_names=names,
                      output_names=list(recipe.outputs), dynamic_axes=axes, opset_version=17, dynamo=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feeds: dict(zip(recipe.outputs, session.run(None, feeds)))


def test_the_same_inf_at_the_same_places_in_both_models_passes(tmp_path):
    """The masked column is -inf in PyTorch and ONNX alike: parity compares the finite elements and passes
    (it crashed with 'max() arg is an empty sequence': a NaN cosine failed 'passed' but not 'failing')."""
    recipe = _recipe(tmp_path, MASKED_RECIPE)
    module, samples = masked_net(), masked_samples()
    report = check_parity(recipe, TorchReference(module, recipe), _onnx_runner(module, recipe, samples[0], tmp_path / "m.onnx"), samples)
    assert report.passed and report.failing == []
    assert len(report.comparisons) == 6  # min, opt, max x sample, random
    assert all(math.isfinite(c.cosine_min) and c.cosine_min > 0.9999 for c in report.comparisons)
    assert report.max_abs_diff < 1e-5


def test_an_inf_against_a_nan_is_a_parity_error_naming_the_place():
    expected = np.array([[1.0, 2.0, -np.inf]], dtype=np.float32)
    got = np.array([[1.0, 2.0, np.nan]], dtype=np.float32)
    with pytest.raises(ParityError) as info:
        compare_output("y", "min", {"batch": 1}, "sample", expected, got, 1e-4, 1e-3)
    assert str(info.value).splitlines()[0] == "output 'y' at min shape {'batch': 1}: ONNX gives nan at index [0, 2] where PyTorch gives -inf"
    with pytest.raises(ParityError, match=r"ONNX gives inf at index \[0, 2\] where PyTorch gives -inf"):
        compare_output("y", "min", {"batch": 1}, "sample", expected, np.abs(expected), 1e-4, 1e-3)


def test_a_nan_cosine_fails_both_passed_and_the_failure_message():
    nan = OutputComparison("y", "opt", {"batch": 2}, "random", 0.0, float("nan"), (0, 1), 1.0, 1.0, True)
    fine = OutputComparison("z", "opt", {"batch": 2}, "random", 0.0, 1.0, (0, 0), 1.0, 1.0, True)
    report = ParityReport(1e-4, 1e-3, 0.9999, [fine, nan])
    assert not report.passed and report.failing == [nan]
    message = str(parity_failure(Recipe.model_construct(path=Path("r.yaml")), report)).splitlines()[0]
    assert message.startswith("r.yaml: the ONNX model does not match PyTorch: output 'y' at the opt shape {'batch': 2} (random inputs)")
    assert message.endswith("cosine min nan (need >= 0.9999)")


def test_token_ids_beyond_the_embedding_are_a_parity_error_naming_the_case_shapes_and_ranges(tmp_path):
    recipe = _recipe(tmp_path, TOKENS_RECIPE)
    module, samples = pooled_embedding(), token_samples()
    candidate = _onnx_runner(module, recipe, samples[0], tmp_path / "t.onnx")
    with pytest.raises(ParityError) as info:
        check_parity(recipe, TorchReference(module, recipe), candidate, samples)
    assert str(info.value).splitlines() == [
        f"{recipe.path}: parity: the PyTorch model failed on the random inputs at the min shape (ids int64[1, 1]): "
        "IndexError: index out of range in self; integer inputs span ids 85..85",
        "  hint: random inputs are drawn from inputs[].low/high (integers from 0 to 100 unless set): set inputs[].low/high "
        "in the recipe to the values the model takes (e.g. high: the vocabulary size for token ids)",
    ]
    bounded = _recipe(tmp_path, TOKENS_RECIPE.replace("shape: [batch, seq]}", "shape: [batch, seq], high: 50}"))
    assert check_parity(bounded, TorchReference(module, bounded), candidate, samples).passed


def test_a_rank_0_float_output_is_compared():
    """Before: row_cosines took norm(axis=1) of a 1-D array and parity crashed with an AxisError."""
    comparison = compare_output("m", "opt", {"batch": 2}, "sample", np.array(0.5, np.float32), np.array(0.5000001, np.float32), 1e-4, 1e-3)
    assert comparison.within_tolerance and comparison.cosine_min == pytest.approx(1.0) and comparison.worst_index == ()


def test_rows_near_zero_within_atol_do_not_fail_the_cosine():
    """A score of 3e-9 against -2e-9 is within atol; its cosine (-1) is rounding noise and no longer fails parity."""
    expected = np.array([[3e-9], [0.5], [-1.2]], np.float32)
    got = np.array([[-2e-9], [0.5], [-1.2]], np.float32)
    comparison = compare_output("score", "opt", {"batch": 3}, "sample", expected, got, 1e-4, 1e-3)
    assert comparison.within_tolerance and comparison.cosine_min == pytest.approx(1.0)
    assert ParityReport(1e-4, 1e-3, 0.9999, [comparison]).passed
    flipped = compare_output("score", "opt", {"batch": 3}, "sample", expected, -expected, 1e-4, 1e-3)
    assert flipped.cosine_min == pytest.approx(-1.0)  # rows past atol keep their cosine


def test_the_failure_message_names_the_element_furthest_past_the_tolerance():
    """Before: it named the largest abs diff (1000 vs 1000.5, within rtol), not the failing element."""
    expected = np.array([[1000.0, 0.001]], np.float32)
    got = np.array([[1000.5, 0.0025]], np.float32)
    comparison = compare_output("y", "opt", {"batch": 1}, "sample", expected, got, 1e-4, 1e-3)
    assert not comparison.within_tolerance and comparison.worst_index == (0, 1)
    message = str(parity_failure(Recipe.model_construct(path=Path("r.yaml")), ParityReport(1e-4, 1e-3, 0.9999, [comparison])))
    assert "max abs diff 0.5; furthest past the tolerance at index [0, 1] (ONNX 0.0025, PyTorch 0.001)" in message
