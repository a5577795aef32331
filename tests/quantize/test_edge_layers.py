"""The edge-layers rule of :mod:`edgekit.quantize.edge_layers` (the quantizable layers nearest the inputs and the
outputs float) on small real graphs: a detector-like CNN with two head branches and a wav2vec2-like MLP with an
attention product; where ``auto`` lists its candidates; and the time budget pricing a ladder by its sensitivity runs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize import edge_layers
from edgekit.quantize.ort.dynamic import write_dynamic
from edgekit.quantize.ort.static_plan import static_int8_plan
from edgekit.quantize.candidates import FLOAT, STATIC, Candidate, CandidateLadder
from edgekit.quantize.ort.candidates import FLOAT_REWRITES, FP32_REWRITTEN, with_edge_candidates
from edgekit.quantize.ort.planner import sensitivity_analysis_runs
from edgekit.quantize.plan import make_plan
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target
from tests.quantize.test_auto import Accuracy, Scripted, other, static
from tests.quantize.test_thin_convs import _conv


def _save(path: Path, nodes: list, inits: list, inputs: list, outputs: list) -> Path:
    model = helper.make_model(helper.make_graph(nodes, path.stem, inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def detector(path: Path) -> Path:
    """stem -> c1 -> c2 (trunk), then two head branches to two outputs: box_a -> box_b (boxes) and cls_a -> cls_b ->
    Sigmoid (scores)."""
    rng = np.random.default_rng(0)
    inits: list = []
    nodes = [_conv(rng, "stem", 3, 8, 3, inits, "image", "s"), helper.make_node("Relu", ["s"], ["s_act"], name="stem_relu"),
             _conv(rng, "c1", 8, 16, 3, inits, "s_act", "x1"), helper.make_node("Relu", ["x1"], ["x1_act"], name="c1_relu"),
             _conv(rng, "c2", 16, 16, 3, inits, "x1_act", "x2"), helper.make_node("Relu", ["x2"], ["trunk"], name="c2_relu"),
             _conv(rng, "box_a", 16, 16, 3, inits, "trunk", "b1"), helper.make_node("Relu", ["b1"], ["b1_act"], name="box_relu"),
             _conv(rng, "box_b", 16, 4, 1, inits, "b1_act", "boxes"),
             _conv(rng, "cls_a", 16, 16, 3, inits, "trunk", "k1"), helper.make_node("Relu", ["k1"], ["k1_act"], name="cls_relu"),
             _conv(rng, "cls_b", 16, 2, 1, inits, "k1_act", "logits"), helper.make_node("Sigmoid", ["logits"], ["scores"], name="cls_sigmoid")]
    return _save(path, nodes, inits, [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 16, 16])],
                 [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4, 16, 16]),
                  helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2, 16, 16])])


def speech_mlp(path: Path) -> Path:
    """projection -> q, k (MatMuls with weights) -> q @ k^T (no constant weight: not a layer the rule counts) -> ffn
    -> ffn_out -> head, on [N, T, 16] features."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
             for name, shape in (("proj_w", (16, 32)), ("q_w", (32, 32)), ("k_w", (32, 32)), ("ffn_w", (32, 32)), ("ffn_out_w", (32, 32)),
                                 ("head_w", (32, 8)))]
    nodes = [helper.make_node("MatMul", ["features", "proj_w"], ["h"], name="projection"),
             helper.make_node("MatMul", ["h", "q_w"], ["q"], name="q"), helper.make_node("MatMul", ["h", "k_w"], ["k"], name="k"),
             helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="attention_scores"),
             helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["probs", "h"], ["context"], name="attention_context"),
             helper.make_node("MatMul", ["context", "ffn_w"], ["f"], name="ffn"), helper.make_node("Relu", ["f"], ["f_act"], name="ffn_relu"),
             helper.make_node("MatMul", ["f_act", "ffn_out_w"], ["f_out"], name="ffn_out"),
             helper.make_node("Add", ["f_out", "context"], ["residual"], name="residual"),
             helper.make_node("MatMul", ["residual", "head_w"], ["ctc_logits"], name="head")]
    return _save(path, nodes, inits, [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 6, 16])],
                 [helper.make_tensor_value_info("ctc_logits", TensorProto.FLOAT, ["N", 6, 8])])


