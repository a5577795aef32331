"""A tiny recurrent voice-activity model shaped like the Silero VAD: audio chunk, state in/out, scalar sample rate.

``TinyVad.forward(x, state, sr)`` takes ``x`` float32[batch, 64], ``state`` float32[2, batch, 16] (LSTM h and c)
and ``sr`` a rank-0 int64 tensor; it returns the speech probability [batch, 1] and the next state. The sample
rate scales the input, so a wrong ``sr`` changes the outputs. ``TinyVadIntRate`` takes ``sr: int`` (not a tensor),
as TorchScript models often do: only ``model.constant_args`` can export it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CHUNK = 64
HIDDEN = 16


class TinyVad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.features = nn.Linear(CHUNK, HIDDEN)
        self.cell = nn.LSTMCell(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def step(self, x: torch.Tensor, state: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = self.cell(torch.tanh(self.features(x * scale)), (state[0], state[1]))
        return torch.sigmoid(self.head(h)), torch.stack([h, c])

    def forward(self, x: torch.Tensor, state: torch.Tensor, sr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.step(x, state, sr.to(torch.float32) / 16000.0)


class TinyVadIntRate(TinyVad):
    def forward(self, x: torch.Tensor, state: torch.Tensor, sr: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.step(x, state, torch.tensor(float(sr) / 16000.0))


def tiny_vad() -> TinyVad:
    return TinyVad().eval()


def tiny_vad_int_rate() -> TinyVadIntRate:
    return TinyVadIntRate().eval()


def vad_sequences(sequences: int = 3, chunks: int = 5, batch: int = 1, seed: int = 0, rate: bool = True) -> list[list[dict[str, np.ndarray]]]:
    """Sequences of consecutive chunks: a tone that starts part-way through, so the state matters."""
    rng = np.random.default_rng(seed)
    out = []
    for number in range(sequences):
        signal = rng.normal(0, 0.05, size=(batch, CHUNK * chunks)).astype(np.float32)
        start = CHUNK * (1 + number % max(chunks - 1, 1))
        signal[:, start:] += np.sin(np.arange(CHUNK * chunks - start) * 0.3).astype(np.float32)
        sequence = []
        for index in range(chunks):
            chunk = {"x": np.ascontiguousarray(signal[:, index * CHUNK:(index + 1) * CHUNK])}
            if rate:
                chunk["sr"] = np.array(16000, dtype=np.int64)
            sequence.append(chunk)
        out.append(sequence)
    return out


def vad_chunks_without_rate(**kwargs: int) -> list[list[dict[str, np.ndarray]]]:
    return vad_sequences(rate=False, **kwargs)


def audio_sequences(sequences: int = 2, chunks: int = 6, chunk: int = 512, batch: int = 1, seed: int = 0) -> list[list[dict[str, np.ndarray]]]:
    """16 kHz audio chunks for a real VAD: noise, then a voiced harmonic tone from part-way through each sequence."""
    rng = np.random.default_rng(seed)
    out = []
    t = np.arange(chunk * chunks) / 16000.0
    for number in range(sequences):
        signal = rng.normal(0, 0.01, size=(batch, chunk * chunks))
        start = chunk * (1 + number % max(chunks - 2, 1))
        voiced = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 720), 1)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
        signal[:, start:] += 0.3 * voiced[start:]
        signal = signal.astype(np.float32)
        out.append([{"input": np.ascontiguousarray(signal[:, i * chunk:(i + 1) * chunk]), "sr": np.array(16000, dtype=np.int64)} for i in range(chunks)])
    return out


def flat_chunks() -> list[dict[str, np.ndarray]]:
    """Chunks without sequences: what a stateful recipe must not get."""
    return [chunk for sequence in vad_sequences(batch=2) for chunk in sequence]


def chunks_with_state() -> list[list[dict[str, np.ndarray]]]:
    """A sequence whose second chunk gives the state the model's first call provides."""
    sequences = vad_sequences(sequences=1, chunks=2, batch=2)
    sequences[0][1]["state"] = np.zeros((2, 2, 16), np.float32)
    return sequences
