"""Silero VAD as the ``silero-vad`` wheel ships it, twice: the 16 kHz ONNX file (opset 15: STFT as a
convolution, a conv encoder, an LSTM decoder, ``If`` on the sample rate) and the TorchScript file
(``silero_vad.jit``, ``forward(x, sr: int)``), the "recurrent VAD as TorchScript" case.

Audio is seeded speech-like sound (:mod:`edgekit.corpus.audio`: voiced syllables with formants,
fricatives, pauses) cut into 512-sample chunks (32 ms at 16 kHz), several streams side by side as the
batch. Silero prepends the previous chunk's last 64 samples (its context) to each chunk and carries an
LSTM state from call to call.

- ``silero-vad`` (ONNX): a stateless recipe whose batches carry the context and state FP32 had at that
  chunk (teacher-forced), so every chunk is judged in a realistic state.
- ``silero-vad-jit`` (TorchScript): the JIT's top-level ``forward(x, sr)`` keeps its state and context
  in module attributes that it reassigns every call, which no exporter can turn into a graph (see
  :data:`JIT_TOP_LEVEL_EXPORT`). :class:`SileroStateful` is the adapter a user writes: the JIT's own
  16 k and 8 k networks, with state and context as explicit tensors and ``sr: int`` still a forward()
  argument, scripted and saved as TorchScript. The recipe pins ``sr`` with ``model.constant_args`` and
  declares ``state`` (stateN -> state, contextN -> context), so calibration, golden data and evaluation
  run sequences of consecutive chunks with the state carried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgekit.corpus.audio import speech_like
from edgekit.corpus.base import Batch, CorpusModel, Provider, extract_member, find_wheel

PACKAGE = "silero-vad"
MEMBER = "silero_vad/data/silero_vad_16k_op15.onnx"
JIT_MEMBER = "silero_vad/data/silero_vad.jit"
RATE = 16000
CHUNK = 512
CONTEXT = 64
STREAMS = 8
#: silero's own speech threshold; the metric: chunks decided as FP32 decides them, 98 %
METRIC: dict[str, Any] = {"metric": "binary_decision", "binary_decision": {"threshold": 0.5}}
MIN_AGREEMENT = 0.98
#: what the JIT's top-level forward gives edgekit's exporters (torch 2.13), recorded in the model's notes
JIT_TOP_LEVEL_EXPORT = ("the JIT's top-level forward(x, sr) does not export (dynamo: torch.export fails on the scripted module; legacy: "
                        "'ONNX export does NOT support exporting bitwise Not for non-boolean input values' at `not len(self._context)`), "
                        "and its state lives in attributes it reassigns per call: built through SileroStateful, the JIT's own networks "
                        "with state and context as tensors")


def audio_streams(seed: int, streams: int, chunks: int) -> np.ndarray:
    """[streams, chunks * 512] float32 speech-like audio, about half of it voiced."""
    rng = np.random.default_rng(seed)
    return np.stack([speech_like(rng, chunks * CHUNK, RATE) for _ in range(streams)])


def _chunks(audio: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(audio[:, i:i + CHUNK]) for i in range(0, audio.shape[1], CHUNK)]


def onnx_batches(session: Any, audio: np.ndarray) -> list[Batch]:
    """The ONNX model's feeds for consecutive chunks of ``audio``: context + chunk (576 samples), and the
    state FP32 reached after the previous chunk (zeros first)."""
    streams = audio.shape[0]
    state = np.zeros((2, streams, 128), np.float32)
    context = np.zeros((streams, CONTEXT), np.float32)
    batches = []
    for chunk in _chunks(audio):
        feeds = {"input": np.concatenate([context, chunk], axis=1), "state": state, "sr": np.array(RATE, np.int64)}
        batches.append(feeds)
        state = session.run(["stateN"], feeds)[0]
        context = feeds["input"][:, -CONTEXT:]
    return batches


def make_vad(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    import onnxruntime as ort

    wheel = find_wheel(wheel_dir, PACKAGE)
    path = extract_member(wheel, MEMBER, work / "silero-vad")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    calibration = onnx_batches(session, audio_streams(20, STREAMS, max(4, int(16 * scale))))
    evaluation = onnx_batches(session, audio_streams(21, STREAMS, max(4, int(24 * scale))))
    return CorpusModel("silero-vad", "binary_decision", path, calibration, evaluation, evaluation[-1],
                       "output", f"{wheel.name}: {MEMBER.split('/')[-1]}",
                       ("recurrent: LSTM inside If branches", "batches carry the context and state FP32 had at each chunk"),
                       batch_axes={"input": 0, "state": 1, "sr": None}, metric=dict(METRIC), min_value=MIN_AGREEMENT)


# ---------------------------------------------------------------- the TorchScript file


def _stateful_class() -> type:
    import torch

    class SileroStateful(torch.nn.Module):
        """Silero's 16 k / 8 k networks with explicit state: ``forward(x, state, context, sr: int)`` ->
        (speech probability [batch, 1], next state [2, batch, 128], next context [batch, 64])."""

        def __init__(self, model_16k: torch.nn.Module, model_8k: torch.nn.Module) -> None:
            super().__init__()
            self.model_16k = model_16k
            self.model_8k = model_8k

        def forward(self, x: torch.Tensor, state: torch.Tensor, context: torch.Tensor, sr: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            audio = torch.cat([context, x], dim=1)
            if sr == 16000:
                probability, next_state = self.model_16k(audio, state)
            elif sr == 8000:
                probability, next_state = self.model_8k(audio, state)
            else:
                raise ValueError("sr must be 8000 or 16000")
            return probability, next_state, audio[:, audio.shape[1] - context.shape[1]:]

    return SileroStateful


def stateful_torchscript(jit_path: Path, out: Path) -> Path:
    """Script :class:`SileroStateful` around the JIT file's two networks and save it as TorchScript."""
    import torch

    original = torch.jit.load(str(jit_path), map_location="cpu")
    scripted = torch.jit.script(_stateful_class()(original._model, original._model_8k).eval())
    torch.jit.save(scripted, str(out))
    return out


