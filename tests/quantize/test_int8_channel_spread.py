"""Static int8 on a spectrogram front end built as Silero VAD builds it (an STFT as a Conv with a fixed Fourier
basis, magnitude by Pow/Add/Sqrt, then a Conv encoder): one 8-bit scale per tensor erases the quiet frequency
bins, so the plan keeps the STFT Conv and the Conv reading the magnitude float, and names why. An ordinary
feature map (channels of similar size) keeps its convolutions quantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize import channel_spread
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target

WINDOW, HOP, BINS = 64, 32, 33


def spectrogram_encoder(path: Path) -> Path:
    """audio [N, 1, 512] -> STFT Conv (cos/sin basis, Hann window) -> |.| -> Conv(33 -> 16) -> Relu -> Conv(16 -> 8)."""
    t = np.arange(WINDOW)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * t / WINDOW)
    freqs = np.arange(BINS)[:, None]
    basis = np.concatenate([np.cos(2 * np.pi * freqs * t / WINDOW), -np.sin(2 * np.pi * freqs * t / WINDOW)]) * window
    rng = np.random.default_rng(4)
    encoder_w = rng.normal(0, 0.3, (16, BINS, 3)) * np.linspace(1, 30, BINS)[None, :, None]  # quiet high bins weigh more, as Silero's do
    inits = [numpy_helper.from_array(basis[:, None, :].astype(np.float32), "basis"),
             numpy_helper.from_array(encoder_w.astype(np.float32), "enc0_w"), numpy_helper.from_array(np.zeros(16, np.float32), "enc0_b"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 16, 3)).astype(np.float32), "enc1_w"),
             numpy_helper.from_array(np.zeros(8, np.float32), "enc1_b"),
             *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
               [("re_start", [0]), ("re_end", [BINS]), ("im_start", [BINS]), ("im_end", [2 * BINS]), ("axis", [1])]),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("Conv", ["audio", "basis"], ["spectrum"], name="stft", strides=[HOP]),
             helper.make_node("Slice", ["spectrum", "re_start", "re_end", "axis"], ["re"], name="real"),
             helper.make_node("Slice", ["spectrum", "im_start", "im_end", "axis"], ["im"], name="imag"),
             helper.make_node("Pow", ["re", "two"], ["re2"], name="re_sq"), helper.make_node("Pow", ["im", "two"], ["im2"], name="im_sq"),
             helper.make_node("Add", ["re2", "im2"], ["power"], name="power"), helper.make_node("Sqrt", ["power"], ["magnitude"], name="magnitude"),
             helper.make_node("Conv", ["magnitude", "enc0_w", "enc0_b"], ["c0"], name="enc0", pads=[1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "enc1_w", "enc1_b"], ["features"], name="enc1", pads=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["N", 1, 512])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def speech_like(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches of loud low harmonics over quiet broadband noise (a spectrum some 50 dB deep)."""
    rng = np.random.default_rng(seed)
    t = np.arange(512) / 16000
    batches = []
    for _ in range(count):
        pitch = rng.uniform(100, 250, (8, 1, 1))
        voiced = sum(np.sin(2 * np.pi * k * pitch * t + rng.uniform(0, 6.3)) / k ** 2 for k in range(1, 4))
        batches.append({"audio": (0.5 * voiced + 0.002 * rng.normal(size=(8, 1, 512))).astype(np.float32)})
    return batches


def _bin_error(fp32: Path, int8: Path, feeds: dict[str, np.ndarray]) -> float:
    """Median over output channels of the relative error: the quiet channels count as much as the loud."""
    want = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return float(np.median(np.linalg.norm(got - want, axis=(0, 2)) / np.linalg.norm(want, axis=(0, 2))))


def test_stft_and_the_conv_reading_its_magnitude_stay_float_with_the_reason(tmp_path):
    fp32 = spectrogram_encoder(tmp_path / "fp32.onnx")
    int8 = tmp_path / "int8.onnx"
    result = quantize_model(fp32, int8, QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                            speech_like(4, seed=1), tmp_path, cache_dir=tmp_path / "cache")
    excluded = result.plan.excluded
    assert "its output 'spectrum' spans channels too unequal for one 8-bit scale" in excluded["stft"]
    assert "its input 'magnitude' spans channels too unequal" in excluded["enc0"]
    assert "enc1" not in excluded, "enc1's input is an ordinary feature map"
    assert any("convolution(s) kept float" in note for note in result.plan.notes)
    graph = onnx.load(str(int8)).graph
    assert next(n for n in graph.node if n.name == "stft").input[1] == "basis", "the STFT basis stays float"
    assert _bin_error(fp32, int8, speech_like(1, seed=9)[0]) < 0.05


def test_without_the_exclusions_the_quiet_bins_are_lost(tmp_path):
    """The same build with the two convolutions forced into int8 (the rule's threshold at 0): the error it prevents."""
    fp32 = spectrogram_encoder(tmp_path / "fp32.onnx")
    original = channel_spread.MIN_MEDIAN_CHANNEL_STEPS
    channel_spread.MIN_MEDIAN_CHANNEL_STEPS = 0.0
    try:
        quantize_model(fp32, tmp_path / "int8.onnx", QuantizationSpec(), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                       speech_like(4, seed=1), tmp_path, cache_dir=tmp_path / "cache")
    finally:
        channel_spread.MIN_MEDIAN_CHANNEL_STEPS = original
    assert _bin_error(fp32, tmp_path / "int8.onnx", speech_like(1, seed=9)[0]) > 0.1


def test_rounding_error_rule_only_in_models_with_recurrent_state(tmp_path):
    fp32 = spectrogram_encoder(tmp_path / "fp32.onnx")
    assert not channel_spread.has_recurrent_state(fp32)
    stats = channel_spread.feature_map_stats(fp32, ["r0", "features"], speech_like(2, seed=1))
    weight = numpy_helper.to_array(next(i for i in onnx.load(str(fp32)).graph.initializer if i.name == "enc1_w"))
    error = channel_spread.input_rounding_error(weight, stats["r0"], stats["features"])
    assert 0.0 < error < channel_spread.MAX_INPUT_ROUNDING_ERROR
    assert channel_spread.input_rounding_error(weight * np.array([100.0] + [1.0] * 15)[None, :, None], stats["r0"], stats["features"]) > error
