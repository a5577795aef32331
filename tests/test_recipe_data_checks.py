"""Recipe data checks (edgekit.data): non-finite inputs, natural order of npz files, a sequence's state dims, the .npz
file in an error's location, and a data callable that returns a lone dict or None."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgekit.data import SEQUENCE_KEY, load_batches
from edgekit.errors import RecipeError
from edgekit.recipe import load_recipe

STATELESS = """\
name: d
model: {kind: onnx, path: m.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 4]}
outputs: [y]
dims:
  batch: {min: 1, opt: 4, max: 8}
data:
  samples: %s
"""

STATEFUL = """\
name: s
model: {kind: onnx, path: m.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 4]}
  - {name: h, dtype: float32, shape: [batch, 3]}
outputs: [y, hn]
state:
  - {input: h, output: hn}
dims:
  batch: {min: 1, opt: 4, max: 8}
data:
  samples: %s
"""


def good(batch: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"x": np.ones((batch, 4), np.float32)} for _ in range(2)]


def with_nan() -> list[dict[str, np.ndarray]]:
    batches = good()
    batches[1]["x"][0, 2] = np.nan
    return batches


def all_inf() -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((4, 4), np.inf, np.float32)}]


def lone_dict() -> dict[str, np.ndarray]:
    return {"x": np.ones((4, 4), np.float32)}


def nothing() -> None:
    return None


def mixed_sequence() -> list[list[dict[str, np.ndarray]]]:
    return [[{"x": np.ones((4, 4), np.float32)}] * 3, [{"x": np.ones((b, 4), np.float32)} for b in (4, 4, 2)]]


def sized_sequences() -> list[list[dict[str, np.ndarray]]]:  # another batch size in another sequence is fine
    return [[{"x": np.ones((4, 4), np.float32)}] * 2, [{"x": np.ones((2, 4), np.float32)}] * 2]


def _recipe(tmp_path: Path, text: str, samples: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text % samples))
    return load_recipe(path)


def _error(recipe) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_batches(recipe, recipe.data.samples, "samples")
    return info.value


def test_a_nan_in_a_float_input_is_refused_naming_field_batch_input_and_count(tmp_path: Path) -> None:
    error = _error(_recipe(tmp_path, STATELESS, '{callable: "tests.test_recipe_data_checks:with_nan"}'))
    assert "data.samples batch 1: input 'x' holds 1 non-finite value(s) of 16 (1 NaN, 0 +inf)" in error.message
    assert "nan_to_num" in (error.hint or "")


def test_an_all_inf_sample_in_an_npz_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "0.npz", x=np.full((4, 4), np.inf, np.float32))
    error = _error(_recipe(tmp_path, STATELESS, "{npz_dir: npz}"))
    assert f"data.samples batch 0 ({tmp_path / 'npz' / '0.npz'}): input 'x' holds 16 non-finite value(s) of 16 (0 NaN, 16 +inf)" in error.message


def test_minus_inf_as_in_an_additive_attention_mask_is_taken(tmp_path: Path) -> None:
    (tmp_path / "npz").mkdir()
    mask = np.zeros((4, 4), np.float32)
    mask[:, 2:] = -np.inf
    np.savez(tmp_path / "npz" / "0.npz", x=mask)
    recipe = _recipe(tmp_path, STATELESS, "{npz_dir: npz}")
    assert np.isneginf(load_batches(recipe, recipe.data.samples, "samples")[0]["x"]).sum() == 8


def test_finite_data_loads(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, STATELESS, '{callable: "tests.test_recipe_data_checks:good"}')
    assert len(load_batches(recipe, recipe.data.samples, "samples")) == 2


def test_the_npz_file_is_in_the_error_location(tmp_path: Path) -> None:
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "a.npz", np.ones((4, 4), np.float32))  # saved as arr_0, not keyed by input name
    error = _error(_recipe(tmp_path, STATELESS, "{npz_dir: npz}"))
    assert f"data.samples batch 0 ({tmp_path / 'npz' / 'a.npz'}): missing input 'x' (has ['arr_0'])" in error.message


@pytest.mark.parametrize(("name", "said"), [("lone_dict", "returned a single dict (keys ['x'])"), ("nothing", "returned None")])
def test_a_callable_returning_a_lone_dict_or_none_gets_a_direct_message(tmp_path: Path, name: str, said: str) -> None:
    error = _error(_recipe(tmp_path, STATELESS, f'{{callable: "tests.test_recipe_data_checks:{name}"}}'))
    assert f"data.samples: 'tests.test_recipe_data_checks:{name}' {said}, not a list of batches" in error.message
    assert "raised TypeError" not in error.message and error.hint


def test_stateful_npz_chunks_sort_numerically(tmp_path: Path) -> None:
    for sequence in ("2", "10"):
        folder = tmp_path / "seqs" / sequence
        folder.mkdir(parents=True)
        for step in (0, 1, 2, 10, 11):
            np.savez(folder / f"{step}.npz", x=np.full((4, 4), step + 100 * int(sequence), np.float32))
    recipe = _recipe(tmp_path, STATEFUL, "{npz_dir: seqs}")
    chunks = load_batches(recipe, recipe.data.samples, "samples")
    order = [(int(c[SEQUENCE_KEY]), int(c["x"][0, 0])) for c in chunks]
    assert order == [(0, 200), (0, 201), (0, 202), (0, 210), (0, 211), (1, 1000), (1, 1001), (1, 1002), (1, 1010), (1, 1011)]


def test_a_sequence_that_changes_its_batch_size_is_refused_naming_sequence_and_chunk(tmp_path: Path) -> None:
    error = _error(_recipe(tmp_path, STATEFUL, '{callable: "tests.test_recipe_data_checks:mixed_sequence"}'))
    assert ("data.samples sequence 1 chunk 2: state input 'h' is [2, 3] at this chunk but [4, 3] at the sequence's chunk 0 "
            "(dim 'batch')") in error.message
    assert "same in every chunk of a sequence" in (error.hint or "")
    recipe = _recipe(tmp_path, STATEFUL, '{callable: "tests.test_recipe_data_checks:sized_sequences"}')
    assert len(load_batches(recipe, recipe.data.samples, "samples")) == 4


def test_a_stateful_npz_error_names_the_chunk_file(tmp_path: Path) -> None:
    folder = tmp_path / "seqs" / "0"
    folder.mkdir(parents=True)
    np.savez(folder / "0.npz", x=np.ones((4, 4), np.float32))
    np.savez(folder / "1.npz", x=np.full((4, 4), np.nan, np.float32))
    error = _error(_recipe(tmp_path, STATEFUL, "{npz_dir: seqs}"))
    assert f"data.samples sequence 0 chunk 1 ({folder / '1.npz'}): input 'x' holds 16 non-finite value(s)" in error.message