def _export_bound(script_path: Path, example: Batch, out: Path) -> Path:
    """The ONNX file ORT's quantizers and the tests run: the TorchScript model with ``sr=16000`` bound,
    traced and exported as edgekit's legacy exporter does (opset 17)."""
    import torch

    module = torch.jit.load(str(script_path), map_location="cpu")

    class Bound(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x: torch.Tensor, state: torch.Tensor, context: torch.Tensor) -> Any:
            return self.inner(x, state, context, RATE)

    args = tuple(torch.from_numpy(example[n]) for n in ("x", "state", "context"))
    with torch.inference_mode():
        traced = torch.jit.trace(Bound().eval(), args, check_trace=False)
        torch.onnx.export(traced, args, str(out), input_names=["x", "state", "context"], output_names=["prob", "stateN", "contextN"],
                          dynamic_axes={"x": {0: "batch"}, "state": {1: "batch"}, "context": {0: "batch"},
                                        "prob": {0: "batch"}, "stateN": {1: "batch"}, "contextN": {0: "batch"}},
                          opset_version=17, dynamo=False)
    return out


def jit_sequences(session: Any, audio: np.ndarray, length: int) -> list[Batch]:
    """Consecutive chunks in sequences of ``length`` (state and context zero at each start), each chunk
    with the state and context FP32 reached before it, so a stateless run of a chunk sees what the
    pipeline's stateful run of the sequence carries."""
    streams = audio.shape[0]
    batches = []
    for index, chunk in enumerate(_chunks(audio)):
        if index % length == 0:
            state, context = np.zeros((2, streams, 128), np.float32), np.zeros((streams, CONTEXT), np.float32)
        feeds = {"x": chunk, "state": state, "context": context}
        batches.append(feeds)
        _, state, context = session.run(["prob", "stateN", "contextN"], feeds)
    return batches


JIT_SEQUENCE = 8


def make_vad_jit(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    import onnxruntime as ort

    wheel = find_wheel(wheel_dir, PACKAGE)
    directory = work / "silero-vad-jit"
    jit = extract_member(wheel, JIT_MEMBER, directory)
    script = stateful_torchscript(jit, directory / "silero_vad_stateful.pt")
    length = JIT_SEQUENCE  # silero needs a few chunks of carried state before it calls speech
    first = {"x": np.zeros((STREAMS, CHUNK), np.float32), "state": np.zeros((2, STREAMS, 128), np.float32),
             "context": np.zeros((STREAMS, CONTEXT), np.float32)}
    path = _export_bound(script, first, directory / "silero_vad_stateful.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    calibration = jit_sequences(session, audio_streams(22, STREAMS, length * max(1, int(2 * scale))), length)
    evaluation = jit_sequences(session, audio_streams(23, STREAMS, length * max(1, int(3 * scale))), length)
    return CorpusModel("silero-vad-jit", "binary_decision", path, calibration, evaluation, evaluation[-1], "prob",
                       f"{wheel.name}: {JIT_MEMBER.split('/')[-1]} (16 k and 8 k networks, explicit state)",
                       ("TorchScript source, sr pinned by model.constant_args", JIT_TOP_LEVEL_EXPORT),
                       batch_axes={"x": 0, "state": 1, "context": 0}, metric=dict(METRIC), min_value=MIN_AGREEMENT,
                       model_source={"kind": "torchscript", "path": str(script), "constant_args": {"sr": RATE}},
                       state=(("state", "stateN"), ("context", "contextN")), sequence_length=length)


PROVIDERS = (
    Provider("silero-vad", "binary_decision", PACKAGE, make_vad, "Silero VAD 16 kHz ONNX (recurrent), 8x576 samples"),
    Provider("silero-vad-jit", "binary_decision", PACKAGE, make_vad_jit,
             "Silero VAD TorchScript (forward(x, sr: int), recurrent state carried), 8x512 samples"),
)
