"""``--precision auto``: candidate lists, the early-stop search rule, refusal, serialisation, and one run
end to end on a tiny model with real ONNX Runtime builds and evaluations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.errors import QuantizationError
from edgekit.evaluate.metrics import METRICS
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.static_plan import calibration_tensors
from edgekit.quantize.ort.static_qdq import write_static_qdq
from edgekit.quantize.auto import AutoSearchError, search_auto
from edgekit.quantize.candidates import DYNAMIC, FLOAT, STATIC, BuiltCandidate, Candidate, CandidateLadder, auto_candidates
from edgekit.engines.fusion import transformer_fusion
from edgekit.quantize.ort.candidates import with_plain_candidates
from edgekit.quantize.ort.judges import MetricSpec, OrtInterleavedTimer, OrtMetricEvaluator
from edgekit.quantize.ort.planner import plan_auto_onnxruntime
from edgekit.quantize.ort.sessions import ort_session
from edgekit.quantize.calibration import CalibratorSpec
from edgekit.quantize.gating import supported_precisions
from edgekit.quantize.node_groups import NodeGroup
from edgekit.quantize.ort.static_plan import float_output_op_types
from edgekit.quantize.plan import QuantizationPlan
from edgekit.quantize.sensitivity import GroupSensitivity, SensitivityReport
from edgekit.recipe import AccuracyBudget, QuantizationSpec
from edgekit.target import get_target
from tests.quantize.test_sensitivity import batches, outlier_model, static_plan

NODES = ("n0", "n1", "n2", "n3")


# ---------------------------------------------------------------- a scripted engine


@dataclass
class Scripted:
    """Real files in tmp_path; accuracy and latency looked up by candidate name (reference: 100 ms)."""

    root: Path
    values: dict[str, float]
    latency_ms: dict[str, float]
    budget: float = 0.99

    def __post_init__(self) -> None:
        self.built: list[str] = []
        self.evaluated: list[str] = []
        self.reference = self.root / "fp32-reference.onnx"
        self.reference.write_bytes(b"reference")

    def build(self, candidate: Candidate) -> BuiltCandidate:
        if candidate.name not in self.values and candidate.name not in self.latency_ms:
            raise QuantizationError(f"cannot write {candidate.name}")
        self.built.append(candidate.name)
        path = self.root / f"{candidate.name}.onnx"
        path.write_bytes(candidate.name.encode())
        return BuiltCandidate(path, {})

    def evaluate(self, path: Path) -> "Accuracy":
        name = path.read_bytes().decode()
        self.evaluated.append(name)
        value = self.values[name]
        return Accuracy(value, value >= self.budget, value - 0.01)

    def time_models(self, paths: Sequence[Path]) -> list[float]:
        return [100.0 if p == self.reference else self.latency_ms[p.read_bytes().decode()] for p in paths]

    def search(self, candidates: Sequence[Candidate | CandidateLadder], **kwargs: object):  # type: ignore[no-untyped-def]
        return search_auto(candidates, build=self.build, evaluate=self.evaluate, time_models=self.time_models, reference=self.reference,
                           metric_name="cosine", budget_text="min_value 0.99", **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Accuracy:
    value: float
    passed: bool
    cosine_min: float | None


def plan(**changes: object) -> QuantizationPlan:
    return static_plan(**changes)


def static(name: str, levels: dict[str, int] | None = None) -> Candidate:
    levels = levels or {n: STATIC for n in NODES}
    kept = {n: f"level {lv}" for n, lv in levels.items() if lv != STATIC}
    return Candidate(name, Precision.INT8, plan(), kept=kept, levels=levels)


def kept_top(k: int, level: int) -> Candidate:
    return static(f"top{k}", {n: (level if i < k else STATIC) for i, n in enumerate(NODES)})


def other(name: str, precision: Precision) -> Candidate:
    return Candidate(name, precision, None)


# ---------------------------------------------------------------- the search rule


def test_chooses_the_faster_candidate_inside_the_budget(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.95, "dynamic": 0.993, "fp16": 0.9999}, {"static": 40, "dynamic": 60, "fp16": 90})
    dynamic = Candidate("dynamic", Precision.INT8_DYNAMIC, plan(), levels={n: DYNAMIC for n in NODES})
    result = engine.search([static("static"), dynamic, other("fp16", Precision.FP16), other("fp32", Precision.FP32)])
    assert result.chosen.name == "dynamic" and result.model_path.name == "dynamic.onnx"
    rows = {row.name: row for row in result.table}
    assert rows["static"].status == "failed" and rows["static"].latency_ratio == pytest.approx(0.40)  # failed, still timed
    assert rows["dynamic"].status == "chosen" and rows["dynamic"].value == 0.993 and rows["dynamic"].passed
    # 0.90x: within twice the best's 0.60x, so evaluated for the run-off (by rank, issue 29), where it lost
    assert rows["fp16"].status == "passed" and rows["fp16"].latency_ratio == pytest.approx(0.90) and "run-off: lost" in rows["fp16"].detail
    assert engine.evaluated.count("fp16") == 1  # slower than the best: timed, evaluated only for the run-off
    assert rows["fp32"].status == "skipped" and "is the reference" in rows["fp32"].detail and "fp32" not in engine.built
    assert result.chosen_result.latency_ratio == pytest.approx(0.60)


def test_a_later_candidate_that_is_faster_replaces_the_first_pass(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"dynamic": 0.993, "int4": 0.995}, {"dynamic": 60, "int4": 40})
    result = engine.search([Candidate("dynamic", Precision.INT8_DYNAMIC, plan()), other("int4", Precision.INT4)])
    assert result.chosen.name == "int4"
    assert [row.status for row in result.table] == ["passed", "chosen"]


def test_dominated_candidates_are_skipped_unbuilt(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.995}, {"static": 40})
    ladder = CandidateLadder("float", tuple(kept_top(k, FLOAT) for k in (1, 2)))
    dynamic = Candidate("dynamic", Precision.INT8_DYNAMIC, plan(), levels={n: DYNAMIC for n in NODES})
    result = engine.search([static("static"), ladder, dynamic])
    assert engine.built == ["static"]
    assert [(row.name, row.status) for row in result.table] == [("static", "chosen"), ("top1", "skipped"), ("dynamic", "skipped")]
    assert "runs every node at the precision of static (0.400x) or higher" in result.table[1].detail


def test_a_different_scheme_is_not_dominated(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.995, "fused": 0.995}, {"static": 50, "fused": 30})
    fused = replace(static("fused"), graph="transformer-fusion")
    result = engine.search([static("static"), fused])
    assert result.chosen.name == "fused" and engine.built == ["static", "fused"]


def test_ladder_gallops_then_bisects_to_the_smallest_passing_k(tmp_path: Path) -> None:
    steps = tuple(replace(kept_top(min(k, 4), FLOAT), name=f"top{k}", levels={**{f"m{i}": FLOAT for i in range(k)}, **{f"m{i}": STATIC for i in range(k, 8)}})
                  for k in range(1, 9))
    values = {f"top{k}": (0.995 if k >= 5 else 0.98) for k in range(1, 9)}
    latency = {f"top{k}": 50.0 + 5 * k for k in range(1, 9)}
    engine = Scripted(tmp_path, values, latency)
    result = engine.search([CandidateLadder("float", steps)])
    assert engine.evaluated == ["top1", "top2", "top4", "top8", "top6", "top5"]
    assert result.chosen.name == "top5"


def test_ladder_stops_when_a_step_is_slower_than_the_best(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"dynamic": 0.995, "top1": 0.995}, {"dynamic": 50, "top1": 70, "top2": 80})
    dynamic = Candidate("dynamic", Precision.INT8_DYNAMIC, plan())  # no levels: not comparable, so the ladder is tried
    result = engine.search([dynamic, CandidateLadder("float", (kept_top(1, FLOAT), kept_top(2, FLOAT)))])
    # top1 (1.4x the best) stops the ladder, then goes to the run-off by rank (issue 29) and loses it
    assert [(row.name, row.status) for row in result.table] == [("dynamic", "chosen"), ("top1", "passed")]


def test_build_errors_are_rows_and_the_search_goes_on(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"dynamic": 0.995}, {"dynamic": 60})
    result = engine.search([other("broken", Precision.INT4), Candidate("dynamic", Precision.INT8_DYNAMIC, plan())])
    assert result.table[0].status == "error" and result.table[0].detail == "build failed: cannot write broken"
    assert result.chosen.name == "dynamic"


def test_refuses_with_the_numbers_of_the_closest_candidate(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.95, "dynamic": 0.985, "fp16": 0.97}, {"static": 40, "dynamic": 60, "fp16": 90})
    with pytest.raises(AutoSearchError) as info:
        engine.search([static("static"), Candidate("dynamic", Precision.INT8_DYNAMIC, plan()), other("fp16", Precision.FP16)])
    error = info.value
    assert "none of the 3 candidates tried meets min_value 0.99" in error.message
    assert "closest: dynamic with cosine 0.985, cosine min 0.975 (0.600x FP32 latency)" in error.message
    assert "auto_max_excluded" in (error.hint or "")
    assert error.best is not None and error.best.name == "dynamic" and len(error.table) == 3
    assert isinstance(error, QuantizationError)


def test_refuses_when_nothing_could_even_be_built(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {}, {})
    with pytest.raises(AutoSearchError, match="no candidate could be built and evaluated: int4: build failed: cannot write int4"):
        engine.search([other("int4", Precision.INT4)])


def test_bad_search_arguments(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.995}, {"static": 40})
    with pytest.raises(QuantizationError, match="noise_margin must be in \\[0, 1\\), got 1.5"):
        engine.search([static("static")], noise_margin=1.5)
    with pytest.raises(QuantizationError, match="time_models returned \\[1.0\\] for 2 models"):
        search_auto([static("static")], build=engine.build, evaluate=engine.evaluate, time_models=lambda paths: [1.0], reference=engine.reference)


def test_result_serialises_for_the_manifest(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"top1": 0.995, "static": 0.9}, {"top1": 45, "static": 40})
    result = engine.search([static("static"), kept_top(1, DYNAMIC)], notes=("calibrator minmax",))
    data = json.loads(json.dumps(result.to_manifest()))
    assert data["chosen"] == "top1" and data["precision"] == "int8" and data["graph"] == "exported"
    assert data["kept_in_higher_precision"] == {"n0": "level 1"}
    assert [row["status"] for row in data["candidates"]] == ["failed", "chosen"]
    assert data["candidates"][1]["latency_ratio"] == pytest.approx(0.45)
    assert data["plan"]["float_outputs"] == ["MatMul"] and data["notes"] == ["calibrator minmax"]
    assert "noise margin 5%" in data["rule"]


# ---------------------------------------------------------------- candidate lists


def report(entries: Sequence[tuple[str, tuple[str, ...], float]]) -> SensitivityReport:
    groups = tuple(GroupSensitivity(name, nodes, 1.0 - loss, loss, rank) for rank, (name, nodes, loss) in enumerate(entries, start=1))
    return SensitivityReport("cosine", True, 1.0, 0.98, groups, batches=2, samples=16)


GROUPS = [NodeGroup("layer.0/attn.scores", ("scores",), ("MatMul",), 0, "attn.scores", 0),
          NodeGroup("layer.0/ffn.down", ("down",), ("MatMul",), 0, "ffn.down", 64),
          NodeGroup("layer.0/ffn.up", ("up",), ("MatMul",), 0, "ffn.up", 64)]
RANKING = report([("layer.0/attn.scores", ("scores",), 0.01), ("layer.0/ffn.down", ("down",), 0.004), ("layer.0/ffn.up", ("up",), 0.001)])


def test_candidates_come_in_expected_speed_order() -> None:
    supported = [Precision.FP32, Precision.FP16, Precision.INT8, Precision.INT8_DYNAMIC, Precision.INT4]
    items = auto_candidates(plan(), GROUPS, RANKING, supported, max_kept=2, dynamic_plan=plan(precision=Precision.INT8_DYNAMIC), int4_plan=plan(precision=Precision.INT4))
    assert [item.name for item in items] == ["int8-static", "int8-dynamic", "int8-static+dynamic", "int8-static+float", "int8-dynamic+float",
                                             "int4", "fp16", "fp32"]
    dynamic_ladder = items[2]
    assert isinstance(dynamic_ladder, CandidateLadder) and [s.name for s in dynamic_ladder.steps] == ["int8-static+dynamic-top1", "int8-static+dynamic-top2"]
    top2 = dynamic_ladder.steps[1]
    assert top2.plan is not None and top2.plan.dynamic_nodes == ("down",)
    assert set(top2.plan.excluded) == {"scores"}  # no constant weight: dynamic int8 cannot take it, so it stays float
    assert top2.kept["down"] == "sensitivity rank 2: cosine 0.996 when quantized (loss 0.004); runs in dynamic int8"
    assert top2.kept["scores"].startswith("sensitivity rank 1:") and top2.kept["scores"].endswith("runs in float")
    assert top2.levels == {"scores": FLOAT, "down": DYNAMIC, "up": STATIC}
    assert top2.dominates(items[0]) and not items[0].dominates(top2)  # type: ignore[arg-type]


def test_the_dynamic_ladder_keeps_the_most_sensitive_weighted_matmuls_float() -> None:
    """int8-dynamic with the k most sensitive MatMul/Gemm that it quantizes float (an activation x activation
    MatMul, 'scores', has no weight to quantize dynamically, so it is not a step)."""
    supported = [Precision.FP32, Precision.INT8, Precision.INT8_DYNAMIC]
    items = auto_candidates(plan(), GROUPS, RANKING, supported, max_kept=3, dynamic_plan=plan(precision=Precision.INT8_DYNAMIC))
    dynamic, ladder = items[1], items[-2]
    assert isinstance(dynamic, Candidate) and isinstance(ladder, CandidateLadder) and ladder.base == dynamic
    assert [step.name for step in ladder.steps] == ["int8-dynamic+float-top1", "int8-dynamic+float-top2"]
    top1, top2 = ladder.steps
    assert top1.precision is Precision.INT8_DYNAMIC and top1.plan is not None and set(top1.plan.excluded) == {"down"}
    assert top2.plan is not None and set(top2.plan.excluded) == {"down", "up"} and top2.levels == {"scores": FLOAT, "down": FLOAT, "up": FLOAT}
    assert top1.kept["down"] == "sensitivity rank 2: cosine 0.996 when quantized (loss 0.004); runs in float"
    assert top1.dominates(dynamic) and top2.dominates(top1) and not dynamic.dominates(top1)
    lazy = auto_candidates(plan(), GROUPS, lambda: RANKING, supported, max_kept=1, dynamic_plan=plan(precision=Precision.INT8_DYNAMIC))
    lazy_ladder = lazy[-2]
    assert isinstance(lazy_ladder, CandidateLadder) and [s.name for s in lazy_ladder.resolve()] == ["int8-dynamic+float-top1"]
    no_weights = [NodeGroup("scores", ("scores",), ("MatMul",), 0, "attn.scores", 0)]
    assert not any(item.name == "int8-dynamic+float" for item in auto_candidates(
        plan(), no_weights, RANKING, supported, max_kept=1, dynamic_plan=plan(precision=Precision.INT8_DYNAMIC)))


def test_targets_without_dynamic_int8_get_no_dynamic_candidates() -> None:
    items = auto_candidates(plan(), GROUPS, RANKING, [Precision.FP32, Precision.FP16, Precision.INT8], max_kept=1)
    assert [item.name for item in items] == ["int8-static", "int8-static+float", "fp16", "fp32"]
    fused = auto_candidates(plan(), GROUPS, RANKING, [Precision.INT8], max_kept=1, graph="transformer-fusion", dynamic_only={"attn": "Attention"})
    assert fused == []  # fused attention runs only as dynamic int8


def test_fused_graph_candidates_run_attention_dynamic() -> None:
    supported = [Precision.FP32, Precision.INT8, Precision.INT8_DYNAMIC]
    items = auto_candidates(plan(), GROUGS_FUSED, RANKING, supported, max_kept=1, graph="transformer-fusion", dynamic_only={"attn_0": "Attention"},
                            dynamic_plan=plan(precision=Precision.INT8_DYNAMIC), include_fallbacks=False)
    first = items[0]
    assert isinstance(first, Candidate) and first.name == "transformer-fusion:int8-static" and first.graph == "transformer-fusion"
    assert first.plan is not None and first.plan.dynamic_nodes == ("attn_0",) and "Attention" in first.plan.op_types
    assert "only dynamically" in first.kept["attn_0"]
    assert items[1].name == "transformer-fusion:int8-dynamic"
    ladder = items[2]
    assert isinstance(ladder, CandidateLadder) and ladder.steps[0].kept.keys() == {"attn_0", "down"}  # 'scores' is not in this graph


def test_plain_candidates_come_early_the_cheap_one_first() -> None:
    """The float-rewrite FP32 (no calibration) follows the first graph's static int8; ONNX Runtime's default plan
    (its own calibration) follows that graph's int8-dynamic; both come before the ladders, whose sensitivity
    run costs the most."""
    supported = [Precision.FP32, Precision.INT8, Precision.INT8_DYNAMIC]
    items = auto_candidates(plan(), GROUPS, RANKING, supported, max_kept=1, dynamic_plan=plan(precision=Precision.INT8_DYNAMIC))
    names = [item.name for item in with_plain_candidates(items, plan(), supported)]
    assert names == ["int8-static", "fp32-rewritten", "int8-dynamic", "int8-ort-default", "int8-static+dynamic", "int8-static+float",
                     "int8-dynamic+float", "fp32"]
    static_only = auto_candidates(plan(), GROUPS, RANKING, [Precision.FP32, Precision.INT8], max_kept=1)
    assert [item.name for item in with_plain_candidates(static_only, plan(), [Precision.FP32, Precision.INT8])] == [
        "int8-static", "fp32-rewritten", "int8-ort-default", "int8-static+float", "fp32"]
    # a convolutional graph (int8-dynamic not worth trying): ONNX Runtime's default plan right after static int8
    assert [item.name for item in with_plain_candidates(static_only, plan(), [Precision.FP32, Precision.INT8], convolutional=True)] == [
        "int8-static", "int8-ort-default", "fp32-rewritten", "int8-static+float", "fp32"]


GROUGS_FUSED = GROUPS[1:]


# ---------------------------------------------------------------- ONNX Runtime pieces, end to end


def test_float_outputs_and_float_consumers(tmp_path: Path) -> None:
    from tests.quantize.calibration.conftest import mlp_model

    mlp = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(mlp))
    assert float_output_op_types(mlp, ("MatMul", "Gemm", "Conv")) == ("Gemm", "Conv")  # MatMul -> Relu -> MatMul chains
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    assert float_output_op_types(model, ("MatMul",)) == ("MatMul",)  # MatMul -> Add only
    assert "a" not in calibration_tensors(model, static_plan()) and "a" in calibration_tensors(model, static_plan(float_outputs=()))
    from edgekit.quantize.calibration import calibrate

    residual = tmp_path / "residual.onnx"
    onnx.save(residual_model(), str(residual))
    tensors = calibration_tensors(residual, static_plan())
    ranges = calibrate(residual, batches(2), CalibratorSpec.create("minmax", symmetric=False), tensor_names=tensors).ranges
    for skip, expected in ((True, "x"), (False, "x_DequantizeLinear_Output")):
        out = write_static_qdq(residual, tmp_path / f"q{skip}.onnx", static_plan(float_consumers_skip_qdq=skip), ranges)
        add = next(n for n in onnx.load(str(out)).graph.node if n.name == "residual")
        assert add.input[0] == expected  # with the option, the residual Add reads x itself, not its quantize-dequantize


def residual_model() -> onnx.ModelProto:
    """``y = x + x @ w``: the residual Add is a float consumer of the MatMul's quantized input."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, (8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), helper.make_node("Add", ["x", "h"], ["y"], name="residual")],
        "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_transformer_fusion_does_not_apply_to_a_model_without_attention(tmp_path: Path) -> None:
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    assert transformer_fusion(model, tmp_path / "fused.onnx") is None
    assert not (tmp_path / "fused.onnx").exists()