def _plan(precision: Precision, model: Path | None = None):
    plan = make_plan(QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, precision)
    return static_int8_plan(plan, model) if model is not None else plan


def test_depth_one_keeps_the_first_layer_and_the_last_layer_of_every_head_branch(tmp_path: Path) -> None:
    model = detector(tmp_path / "detector.onnx")
    graph = onnx.load(str(model)).graph
    plan = _plan(Precision.INT8)

    one = edge_layers.edge_float_nodes(graph, plan, 1)
    two = edge_layers.edge_float_nodes(graph, plan, 2)

    assert set(one) == {"stem", "box_b", "cls_b"}
    assert set(two) == {"stem", "c1", "box_a", "box_b", "cls_a", "cls_b"}  # c2, the trunk's last layer, stays int8
    assert "first 1 quantizable layer(s) from the graph inputs" in one["stem"]
    assert "last 1 quantizable layer(s) before the graph outputs" in one["cls_b"]


def test_matmuls_without_a_constant_weight_do_not_count_and_int8_dynamic_keeps_the_projection_and_the_head(tmp_path: Path) -> None:
    model = speech_mlp(tmp_path / "speech.onnx")
    plan = _plan(Precision.INT8_DYNAMIC)

    kept = edge_layers.keep_edges_float(model, plan, 1)

    assert edge_layers.quantizable_nodes(onnx.load(str(model)).graph, plan) == {"projection", "q", "k", "ffn", "ffn_out", "head"}
    assert set(kept.excluded) == {"projection", "head"}
    assert "2 quantizable node(s) within 1 layer(s)" in kept.notes[-1]
    written = write_dynamic(model, tmp_path / "dynamic.onnx", kept)
    graph = onnx.load(str(written)).graph
    float_matmuls = {node.name for node in graph.node if node.op_type == "MatMul"}
    assert {"projection", "head"} <= float_matmuls and not {"q", "k", "ffn", "ffn_out"} & float_matmuls
    feeds = {"features": np.random.default_rng(3).normal(0, 1, (2, 6, 16)).astype(np.float32)}
    got = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want))) > 0.99


def test_a_plan_that_would_keep_every_layer_float_or_none_is_returned_unchanged(tmp_path: Path) -> None:
    model = detector(tmp_path / "detector.onnx")
    plan = _plan(Precision.INT8)

    assert edge_layers.keep_edges_float(model, plan, 3) is plan  # depth 3 reaches every Conv: nothing int8 would be left
    assert edge_layers.keep_edges_float(model, plan.excluding({n: "recipe" for n in ("stem", "c1", "c2", "box_a", "box_b", "cls_a", "cls_b")}), 1) \
        .excluded.keys() == {"stem", "c1", "c2", "box_a", "box_b", "cls_a", "cls_b"}
    with pytest.raises(ValueError, match="at least 1"):
        edge_layers.keep_edges_float(model, plan, 0)


def test_auto_lists_each_edge_candidate_after_its_base_and_it_dominates_its_base(tmp_path: Path) -> None:
    model = speech_mlp(tmp_path / "speech.onnx")
    static_plan, dynamic_plan = _plan(Precision.INT8, model), _plan(Precision.INT8_DYNAMIC)
    names = ("projection", "q", "k", "ffn", "ffn_out", "head")
    base = Candidate("int8-static", Precision.INT8, static_plan, levels={n: STATIC for n in names})
    dynamic = Candidate("int8-dynamic", Precision.INT8_DYNAMIC, dynamic_plan, levels={n: 1 for n in names})
    listed = [base, Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES), Candidate("int8-thin-convs-float-64", Precision.INT8, static_plan),
              dynamic, Candidate("int8-ort-default", Precision.INT8, static_plan, "ort-default"), CandidateLadder("int8-static+float", base=base),
              Candidate("fp32", Precision.FP32, None)]

    out = with_edge_candidates(listed, model)

    assert [c.name for c in out] == ["int8-static", FP32_REWRITTEN, "int8-thin-convs-float-64", "int8-static+edges-float-1", "int8-dynamic",
                                     "int8-dynamic+edges-float-1", "int8-ort-default", "int8-static+float", "fp32"]
    edge_static, edge_dynamic = out[3], out[5]
    assert isinstance(edge_static, Candidate) and isinstance(edge_dynamic, Candidate)
    assert set(edge_dynamic.kept) == {"projection", "head"} and edge_dynamic.levels["head"] == FLOAT and edge_dynamic.levels["q"] == 1
    assert edge_static.dominates(base) and edge_dynamic.dominates(dynamic) and not base.dominates(edge_static)
    assert edge_static.plan is not None and {"projection", "head"} <= set(edge_static.plan.excluded)


