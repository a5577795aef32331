"""Convolutions whose feature maps one 8-bit scale cannot hold: static int8 quantizes each activation with
one scale for the whole tensor, so when a tensor's channels differ in size by orders of magnitude (a
spectrogram, whose frequency bins span some 60 dB), most channels fall within a step or two of zero.

Silero VAD computes its STFT as a Conv with a fixed Fourier basis and feeds the magnitude to its first
encoder Conv: the median frequency bin of the STFT output peaked at 1.6 uint8 steps and that of the
magnitude at 4.9, against 35 and more on every other convolution's tensors. The whole-tensor cosine to
FP32 still read 0.997 (the loud low bins dominate it), but the median bin's relative error was 70 %, the
encoder's weights amplify the quiet bins, and the LSTM state ended at cosine 0.78. Kept float, the two
convolutions leave every later tensor at cosine >= 0.995.

A second, weighted form of the same problem, checked only in models with recurrent state (LSTM/GRU/RNN),
where an error that reaches the state comes back on every later call: a Conv whose weights single out a
few small input channels (Silero's last encoder Conv, input-channel weights up to 55 against a median of
0.28) turns the rounding of its input into an output error of 4.6 % RMS (3.7 % in the ONNX release), and the
LSTM reads it. Kept float too, the TorchScript model's decisions agreed with FP32's on 99.5 % instead of
97.9 %. Feed-forward CNNs take such errors without harm (PP-OCR's direction classifier has a 4.9 % Conv and
meets its budget; ResNet-18's worst is 1.3 %), so there the check stays off.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from edgekit.quantize.plan import QuantizationPlan

#: A Conv stays float when the median channel of its input or output peaks below this many steps of an
#: 8-bit scale over the whole tensor's range (Silero's STFT: 1.6 and 4.9; CNNs with normalised feature
#: maps: tens of steps).
MIN_MEDIAN_CHANNEL_STEPS = 8.0
#: In a model with recurrent state, a Conv stays float when rounding its input to a whole-tensor 8-bit scale
#: alone adds more than this RMS error, relative to its output's RMS (Silero's last encoder Conv: 3.7-4.6 %,
#: its other convolutions: at most 2 %).
MAX_INPUT_ROUNDING_ERROR = 0.03
#: In any model, a Conv stays float when rounding its input erases at least :data:`MAX_ERASED_CHANNEL_SHARE` of its
#: output channels, each alone: the channel's input-rounding error over :data:`ERASED_CHANNEL_ERROR` of its RMS.
#: PP-PicoDet's (PP-LCNet's) depthwise convolutions read channels that peak at 0.1 beside one at 42 and scale them
#: up 40-80x (their folded BatchNorm): 5 of the first one's 16 channels came out at 60-590 % error, the whole
#: network's score heads at cosine 0.3-0.5 and detection mAP at 0.0. The whole-tensor average (2.6 %) hides it.
ERASED_CHANNEL_ERROR = 0.3
MAX_ERASED_CHANNEL_SHARE = 0.1
#: Calibration batches the FP32 probe runs (per-channel peaks settle quickly; the probe keeps builds fast).
PROBE_BATCHES = 2


def conv_feature_maps(model_path: Path, skip: set[str]) -> dict[str, tuple[str, str]]:
    """Conv node name -> (input tensor, output tensor) for convolutions not in ``skip``."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return {node.name: (node.input[0], node.output[0]) for node in graph.node if node.op_type == "Conv" and node.name not in skip}


