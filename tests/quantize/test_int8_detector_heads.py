"""Static int8 on the two patterns that broke real detectors (issue 17): PP-PicoDet's depthwise convolutions,
which scale up input channels too small for the tensor's one 8-bit scale, and YOLOv8's head, whose box and
class convolutions are concatenated, split again, and decoded apart before one output joins them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def _conv(name: str, weight: np.ndarray, inits: list, x: str, y: str, group: int = 1) -> object:
    inits.append(numpy_helper.from_array(weight.astype(np.float32), f"{name}_w"))
    k = weight.shape[-1]
    return helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, pads=[k // 2] * 4, kernel_shape=[k, k], group=group)


def _save(nodes: list, inits: list, output: tuple[str, list], path: Path, inputs: tuple[str, list]) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(inputs[0], TensorProto.FLOAT, inputs[1])],
                              [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def depthwise_amplifier(path: Path) -> Path:
    """conv0 -> Relu -> spread (one loud channel, three near-silent ones) -> Relu -> depthwise (scales the silent
    channels up 300x, as a folded BatchNorm does) -> Relu -> pointwise: PP-LCNet's stem and first block."""
    rng = np.random.default_rng(3)
    inits: list = []
    spread = np.abs(rng.normal(0, 0.3, (8, 8, 3, 3)))
    gains = np.array([20.0, 0.004, 0.004, 0.004, 1.0, 1.0, 1.0, 1.0])
    depthwise = np.abs(rng.normal(0, 0.3, (8, 1, 3, 3))) / gains[:, None, None, None] * 1.5
    nodes = [_conv("conv0", rng.normal(0, 0.3, (8, 3, 3, 3)), inits, "image", "c0"), helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             _conv("spread", spread * gains[:, None, None, None], inits, "r0", "c1"), helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             _conv("depthwise", depthwise, inits, "r1", "c2", group=8), helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             _conv("pointwise", rng.normal(0, 0.3, (8, 8, 1, 1)), inits, "r2", "features")]
    return _save(nodes, inits, ("features", ["N", 8, 12, 12]), path, ("image", ["N", 3, 12, 12]))


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_a_convolution_that_scales_up_channels_rounding_erases_stays_float_with_its_feed(tmp_path):
    rng = np.random.default_rng(4)
    batches = [{"image": rng.normal(0, 1, (2, 3, 12, 12)).astype(np.float32)} for _ in range(3)]
    fp32 = depthwise_amplifier(tmp_path / "fp32.onnx")
    result = quantize_model(fp32, tmp_path / "int8.onnx", QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                            Precision.INT8, batches, tmp_path, cache_dir=tmp_path / "cache")
    excluded = result.plan.excluded
    assert "of its output channels (each over 30% error: small input channels it scales up); kept float" in excluded["depthwise"]
    assert excluded["spread"] == excluded["relu1"] == "computes 'r1', whose small channels 'depthwise' scales up: kept float with it"
    assert "pointwise" not in excluded and "conv0" not in excluded
    # the silent channels survive: every output channel stays close to FP32's (without the rule: cosine 0.29 and 0.70)
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node), "the rest is quantized"
    feeds = {"image": rng.normal(0, 1, (2, 3, 12, 12)).astype(np.float32)}
    want, got = _run(fp32, feeds), _run(tmp_path / "int8.onnx", feeds)
    for channel in range(want.shape[1]):
        a, b = want[:, channel].ravel(), got[:, channel].ravel()
        assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) > 0.98, channel


def yolo_like_head(path: Path) -> Path:
    """trunk -> {box conv (4x4 bins), class conv (3)} -> Concat -> Reshape -> Split -> boxes: Softmax over bins ->
    DFL Conv (fixed 0..3 weights); scores: Sigmoid -> Concat: one [N, 7, anchors] output, as Ultralytics exports it."""
    rng = np.random.default_rng(5)
    inits: list = [numpy_helper.from_array(np.array([0, 19, -1], np.int64), "flat"), numpy_helper.from_array(np.array([16, 3], np.int64), "parts"),
                   numpy_helper.from_array(np.array([0, 4, 4, -1], np.int64), "bins"), numpy_helper.from_array(np.array([0, 4, -1], np.int64), "box4")]
    nodes = [_conv("trunk", rng.normal(0, 0.3, (8, 4, 3, 3)), inits, "x", "t"), helper.make_node("Relu", ["t"], ["h"], name="act"),
             _conv("box_head", rng.normal(0, 0.3, (16, 8, 1, 1)), inits, "h", "box"), _conv("cls_head", rng.normal(0, 0.3, (3, 8, 1, 1)), inits, "h", "cls"),
             helper.make_node("Concat", ["box", "cls"], ["joined"], name="join", axis=1),
             helper.make_node("Reshape", ["joined", "flat"], ["flat_out"], name="flatten"),
             helper.make_node("Split", ["flat_out", "parts"], ["dist", "logits"], name="split", axis=1),
             helper.make_node("Reshape", ["dist", "bins"], ["dist4"], name="to_bins"),
             helper.make_node("Transpose", ["dist4"], ["bins_first"], name="bins_first", perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["bins_first"], ["prob"], name="softmax", axis=1),
             _conv("dfl", np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1), inits, "prob", "dfl_out"),
             helper.make_node("Reshape", ["dfl_out", "box4"], ["boxes"], name="boxes"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="scores"),
             helper.make_node("Concat", ["boxes", "scores"], ["output0"], name="detections", axis=1)]
    return _save(nodes, inits, ("output0", ["N", 7, "A"]), path, ("x", ["N", 4, 6, 6]))


def test_a_yolo_head_split_between_its_convolutions_and_the_output_stays_float(tmp_path):
    from edgekit.quantize.ort.static_plan import mixed_output_heads

    fp32 = yolo_like_head(tmp_path / "fp32.onnx")
    feeds = {"x": np.random.default_rng(6).normal(0, 1, (2, 4, 6, 6)).astype(np.float32)}
    assert _run(fp32, feeds).shape == (2, 7, 36)
    heads = mixed_output_heads(fp32)
    assert set(heads) == {"box_head", "cls_head", "dfl"}
    assert "output head of 'output0' (Conv), which concatenates 3 heads of different ranges (boxes beside scores): kept float" == heads["cls_head"]
