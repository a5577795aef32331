"""The separable-CNN rule of :mod:`edgekit.quantize.thin_convs`: on a small MobileNetV3-style graph (HardSwish
stem, depthwise Convs, squeeze-excite gate, pointwise and dense Convs), which nodes each threshold keeps float,
that the written static int8 graph keeps those float and ONNX Runtime runs it close to FP32, and where
``auto`` lists the candidates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize import cnn_folding, thin_convs
from edgekit.quantize.ort.graph_files import preprocess
from edgekit.quantize.ort.static_plan import static_int8_plan
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.ort.candidates import FLOAT_REWRITES, FP32_REWRITTEN, with_thin_conv_candidates
from edgekit.quantize.plan import make_plan
from edgekit.quantize.stage import quantize_model
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


def _conv(rng: np.random.Generator, name: str, cin: int, cout: int, k: int, inits: list, x: str, y: str, group: int = 1) -> object:
    inits.append(numpy_helper.from_array(rng.normal(0, 0.4, (cout, cin // group, k, k)).astype(np.float32), f"{name}_w"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"{name}_b"))
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, pads=[k // 2] * 4, kernel_shape=[k, k], group=group)


def _hardswish(name: str, x: str, y: str) -> list:
    return [helper.make_node("HardSigmoid", [x], [f"{name}_gate"], name=f"{name}_hsig", alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", [x, f"{name}_gate"], [y], name=f"{name}_mul")]


def _save(path: Path, name: str, nodes: list, inits: list, output: object) -> Path:
    """``nodes`` as an opset-17 model with one ``image`` input [N, 3, 16, 16] and ``output``, saved at ``path``."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 16, 16])], [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def separable_cnn(path: Path) -> Path:
    """Multiply-adds per output element in brackets: stem 3x3 (27) -> HardSwish -> expand 1x1 (16) -> HardSwish
    -> dw1 3x3 depthwise (9) -> HardSwish -> squeeze-excite (se_reduce 1x1 (96), Relu, se_expand 1x1 (24),
    HardSigmoid, Mul) -> project 1x1 (96) -> dw2 3x3 depthwise (9) -> Relu -> pw2 1x1 (32) -> Relu -> dense 3x3
    (576) -> GlobalAveragePool -> Flatten -> Gemm (4 classes)."""
    rng = np.random.default_rng(0)
    inits: list = []
    nodes = [_conv(rng, "stem", 3, 16, 3, inits, "image", "s"), *_hardswish("stem_act", "s", "s_act"),
             _conv(rng, "expand", 16, 96, 1, inits, "s_act", "e"), *_hardswish("expand_act", "e", "e_act"),
             _conv(rng, "dw1", 96, 96, 3, inits, "e_act", "d1", group=96), *_hardswish("dw1_act", "d1", "d1_act"),
             helper.make_node("GlobalAveragePool", ["d1_act"], ["pooled"], name="se_pool"),
             _conv(rng, "se_reduce", 96, 24, 1, inits, "pooled", "se_r"),
             helper.make_node("Relu", ["se_r"], ["se_rr"], name="se_relu"),
             _conv(rng, "se_expand", 24, 96, 1, inits, "se_rr", "se_e"),
             helper.make_node("HardSigmoid", ["se_e"], ["se_gate"], name="se_hsig", alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["d1_act", "se_gate"], ["excited"], name="se_mul"),
             _conv(rng, "project", 96, 32, 1, inits, "excited", "p"),
             _conv(rng, "dw2", 32, 32, 3, inits, "p", "d2", group=32),
             helper.make_node("Relu", ["d2"], ["d2_act"], name="dw2_relu"),
             _conv(rng, "pw2", 32, 64, 1, inits, "d2_act", "p2"),
             helper.make_node("Relu", ["p2"], ["p2_act"], name="pw2_relu"),
             _conv(rng, "dense", 64, 64, 3, inits, "p2_act", "x"),
             helper.make_node("Relu", ["x"], ["x_act"], name="dense_relu"),
             helper.make_node("GlobalAveragePool", ["x_act"], ["features"], name="pool"),
             helper.make_node("Flatten", ["features"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    inits += [numpy_helper.from_array(rng.normal(0, 0.3, (4, 64)).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(4, np.float32), "fc_b")]
    return _save(path, "separable", nodes, inits, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4]))


def convnext_like(path: Path) -> Path:
    """A depthwise 7x7 Conv whose output goes to a Transpose and a MatMul (ConvNeXt's block), no 1x1 Conv."""
    rng = np.random.default_rng(1)
    inits: list = []
    nodes = [_conv(rng, "stem", 3, 16, 3, inits, "image", "s"),
             _conv(rng, "dw", 16, 16, 7, inits, "s", "d", group=16),
             helper.make_node("Transpose", ["d"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "mlp_w"], ["out"], name="mlp")]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (16, 8)).astype(np.float32), "mlp_w"))
    return _save(path, "convnext", nodes, inits, helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 16, 16, 8]))


def mobilenet_v2_like(path: Path) -> Path:
    """expand 1x1 -> ReLU6 -> depthwise 3x3 -> ReLU6 -> project 1x1: separable, but no HardSigmoid gate."""
    rng = np.random.default_rng(3)
    inits: list = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [_conv(rng, "expand", 3, 32, 1, inits, "image", "e"), helper.make_node("Clip", ["e", "zero", "six"], ["e6"], name="relu6_a"),
             _conv(rng, "dw", 32, 32, 3, inits, "e6", "d", group=32), helper.make_node("Clip", ["d", "zero", "six"], ["d6"], name="relu6_b"),
             _conv(rng, "project", 32, 16, 1, inits, "d6", "out")]
    return _save(path, "mobilenet_v2", nodes, inits, helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 16, 16, 16]))