def conv_weights(model_path: Path, skip: set[str]) -> dict[str, np.ndarray]:
    """Conv node name -> its constant weight (an initializer or a Constant node), for convolutions not in ``skip``."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model_path), load_external_data=True).graph
    constants = {init.name: init for init in graph.initializer}
    constants.update({node.output[0]: node.attribute[0].t for node in graph.node
                      if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"})
    return {node.name: numpy_helper.to_array(constants[node.input[1]]) for node in graph.node
            if node.op_type == "Conv" and node.name not in skip and len(node.input) > 1 and node.input[1] in constants}


@dataclass
class FeatureMapStats:
    """Per tensor over the probe batches: channel (axis 1) peaks and mean squares, and the range with 0."""
    peak: np.ndarray
    mean_square: np.ndarray
    low: float = 0.0
    high: float = 0.0

    def add(self, value: np.ndarray) -> None:
        axes = tuple(axis for axis in range(value.ndim) if axis != 1)
        self.peak = np.maximum(self.peak, np.abs(value).max(axis=axes))
        self.mean_square = np.maximum(self.mean_square, (value.astype(np.float64) ** 2).mean(axis=axes))
        self.low, self.high = min(self.low, float(value.min())), max(self.high, float(value.max()))

    @property
    def step(self) -> float:
        """The step of an 8-bit scale over the tensor's range (with 0, as uint8 asymmetric quantization has it)."""
        return (self.high - self.low) / 255.0

    def median_channel_steps(self) -> float:
        return float(np.median(self.peak) / self.step) if self.step > 0 else 255.0


