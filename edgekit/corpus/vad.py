"""Silero VAD as the ``silero-vad`` wheel ships it: a recurrent voice-activity detector (16 kHz ONNX,
opset 15: STFT as a convolution, a conv encoder, an LSTM decoder, ``If`` on the sample rate). Inputs are
512-sample chunks of seeded audio (noise with voiced bursts), a zero state and ``sr = 16000``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel, Provider, extract_member, find_wheel

PACKAGE = "silero-vad"
MEMBER = "silero_vad/data/silero_vad_16k_op15.onnx"


def audio_batches(seed: int, count: int, batch: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    t = np.arange(512) / 16000.0
    out = []
    for _ in range(count):
        chunks = rng.normal(0, 0.01, size=(batch, 512))
        voiced = rng.random(batch) < 0.5
        pitch = rng.uniform(90, 250, size=(batch, 1))
        harmonics = sum(np.sin(2 * np.pi * k * pitch * t) / k for k in range(1, 8))
        chunks += voiced[:, None] * 0.3 * harmonics
        out.append({"input": chunks.astype(np.float32), "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)})
    return out


def make_vad(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    wheel = find_wheel(wheel_dir, PACKAGE)
    path = extract_member(wheel, MEMBER, work / "silero-vad")
    evaluation = audio_batches(21, max(2, int(12 * scale)), 8)
    return CorpusModel("silero-vad", "binary_decision", path, audio_batches(20, max(2, int(16 * scale)), 8), evaluation, evaluation[0],
                       "output", f"{wheel.name}: {MEMBER.split('/')[-1]}", ("recurrent: LSTM inside If branches",),
                       batch_axes={"input": 0, "state": 1, "sr": None},
                       # speech or not per chunk at silero's own 0.5 threshold, 98 % of chunks as FP32 decides
                       metric={"metric": "binary_decision", "binary_decision": {"threshold": 0.5}}, min_value=0.98)


PROVIDERS = (Provider("silero-vad", "binary_decision", PACKAGE, make_vad, "Silero VAD 16 kHz (recurrent), 8x512 samples"),)