def test_an_edge_candidate_is_skipped_unbuilt_when_its_base_passed_and_tried_when_it_failed(tmp_path: Path) -> None:
    edge = static("edges", {"n0": FLOAT, "n1": STATIC, "n2": STATIC, "n3": FLOAT})
    engine = Scripted(tmp_path, {"a": 0.995, "edges": 0.995, "fp32": 1.0}, {"a": 60, "edges": 70, "fp32": 100})
    passed = engine.search([static("a"), edge, other("fp32", Precision.FP32)])
    assert {row.name: row.status for row in passed.table}["edges"] == "skipped" and engine.built == ["a"]

    engine = Scripted(tmp_path, {"a": 0.9, "edges": 0.995, "fp32": 1.0}, {"a": 60, "edges": 70, "fp32": 100})
    failed = engine.search([static("a"), edge, other("fp32", Precision.FP32)])
    assert failed.chosen.name == "edges" and engine.built == ["a", "edges"]


def test_sensitivity_runs_are_the_reference_plus_a_run_per_group_and_two_on_the_batches_left() -> None:
    assert sensitivity_analysis_runs(57, 4) == 4 + 59 * 2  # YOLOv8n: 128 // 59 = 2 batches per configuration
    assert sensitivity_analysis_runs(14, 4) == 4 + 16 * 4
    assert sensitivity_analysis_runs(200, 4) == 4 + 202  # at least one batch
    assert sensitivity_analysis_runs(0, 4) == 0


class SlowEvaluation(Scripted):
    evaluate_s = 0.1

    def evaluate(self, path: Path) -> Accuracy:
        time.sleep(self.evaluate_s)
        return super().evaluate(path)


def test_a_ladder_is_priced_by_its_sensitivity_runs_at_the_first_evaluations_seconds_per_batch(tmp_path: Path) -> None:
    """The first evaluation takes 0.1 s for 4 batches (0.025 s a batch): a ranking of 200 runs is priced ~5 s and skipped
    inside a ~1 s budget; one already ranked (0 runs) is priced at a cheap step and tried."""
    values, latency = {"a": 0.9, "top1": 0.995, "fp32": 1.0}, {"a": 60, "top1": 70, "fp32": 100}
    step = static("top1", {"n0": FLOAT, "n1": STATIC, "n2": STATIC, "n3": STATIC})
    base = static("a")

    def search(runs: int):  # type: ignore[no-untyped-def]
        engine = SlowEvaluation(tmp_path, values, latency)
        ladder = CandidateLadder("a+float", base=base, expand=lambda: (step,), analysis_runs=lambda: runs)
        return engine.search([base, ladder, other("fp32", Precision.FP32)], time_budget_s=1.0, evaluation_batches=4)

    costly = {row.name: row for row in search(200).table}
    assert costly["a+float"].status == "skipped" and "time budget would overrun" in costly["a+float"].detail
    expected = float(costly["a+float"].detail.split("about ")[1].split(" s")[0])
    # priced from the measured first evaluation: a busy host only stretches the 0.1 s sleep (never below 5 s of runs)
    assert 4.5 <= expected <= 15.0, costly["a+float"].detail
    ranked = search(0)
    assert ranked.chosen.name == "top1"