def feature_map_stats(model_path: Path, tensors: Sequence[str], batches: Sequence[Mapping[str, Any]]) -> dict[str, FeatureMapStats]:
    """Tensor -> :class:`FeatureMapStats` over the FP32 model's run on the first :data:`PROBE_BATCHES` batches.
    Tensors of rank < 3 (no channel axis between batch and space) are left out."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=True)
    known = {output.name for output in model.graph.output}
    model.graph.output.extend(onnx.helper.make_value_info(name, onnx.TypeProto()) for name in tensors if name not in known)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    stats: dict[str, FeatureMapStats] = {}
    for batch in batches[:PROBE_BATCHES]:
        values = session.run(list(tensors), {name: value for name, value in batch.items() if name in inputs})
        for name, value in zip(tensors, values):
            if value.ndim < 3 or value.size == 0:
                continue
            channels = value.shape[1]
            stats.setdefault(name, FeatureMapStats(np.zeros(channels), np.zeros(channels))).add(value)
    return stats


def input_rounding_error(weight: np.ndarray, source: FeatureMapStats, result: FeatureMapStats) -> float:
    """RMS output error that rounding the input to its 8-bit step adds (uniform noise of variance step^2 / 12
    through each output channel's weights), relative to the output's RMS. Grouped convolutions see each
    output channel's own group: the weight's rows are the same shape either way."""
    noise = source.step ** 2 / 12.0 * (weight.reshape(weight.shape[0], -1).astype(np.float64) ** 2).sum()
    signal = float(result.mean_square.sum())
    return float(np.sqrt(noise / signal)) if signal > 0 else 0.0


def channel_rounding_errors(weight: np.ndarray, source: FeatureMapStats, result: FeatureMapStats) -> np.ndarray:
    """Per output channel: the RMS error rounding the input to its 8-bit step adds, relative to that channel's RMS
    (a silent channel's error is infinite: a BatchNorm after it scales the noise up as far as it would the signal)."""
    noise = source.step ** 2 / 12.0 * (weight.reshape(weight.shape[0], -1).astype(np.float64) ** 2).sum(axis=1)
    if noise.shape != result.mean_square.shape:
        return np.zeros(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(noise > 0, np.sqrt(noise / result.mean_square), 0.0)


def erased_channel_share(weight: np.ndarray, source: FeatureMapStats, result: FeatureMapStats) -> float:
    errors = channel_rounding_errors(weight, source, result)
    return float((errors > ERASED_CHANNEL_ERROR).mean()) if errors.size else 0.0


def float_feed(graph: Any, conv: str, limit: int = 8) -> list[str]:
    """The nodes of ``graph`` that compute ``conv``'s input from the previous convolution(s), those included: the
    float path an erased-channel Conv needs, since its small channels are made (and lost to rounding) upstream, in
    the convolution that produces them and the activation between (PicoDet's stem Conv -> HardSwish). At most
    ``limit`` nodes."""
    producers = {out: node for node in graph.node for out in node.output}
    start = next((node for node in graph.node if node.name == conv), None)
    if start is None:
        return []
    found: list[str] = []
    frontier = [start.input[0]]
    while frontier and len(found) < limit:
        node = producers.get(frontier.pop(0))
        if node is None or node.op_type == "Constant" or not node.name or node.name in found:
            continue
        found.append(node.name)
        if node.op_type != "Conv":
            frontier.extend(name for name in node.input if name)
    return found


def has_recurrent_state(model_path: Path) -> bool:
    """Whether an LSTM/GRU/RNN runs anywhere in the model (subgraphs included)."""
    from edgekit.quantize.ort.static_plan import RECURRENT_OPS, recurrent_nodes

    return any(why.startswith(RECURRENT_OPS) for why in recurrent_nodes(model_path).values())


def wide_spread_convs(model_path: Path, skip: set[str], batches: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Conv node name -> why it stays float: convolutions whose input or output has a median channel below
    :data:`MIN_MEDIAN_CHANNEL_STEPS` steps of a whole-tensor 8-bit scale, and in a model with recurrent state,
    those whose input rounding alone costs more than :data:`MAX_INPUT_ROUNDING_ERROR` of the output."""
    convs = conv_feature_maps(model_path, skip)
    if not convs or not batches:
        return {}
    weights = conv_weights(model_path, skip)
    stats = feature_map_stats(model_path, list(dict.fromkeys(name for pair in convs.values() for name in pair)), batches)
    recurrent = has_recurrent_state(model_path)
    kept: dict[str, str] = {}
    graph = None
    for node, (source, result) in convs.items():
        for role, tensor in (("input", source), ("output", result)):
            if tensor in stats and stats[tensor].median_channel_steps() < MIN_MEDIAN_CHANNEL_STEPS:
                kept[node] = (f"its {role} '{tensor}' spans channels too unequal for one 8-bit scale: the median channel peaks at "
                              f"{stats[tensor].median_channel_steps():.1f} uint8 steps (< {MIN_MEDIAN_CHANNEL_STEPS:g}), so int8 would "
                              "erase most channels; kept float")
                break
        if node in kept or node not in weights or source not in stats or result not in stats:
            continue
        erased = erased_channel_share(weights[node], stats[source], stats[result])
        if erased >= MAX_ERASED_CHANNEL_SHARE:
            kept[node] = (f"rounding its input '{source}' to one 8-bit scale erases {erased:.0%} of its output channels (each over "
                          f"{ERASED_CHANNEL_ERROR:.0%} error: small input channels it scales up); kept float")
            if graph is None:
                import onnx

                graph = onnx.load(str(model_path), load_external_data=False).graph
            for feeder in float_feed(graph, node):
                kept.setdefault(feeder, f"computes '{source}', whose small channels '{node}' scales up: kept float with it")
            continue
        if not recurrent:
            continue
        error = input_rounding_error(weights[node], stats[source], stats[result])
        if error > MAX_INPUT_ROUNDING_ERROR:
            kept[node] = (f"rounding its input '{source}' to one 8-bit scale alone adds {error:.1%} RMS error to its output "
                          f"(> {MAX_INPUT_ROUNDING_ERROR:.0%}), which the recurrent state would carry forward; kept float")
    return kept


def keep_wide_spread_convs_float(model_path: Path, plan: "QuantizationPlan", batches: Sequence[Mapping[str, Any]]) -> "QuantizationPlan":
    """``plan`` with the convolutions :func:`wide_spread_convs` finds kept float and a note saying why (the
    static int8 build and ``--precision auto``'s int8 candidates alike)."""
    from dataclasses import replace

    kept = wide_spread_convs(model_path, set(plan.excluded), batches)
    if not kept:
        return plan
    note = (f"{len(kept)} convolution(s) kept float: one 8-bit scale per tensor would erase most channels of their input or "
            "output (a spectrogram's frequency bins), or would erase the small input channels a convolution scales up (kept float "
            "with the nodes that compute them), or its rounding would reach the recurrent state")
    return replace(plan.excluding(kept), notes=(*plan.notes, note))