def test_interleaved_timer_returns_one_latency_per_model(tmp_path: Path) -> None:
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    timer = OrtInterleavedTimer({"x": batches(1)[0]["x"]}, threads=1, rounds=3, min_seconds=0.0, keep_loaded=[model])
    latencies = timer([model, model])
    assert len(latencies) == 2 and all(v > 0 for v in latencies)
    with pytest.raises(QuantizationError, match="1 <= rounds <= max_rounds, got rounds=0"):
        OrtInterleavedTimer({}, rounds=0)


def test_timed_sessions_leave_no_pool_spinning_after_a_run(tmp_path: Path) -> None:
    """The timer runs candidates back to back: a pool still spinning after its run would take a core from
    the next candidate's session, so auto's sessions park their threads as soon as a run ends."""
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    session = ort_session(model, threads=2)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert len(session.run(None, {"x": batches(1)[0]["x"]})) == 1


def cost_model_ms(paths: Sequence[Path]) -> list[float]:
    """Deterministic latency for tests: a float MatMul/Gemm costs 30, a static int8 one (weight from a
    DequantizeLinear) 10, a dynamic int8 one 12, an int4 one 14; fp16 counts as float."""
    costs = []
    for path in paths:
        nodes = onnx.load(str(path), load_external_data=False).graph.node
        dequantized = {n.output[0] for n in nodes if n.op_type == "DequantizeLinear"}
        prices = {"MatMulInteger": 12, "MatMulNBits": 14}
        cost = 5.0
        for node in nodes:
            if node.op_type in ("MatMul", "Gemm"):
                cost += 10 if node.input[1] in dequantized else 30
            cost += prices.get(node.op_type, 0)
        costs.append(cost)
    return costs