def _batches(count: int, seed: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(0, 1, (4, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


def _static_plan(model_path: Path):
    return static_int8_plan(make_plan(QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME,
                                                  Precision.INT8), model_path)


#: Kept float at 64: the Convs under 64 multiply-adds per output element, the HardSigmoids of their HardSwish
#: (se_hsig reads se_expand) and every HardSigmoid-gated Mul.
UNDER_64 = {"stem", "expand", "dw1", "se_expand", "dw2", "pw2", "stem_act_hsig", "expand_act_hsig", "dw1_act_hsig", "se_hsig",
            "stem_act_mul", "expand_act_mul", "dw1_act_mul", "se_mul"}


def test_each_threshold_keeps_the_thin_convs_their_hardsigmoids_and_the_gated_muls_float(tmp_path: Path) -> None:
    model = separable_cnn(tmp_path / "separable.onnx")
    under_64 = thin_convs.thin_float_nodes(model, 64)
    under_256 = thin_convs.thin_float_nodes(model, 256)

    assert set(under_64) == UNDER_64
    assert set(under_256) == UNDER_64 | {"se_reduce", "project"}  # 96 multiply-adds each
    assert "dense" not in under_256 and "fc" not in under_256  # 576: int8 at both
    assert under_64["dw1"].startswith("depthwise Conv with 9 multiply-adds per output element (< 64)")
    assert under_256["project"].startswith("Conv with 96 multiply-adds per output element (< 256)")
    assert "fused into the float Conv" in under_64["dw1_act_hsig"]
    assert "no integer HardSigmoid" in under_64["se_mul"]


@pytest.mark.parametrize("build", [convnext_like, mobilenet_v2_like], ids=["no-separable-block", "no-hardsigmoid-gate"])
def test_a_graph_without_separable_blocks_or_hardsigmoid_gates_keeps_its_plan(tmp_path: Path, build) -> None:
    model = build(tmp_path / "model.onnx")
    plan = _static_plan(model)

    assert thin_convs.thin_float_nodes(model, 256) == {}
    assert thin_convs.keep_thin_convs_float(model, plan, 256) is plan


def test_the_written_graph_keeps_the_rules_nodes_float_and_onnx_runtime_runs_it_close_to_fp32(tmp_path: Path) -> None:
    fp32 = separable_cnn(tmp_path / "separable.onnx")
    pre, _ = cnn_folding.fold_for_int8(preprocess(fp32, tmp_path / "pre.onnx"), tmp_path / "folded.onnx")
    plan = thin_convs.keep_thin_convs_float(pre, _static_plan(pre), 64)
    out = tmp_path / "int8-thin-convs-float-64.onnx"
    quantize_model(fp32, out, QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8,
                   _batches(4), tmp_path, plan=plan, cache_dir=tmp_path / "cache")

    assert "6 Conv(s) under 64 multiply-adds per output element" in plan.notes[-1]
    graph = onnx.load(str(out)).graph
    producers = {o: n for n in graph.node for o in n.output}
    dequantized = {n.name for n in graph.node if n.op_type == "Conv" and producers.get(n.input[1]) is not None
                   and producers[n.input[1]].op_type == "DequantizeLinear"}
    assert dequantized == {"se_reduce", "project", "dense"}  # int8 weights; every other Conv's are float
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
    qlinear = {n.name.split("_token")[0] for n in optimized if n.op_type == "QLinearConv"}
    assert {"se_reduce", "project", "dense"} <= qlinear
    assert {"dw1", "expand"}.isdisjoint(qlinear)  # float, HardSwish fused (NCHWc Convs named after their outputs)
    assert "QLinearMul" not in [n.op_type for n in optimized]  # the HardSwish and squeeze-excite products run in float

    reference = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    feeds = _batches(1, seed=7)[0]
    got, want = session.run(None, feeds)[0], reference.run(None, feeds)[0]
    cosine = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.99, cosine


def test_auto_lists_a_candidate_per_threshold_after_the_float_rewrite_one_with_the_kept_reasons(tmp_path: Path) -> None:
    model = separable_cnn(tmp_path / "separable.onnx")
    base = _static_plan(model)
    listed = [Candidate("int8-static", Precision.INT8, base), Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES),
              Candidate("fp32", Precision.FP32, None)]

    out = with_thin_conv_candidates(listed, base, model)

    assert [c.name for c in out] == ["int8-static", FP32_REWRITTEN, *map(thin_convs.candidate_name, thin_convs.THRESHOLDS), "fp32"]
    assert thin_convs.candidate_name(64) == "int8-thin-convs-float-64"
    for candidate, min_macs in zip(out[2:-1], thin_convs.THRESHOLDS, strict=True):
        assert candidate.precision is Precision.INT8 and candidate.plan is not None
        assert dict(candidate.kept) == thin_convs.thin_float_nodes(model, min_macs)
        assert set(candidate.plan.excluded) == set(base.excluded) | set(candidate.kept)
    convnext = convnext_like(tmp_path / "convnext.onnx")
    assert with_thin_conv_candidates(listed, _static_plan(convnext), convnext) == listed
