"""``--precision auto`` is bounded and says what it skipped (issue 17): counted candidate builds,
calibration passes and sensitivity runs on small models with real ONNX Runtime builds and evaluations;
the decision log names every skipped candidate with its reason; the time budget; ladders that stop when
keeping more groups does not move the metric; the interleaved timer's early stop."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.evaluate.metrics import METRICS
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort import builder as ort_builder
from edgekit.quantize.candidates import CandidateLadder
from edgekit.quantize.ort.judges import MetricSpec, OrtInterleavedTimer, OrtMetricEvaluator
from edgekit.quantize.ort.planner import plan_auto_onnxruntime
from edgekit.quantize.gating import supported_precisions
from edgekit.recipe import AccuracyBudget, QuantizationSpec
from edgekit.target import get_target
from tests.quantize.test_auto import Scripted, kept_top, other, static
from tests.quantize.test_cnn_int8 import _batches, silu_between


def cost_ms(paths: Sequence[Path]) -> list[float]:
    """Deterministic latency: a float MatMul/Gemm/Conv costs 30, one whose weight comes from a
    DequantizeLinear 10, a dynamic int8 MatMul 12; fp16 counts as float."""
    costs = []
    for path in paths:
        nodes = onnx.load(str(path), load_external_data=False).graph.node
        dequantized = {n.output[0] for n in nodes if n.op_type == "DequantizeLinear"}
        cost = 5.0
        for node in nodes:
            if node.op_type in ("MatMul", "Gemm", "Conv"):
                cost += 10 if node.input[1] in dequantized else 30
            cost += {"MatMulInteger": 12, "DynamicQuantizeLinear": 1}.get(node.op_type, 0)
        costs.append(cost)
    return costs


def spiky_model(path: Path) -> Path:
    """Two MatMuls added: ``fc_spiky`` reads ``x`` with one channel scaled by 3000 (so per-tensor int8 ruins it)."""
    rng = np.random.default_rng(7)
    w_plain, w_spiky = (rng.normal(0, 1, (8, 8)).astype(np.float32) for _ in range(2))
    w_spiky[0, :] = 1e-5
    scale = np.ones(8, dtype=np.float32)
    scale[0] = 3000.0
    nodes = [
        helper.make_node("MatMul", ["x", "w_plain"], ["a"], name="fc_plain"),
        helper.make_node("Mul", ["x", "scale"], ["spiky"], name="spike"),
        helper.make_node("MatMul", ["spiky", "w_spiky"], ["b"], name="fc_spiky"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    inits = [numpy_helper.from_array(w, n) for w, n in ((w_plain, "w_plain"), (w_spiky, "w_spiky"), (scale, "scale"))]
    graph = helper.make_graph(nodes, "spiky", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def vectors(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (16, 8)).astype(np.float32)} for _ in range(count)]


class Counting:
    """Counts the real calibration runs and candidate builds of :func:`plan_auto_onnxruntime`."""

    def __init__(self, monkeypatch) -> None:  # type: ignore[no-untyped-def]
        self.calibrations: list[int] = []
        self.builds: list[str] = []
        calibrate, build = ort_builder.calibrate, ort_builder.OrtCandidateBuilder.__call__

        def counted_calibrate(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = calibrate(*args, **kwargs)
            self.calibrations.append(int(not result.from_cache))
            return result

        def counted_build(builder, candidate):  # type: ignore[no-untyped-def]
            self.builds.append(candidate.name)
            return build(builder, candidate)

        monkeypatch.setattr(ort_builder, "calibrate", counted_calibrate)
        monkeypatch.setattr(ort_builder.OrtCandidateBuilder, "__call__", counted_build)


def run_auto(model: Path, tmp_path: Path, calibration: list, evaluation: list, min_value: float, **kwargs):  # type: ignore[no-untyped-def]
    target = get_target("x86-64-cpu")
    kwargs.setdefault("time_budget_multiple", None)  # the scaled budget has its own tests (test_auto_plain.py)
    evaluator = OrtMetricEvaluator(evaluation, METRICS["cosine"], AccuracyBudget(min_value=min_value), model)
    return plan_auto_onnxruntime(
        model, tmp_path / "work", spec=QuantizationSpec(), target=target, backend=Backend.ONNXRUNTIME,
        supported=supported_precisions(target, Backend.ONNXRUNTIME), calibration_batches=calibration, evaluation_batches=evaluation,
        metric=MetricSpec(METRICS["cosine"], "cosine"), evaluate=evaluator, time_models=cost_ms, sensitivity_batches=2,
        bench_feeds=evaluation[0], **kwargs,
    )


def test_conv_graph_builds_two_candidates_and_names_every_skip(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = Counting(monkeypatch)
    result = run_auto(silu_between(tmp_path / "fp32.onnx"), tmp_path, _batches(4), _batches(2, seed=5), min_value=0.99)
    rows = {row.name: row for row in result.table}
    assert result.chosen.name == "int8-static" and rows["int8-static"].status == "chosen"
    assert rows["int8-static"].latency_ratio is not None and rows["int8-static"].latency_ratio < 1.0
    # every candidate of the list has a row; the skipped ones say why
    assert set(rows) == {"int8-static", "fp32-rewritten", "int8-ort-default", "int8-static+dynamic", "int8-static+float", "int8-dynamic",
                         "int4", "fp16", "fp32"}
    for name in ("int8-static+dynamic", "int8-static+float"):
        assert rows[name].status == "skipped" and "int8-static is inside the budget; a ladder only buys accuracy" in rows[name].detail
    for name in ("int8-dynamic", "int4"):
        assert rows[name].status == "skipped" and "MatMul/Gemm do 0.0% of the work" in rows[name].detail
    assert rows["fp32"].status == "skipped" and "cannot beat int8-static" in rows["fp32"].detail
    for name in ("fp16", "fp32-rewritten"):
        assert rows[name].status == "slower"  # built and timed: nothing bounds them statically
    # ONNX Runtime's default plan costs what int8-static does here (a tie, within the noise): evaluated, re-timed beside it
    # in a run-off, and the search's choice stands on the tie
    assert rows["int8-ort-default"].status == "passed" and "run-off: lost" in rows["int8-ort-default"].detail
    assert result.runoff is not None and result.runoff.finalists == ("int8-static", "int8-ort-default") and result.runoff.winner == "int8-static"
    assert any(note.startswith("run-off of 2 finalists") for note in result.notes)  # the planner keeps the search's notes
    # bounded work, counted: four builds, one calibration pass (the recipe's calibrator), no sensitivity analysis
    assert counting.builds == ["int8-static", "int8-ort-default", "fp32-rewritten", "fp16"]  # ORT's default plan first on a conv graph
    assert sum(counting.calibrations) == len(counting.calibrations) == 1
    assert result.stats["built"] == 4 and result.stats["calibration_passes"] == 1 and result.stats["sensitivity_runs"] == 0
    assert result.sensitivity is None and any("sensitivity analysis not run" in note for note in result.notes)
    assert result.to_manifest()["stats"]["skipped"] == 5


def test_a_ladder_reuses_one_calibration_and_one_sensitivity_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = Counting(monkeypatch)
    result = run_auto(spiky_model(tmp_path / "fp32.onnx"), tmp_path, vectors(4, 11), vectors(3, 3), min_value=0.9995)
    rows = {row.name: row for row in result.table}
    assert rows["int8-static"].status == "failed"
    assert result.chosen.name.startswith("int8-static+") and [node for node in result.kept if node.startswith("fc_spiky")]
    assert result.stats["sensitivity_runs"] == 1 and result.sensitivity is not None
    assert result.sensitivity.groups[0].nodes[0].startswith("fc_spiky")  # pre-processing fuses MatMul + Add into a Gemm
    # both ladders and every step share the one calibration made before the search
    assert len(counting.calibrations) == 1 and result.stats["calibration_passes"] == 1
    # each candidate is written at most once; the three ladders stop at their first passing step
    assert len(counting.builds) == len(set(counting.builds)) <= 10, counting.builds
    assert result.stats["built"] == len(counting.builds)
    skipped = [row for row in result.table if row.status == "skipped"]
    assert skipped and all(row.detail for row in skipped)


def test_a_spent_time_budget_skips_everything_but_fp32(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = Counting(monkeypatch)
    result = run_auto(silu_between(tmp_path / "fp32.onnx"), tmp_path, _batches(4), _batches(2, seed=5), min_value=0.99, time_budget_s=1e-6)
    rows = {row.name: row for row in result.table}
    assert result.chosen.precision is Precision.FP32 and rows["fp32"].status == "chosen"
    budgeted = [row for row in result.table if row.name != "fp32"]
    assert budgeted and all(row.status == "skipped" and "time budget spent" in row.detail and "auto_time_budget_s" in row.detail for row in budgeted)
    assert counting.builds == ["fp32"]


def test_a_ladder_stops_when_keeping_groups_does_not_move_the_metric(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.95, "top1": 0.949, "top2": 0.995, "fp32": 1.0}, {"static": 40, "top1": 45, "top2": 50, "fp32": 100})
    base = static("static")
    ladder = CandidateLadder("static+dynamic", (kept_top(1, 1), kept_top(2, 1)), base=base)
    result = engine.search([base, ladder, other("fp32", Precision.FP32)])
    rows = {row.name: row for row in result.table}
    assert "top2" not in engine.built and result.chosen.name == "fp32"
    assert "no closer to the budget than static (0.949 vs 0.95): the ladder stops" in rows["top1"].detail
    assert rows["top1"].latency_ratio is None  # a failed ladder step is not timed


def test_a_ladder_whose_base_is_slower_than_fp32_is_skipped_unexpanded(tmp_path: Path) -> None:
    engine = Scripted(tmp_path, {"static": 0.95, "fp32": 1.0}, {"static": 130, "fp32": 100})

    def expand() -> tuple:
        raise AssertionError("the sensitivity ranking must not run")

    result = engine.search([static("static"), CandidateLadder("static+float", base=static("static"), expand=expand), other("fp32", Precision.FP32)])
    rows = {row.name: row for row in result.table}
    assert rows["static+float"].status == "skipped"
    assert "static (1.300x) or higher: cannot beat FP32 (1.000x)" in rows["static+float"].detail
    assert result.chosen.name == "fp32"


def test_interleaved_timer_stops_early_when_clearly_slower(tmp_path: Path) -> None:
    model = spiky_model(tmp_path / "fp32.onnx")
    timer = OrtInterleavedTimer({"x": vectors(1, 0)[0]["x"]}, threads=1, rounds=50, max_rounds=50, min_seconds=0.0, min_rounds=5)
    latencies = timer([model, model], bar=0.01)  # "must be 100x faster than the reference": rejected after min_rounds
    assert timer.stopped_early == 1 and len(latencies) == 2 and all(v > 0 for v in latencies)
    timer([model, model])
    assert timer.stopped_early == 1  # no bar: every round runs


def test_the_simulator_can_rank_on_fewer_batches(tmp_path: Path) -> None:
    from edgekit.quantize.calibration import CalibratorSpec, calibrate
    from edgekit.quantize.ort.static_plan import calibration_tensors
    from edgekit.quantize.sensitivity import QuantizationSimulator, rank_groups
    from tests.quantize.test_sensitivity import static_plan

    model = spiky_model(tmp_path / "fp32.onnx")
    ranges = calibrate(model, vectors(2, 11), CalibratorSpec.create("minmax", symmetric=False), tensor_names=calibration_tensors(model, static_plan())).ranges
    simulator = QuantizationSimulator(model, static_plan(), ranges, vectors(4, 3), max_batches=4)
    simulator.use_batches(1)
    report = rank_groups(simulator, METRICS["cosine"], metric_name="cosine")
    assert simulator.batches == report.batches == 1 and report.samples == 16
    assert report.groups[0].nodes == ("fc_spiky",)


def test_the_search_hands_the_timer_the_bar_to_beat(tmp_path: Path) -> None:
    bars: list[float | None] = []

    class BarScripted(Scripted):
        def time_models(self, paths: Sequence[Path], bar: float | None = None) -> list[float]:  # type: ignore[override]
            bars.append(bar)
            return super().time_models(paths)

    engine = BarScripted(tmp_path, {"static": 0.995, "fp16": 1.0, "fp32": 1.0}, {"static": 50, "fp16": 90, "fp32": 100})
    result = engine.search([static("static"), other("fp16", Precision.FP16), other("fp32", Precision.FP32)])
    assert result.chosen.name == "static"
    assert bars[:2] == [1.0, 0.5 * 0.95]  # FP32 before anything passed; then the best minus the noise margin
    assert set(bars[2:]) <= {None}  # the run-off of static and fp16 (0.90x, by rank): no bar, every model timed in full
