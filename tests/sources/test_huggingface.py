"""The Hugging Face directory source's errors: a bad config.json, a model.path_from callable that raises or returns
no path, and a model saved with ``return_dict: false`` (tests/sources/test_sources.py builds a good directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgekit.errors import SourceError
from edgekit.recipe import load_recipe
from edgekit.sources.huggingface import _wrap, load_huggingface
from tests.sources.test_sources import HF_RECIPE


def model_dir_from_unset_env() -> str:
    """A model.path_from callable that fails, as one reading an unset environment variable does."""
    import os

    return os.environ["EDGEKIT_TEST_NO_SUCH_VARIABLE"]


def no_model_dir() -> None:
    """A model.path_from callable that forgets to return the directory."""
    return None


@pytest.mark.parametrize("text, raised", [('{"model_type": "bert", "hidden_', "OSError"),
                                          ('{"model_type": "no-such-arch"}', "ValueError")])
def test_a_config_json_that_transformers_cannot_read_is_a_source_error(tmp_path, text, raised):
    pytest.importorskip("optimum.exporters.onnx", reason="the hf extra (optimum-onnx) is not installed")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(text)
    (tmp_path / "bert.yaml").write_text(HF_RECIPE)
    recipe = load_recipe(tmp_path / "bert.yaml")
    with pytest.raises(SourceError) as caught:
        load_huggingface(recipe.model, recipe, tmp_path / "work")
    error = caught.value
    assert error.message.startswith(f"{tmp_path / 'bert.yaml'}: model.path: cannot read {tmp_path / 'bert' / 'config.json'}: {raised}: ")
    assert "save_pretrained()" in error.hint and "model_type" in error.hint


@pytest.mark.parametrize("function, said", [("model_dir_from_unset_env", "raised KeyError: 'EDGEKIT_TEST_NO_SUCH_VARIABLE'"),
                                            ("no_model_dir", "returned NoneType, not a path")])
def test_a_path_from_callable_that_fails_is_a_source_error(tmp_path, function, said):
    reference = f"tests.sources.test_huggingface:{function}"
    (tmp_path / "r.yaml").write_text(HF_RECIPE.replace("path: bert", f'path_from: "{reference}"'))
    recipe = load_recipe(tmp_path / "r.yaml")
    with pytest.raises(SourceError) as caught:
        load_huggingface(recipe.model, recipe, tmp_path / "work")
    assert caught.value.message == f"{tmp_path / 'r.yaml'}: model.path_from '{reference}' {said}"
    assert "model directory" in caught.value.hint


def test_a_model_saved_with_return_dict_false_still_returns_its_outputs_by_name():
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, return_dict=False)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    wrapped = _wrap(model, ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state"], "r.yaml: model.path")
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        (hidden,) = wrapped(ids, torch.ones_like(ids), torch.zeros_like(ids))
        expected = model(ids, torch.ones_like(ids), torch.zeros_like(ids))[0]  # the tuple the config asks for
    torch.testing.assert_close(hidden, expected)


class _ReturnsATuple(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, return_dict: bool = False) -> tuple[torch.Tensor]:
        return (input_ids.float(),)


def test_a_model_that_returns_no_mapping_is_a_source_error():
    wrapped = _wrap(_ReturnsATuple(), ["input_ids"], ["last_hidden_state"], "r.yaml: model.path")
    with pytest.raises(SourceError) as caught:
        wrapped(torch.zeros(1, 4, dtype=torch.int64))
    assert caught.value.message == "r.yaml: model.path: the Hugging Face model returns a tuple, not its outputs by name"
    assert "return_dict=True" in caught.value.hint
