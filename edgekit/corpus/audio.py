"""Seeded speech-like audio for the corpus's audio models (nothing recorded, nothing downloaded).

An utterance is a run of syllables and pauses: a voiced vowel is a harmonic series on a gliding pitch
(90..260 Hz) whose harmonics are weighted by three formant resonances (F1 300..850 Hz, F2 900..2400 Hz,
F3 2400..3200 Hz), with an attack/decay envelope; some syllables start with a fricative (noise
high-passed by differencing); pauses hold low background noise. Voice-activity and CTC models see
something with the structure of speech (voiced/unvoiced/silent stretches, formants) rather than noise.
"""

from __future__ import annotations

import numpy as np


def _vowel(rng: np.random.Generator, samples: int, rate: int) -> np.ndarray:
    t = np.arange(samples) / rate
    start, end = rng.uniform(90, 260), rng.uniform(90, 260)
    pitch = start + (end - start) * t / max(t[-1], 1e-9) + 4 * np.sin(2 * np.pi * rng.uniform(3, 6) * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    formants = [(rng.uniform(300, 850), 90.0), (rng.uniform(900, 2400), 120.0), (rng.uniform(2400, 3200), 180.0)]
    wave = np.zeros(samples)
    for k in range(1, int(3800 / max(start, end)) + 1):
        frequency = k * (start + end) / 2
        gain = sum(np.exp(-0.5 * ((frequency - f) / width) ** 2) * (1.0 / (i + 1)) for i, (f, width) in enumerate(formants)) + 0.02 / k
        wave += gain * np.sin(k * phase)
    envelope = np.minimum(1.0, np.minimum(t / 0.02, (t[-1] - t) / 0.04 + 1e-3))
    return wave * np.clip(envelope, 0, 1) / max(np.abs(wave).max(), 1e-9)


def _fricative(rng: np.random.Generator, samples: int) -> np.ndarray:
    noise = np.diff(rng.normal(0, 1, samples + 1))
    return noise / max(np.abs(noise).max(), 1e-9) * np.hanning(samples)


def speech_like(rng: np.random.Generator, samples: int, rate: int = 16000, speech_fraction: float = 0.5) -> np.ndarray:
    """``samples`` of float32 audio in [-1, 1]: syllables (fricative + vowel) and pauses, about
    ``speech_fraction`` of the time voiced."""
    out = rng.normal(0, 0.003, samples)
    position = int(rng.integers(0, rate // 5))
    while position < samples:
        if rng.random() < speech_fraction:
            loudness = rng.uniform(0.2, 0.6)
            if rng.random() < 0.4:
                length = int(rng.uniform(0.04, 0.1) * rate)
                piece = 0.3 * loudness * _fricative(rng, length)
                out[position:position + length] += piece[: samples - position]
                position += length
            length = int(rng.uniform(0.12, 0.3) * rate)
            piece = loudness * _vowel(rng, length, rate)
            out[position:position + length] += piece[: max(samples - position, 0)]
        else:
            length = int(rng.uniform(0.1, 0.4) * rate)
        position += length
    return np.clip(out, -1, 1).astype(np.float32)