def test_plan_auto_end_to_end_keeps_the_outlier_group(tmp_path: Path) -> None:
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    target = get_target("x86-64-cpu")
    evaluator = OrtMetricEvaluator(batches(3), METRICS["cosine"], AccuracyBudget(min_value=0.9995), model, min_cosine=0.999)
    result = plan_auto_onnxruntime(
        model, tmp_path / "work", spec=QuantizationSpec(), target=target, backend=Backend.ONNXRUNTIME,
        supported=supported_precisions(target, Backend.ONNXRUNTIME), calibration_batches=batches(4, seed=11), evaluation_batches=batches(3),
        metric=MetricSpec(METRICS["cosine"], "cosine"), evaluate=evaluator, time_models=cost_model_ms, sensitivity_batches=2,
        time_budget_multiple=None,  # wall-clock scaled budgets have their own tests (test_auto_plain.py); on a busy host one would skip the ladder
    )
    rows = {row.name: row for row in result.table}
    assert rows["int8-static"].status == "failed" and rows["int8-static"].value is not None and rows["int8-static"].value < 0.9995
    assert result.chosen.name.startswith("int8-static+")
    assert result.chosen_result.passed and result.chosen_result.value >= 0.9995
    assert "fc_spiky" in result.kept and result.kept["fc_spiky"].startswith("sensitivity rank 1: cosine")
    assert result.sensitivity is not None and result.sensitivity.groups[0].nodes == ("fc_spiky",)
    assert set(result.ranges) <= {"x", "spiky"} and result.ranges  # the ranges the chosen model was written with
    assert any("calibrator" in note for note in result.notes) and any("transformer-fusion does not apply" in n for n in result.notes)
    json.dumps(result.to_manifest())
    assert rows["fp32"].status == "skipped"
    assert np.isfinite(result.chosen_result.latency_ratio or np.nan)


def test_nodes_a_writer_left_in_float_are_reported(tmp_path: Path) -> None:
    from edgekit.quantize.ort.builder import unquantized_nodes

    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(model))
    assert unquantized_nodes(model, static_plan()) == ["fc_plain", "fc_spiky", "fc_small"]
    assert unquantized_nodes(model, static_plan(excluded={"fc_plain": "x", "fc_small": "y"}, dynamic_nodes=("fc_spiky",))) == ["fc_spiky"]
