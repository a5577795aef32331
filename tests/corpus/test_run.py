"""The corpus runner and its report: one small real model through the pipeline (host target timed and
evaluated, a Jetson target built, self-checked and estimated), ONNX Runtime's quantizers beside it, the
script writing the marked section; and the verdict rules on rows with the numbers of a measured run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from edgekit.corpus import PROVIDERS
from edgekit.corpus.run import HOST_TARGET, CorpusRow, run_model
from edgekit.corpus.summary import model_verdict, model_verdicts, results_table, summary

REPO = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("EDGEKIT_CORPUS_WHEELS", Path.home() / ".cache" / "edgekit" / "corpus" / "wheels"))
JETSON = "jetson-orin-nano-8gb"


def _small_model_name() -> str:
    return "ppocr-cls" if list(WHEELS.glob("rapidocr_onnxruntime-*.whl")) else "resnet"


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """fp32, int8 and int8-dynamic on the host (1 round) and fp32 for a Jetson (other_precisions), laid out as
    scripts/corpus.py lays out a run, so that the script test reuses its bundles."""
    work = tmp_path_factory.mktemp("corpus")
    name = _small_model_name()
    model = PROVIDERS[name].make(work / name, WHEELS, 0.2)
    runs = work / name / "runs"
    rows = run_model(model, runs, targets=(HOST_TARGET, JETSON), precisions=("fp32", "int8", "int8-dynamic"), rounds=1, other_precisions=("fp32",))
    return work, model, rows


@pytest.mark.slow
def test_host_rows_are_evaluated_timed_and_self_checked(corpus_run):
    _, model, rows = corpus_run
    host = {r.variant: r for r in rows if r.target == HOST_TARGET}
    assert set(host) == {"fp32", "int8", "int8-dynamic", "ort-quantize_static", "ort-quantize_dynamic"}
    assert all(r.error is None for r in host.values()), {k: r.error for k, r in host.items()}
    fp32, int8 = host["fp32"], host["int8"]
    assert fp32.x_fp32 == pytest.approx(1.0) and fp32.metric == pytest.approx(1.0) and fp32.meets_budget
    assert fp32.metric_name.startswith(model.metric["metric"]) and fp32.min_value == model.min_value
    assert int8.size_bytes < 0.6 * fp32.size_bytes and int8.cosine >= 0.95
    for row in host.values():
        assert row.p50_ms > 0 and len(row.round_ms) == 1 and row.p25_ms <= row.p50_ms <= row.p75_ms, row
        assert row.meets_budget == (row.metric >= model.min_value)
        assert row.build_s > 0
    assert fp32.golden == "pass" and int8.golden == "pass"
    assert any(note.startswith("int8-dynamic quantized") for note in host["int8-dynamic"].notes), host["int8-dynamic"].notes
    assert host["ort-quantize_static"].golden is None  # a peer is a bare model file, no bundle to self-check
    in_budget = [host[p] for p in ("ort-quantize_static", "ort-quantize_dynamic") if host[p].meets_budget]
    if in_budget:  # the ratio is to the faster peer that meets the budget, and names it
        best = min(in_budget, key=lambda r: r.p50_ms)
        assert fp32.best_ort == best.variant and fp32.x_best_ort == pytest.approx(fp32.p50_ms / best.p50_ms)
    else:
        assert fp32.x_best_ort is None


@pytest.mark.slow
def test_a_jetson_bundle_is_built_self_checked_and_estimated_not_timed(corpus_run):
    from edgekit.corpus.run import bench_dims

    work, model, rows = corpus_run
    (jetson,) = [r for r in rows if r.target == JETSON]
    assert jetson.error is None and jetson.size_bytes > 0 and jetson.build_s > 0
    assert jetson.p50_ms is None and jetson.x_fp32 is None
    assert jetson.estimate_p50_ms > 0 and jetson.estimate_engine.startswith("gpu")
    assert jetson.golden.startswith("pass (on ONNX Runtime CPU")
    assert any("TensorRT engine is built on the device" in note for note in jetson.notes)
    assert jetson.metric is not None and jetson.meets_budget is not None  # the build's own evaluation
    # estimated at the timed shape: every named input dim (the batch too, whatever the exporter called it) sized from the bench batch
    dims = bench_dims(work / model.name / "runs" / "bundles" / JETSON / "fp32" / "model.onnx", model.bench)
    first = next(iter(model.bench.values()))
    assert dims and first.shape[0] in dims.values(), dims


def test_auto_on_a_jetson_is_refused_with_a_named_reason(tmp_path):
    from edgekit.corpus.run import _build

    name = _small_model_name()
    model = PROVIDERS[name].make(tmp_path / name, WHEELS, 0.1)
    from edgekit.corpus.recipes import write_recipe

    row = CorpusRow(name, "auto", JETSON)
    assert _build(write_recipe(model, tmp_path / "recipe", model.min_value), JETSON, "auto", tmp_path / "b", row, reuse=False) is None
    assert "tensorrt backend needs an explicit precision" in row.error and "(fix: " in row.error


@pytest.mark.slow
def test_script_rewrites_the_marked_section_reusing_bundles_and_merging_other_models(corpus_run):
    work, _, rows = corpus_run
    name = _small_model_name()
    out, rows_json = work / "corpus.md", work / "rows.json"
    out.write_text("# Hand-written intro\n<!-- corpus:table -->\nold table\n<!-- /corpus:table -->\nHand-written analysis.\n")
    earlier = [CorpusRow("other-model", "fp32", HOST_TARGET, p50_ms=5.0, x_fp32=1.0).to_json()]
    rows_json.write_text(json.dumps(earlier))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "corpus.py"), "--models", name, "--precisions", "fp32,int8", "--rounds", "2",
                           "--scale", "0.2", "--targets", f"{HOST_TARGET},{JETSON}", "--other-precisions", "fp32", "--wheels", str(WHEELS), "--out", str(out),
                           "--json", str(rows_json), "--merge", "--work", str(work), "--reuse"],
                          capture_output=True, text=True, timeout=600, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Hand-written intro\n<!-- corpus:table -->\nWritten by `scripts/corpus.py`")
    assert text.endswith("<!-- /corpus:table -->\nHand-written analysis.\n") and "old table" not in text
    assert "CPU flags:" in text and "2 interleaved rounds" in text and "ONNX Runtime 1." in text
    assert f"| {name} | {HOST_TARGET} | int8 |" in text and f"| {name} | {HOST_TARGET} | ort-quantize_static |" in text
    assert f"| {name} | {JETSON} | fp32 |" in text and f"| {name} | {JETSON} | int8 |" not in text and "est. " in text
    assert "### Verdict per model" in text and "Rows of other-model come from an earlier run" in text
    assert "of 2 models: auto meets or beats the better budget-meeting ORT quantizer" in text
    assert f"| {name} |  |  |  |  | **lose**: auto not built for {HOST_TARGET} |" in text  # no auto in this run: a loss, shown
    saved = [CorpusRow.from_json(item) for item in json.loads(rows_json.read_text())]
    assert {r.model for r in saved} == {name, "other-model"}
    host_int8 = next(r for r in saved if r.model == name and r.target == HOST_TARGET and r.variant == "int8")
    assert "reused" in host_int8.notes and len(host_int8.round_ms) == 2  # the bundle reused, the timing fresh
    jetson = next(r for r in saved if r.model == name and r.target == JETSON)
    assert "reused" in jetson.notes and jetson.golden.startswith("pass") and jetson.estimate_p50_ms > 0
    assert host_int8.build_s == pytest.approx(next(r.build_s for r in rows if r.target == HOST_TARGET and r.variant == "int8"))


def test_script_refuses_reuse_without_a_work_dir_and_unknown_targets(tmp_path):
    script = [sys.executable, str(REPO / "scripts" / "corpus.py"), "--out", str(tmp_path / "x.md")]
    done = subprocess.run([*script, "--reuse"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--reuse needs --work DIR" in done.stderr
    done = subprocess.run([*script, "--targets", "x86-64-cpu,jetson-nano-9000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--targets:" in done.stderr and "jetson-nano-9000" in done.stderr
    assert not (tmp_path / "x.md").exists()


# ---------------------------------------------------------------- verdicts on measured numbers

# ppocr-det as measured on 2026-11-25 (docs/benchmarks/corpus.json; 1 - CER and IoU budgets as the recipe gives them),
# with per-round medians of a 4-round run: the rows the summary is computed from.
def _row(variant: str, p50: float, metric: float, rounds: list[float], build_s: float, **extra: object) -> CorpusRow:
    return CorpusRow("ppocr-det", variant, HOST_TARGET, size_bytes=1_000_000, build_s=build_s, metric_name="segmentation", metric=metric,
                     min_value=0.9, meets_budget=metric >= 0.9, p50_ms=p50, round_ms=rounds, x_fp32=p50 / 100.64, **extra)  # type: ignore[arg-type]


def _measured() -> dict[str, CorpusRow]:
    return {
        "fp32": _row("fp32", 100.64, 1.0, [99.0, 101.2, 100.6, 102.3], 4.9),
        "int8": _row("int8", 67.50, 0.9393, [66.1, 67.9, 68.8, 67.2], 32.8),
        "auto": _row("auto", 69.10, 0.9393, [68.0, 69.5, 70.2, 68.7], 61.0, chosen="int8-static (int8)"),
        "ort-quantize_static": _row("ort-quantize_static", 81.28, 0.9337, [80.1, 82.0, 81.5, 79.9], 30.8),
        "ort-quantize_dynamic": _row("ort-quantize_dynamic", 470.99, 0.9192, [465.0, 472.3, 475.0, 468.9], 30.8),
    }


def test_auto_wins_against_the_faster_peer_inside_the_budget():
    rows = _measured()
    verdict = model_verdict("ppocr-det", list(rows.values()))
    assert verdict.win and verdict.against == "ort-quantize_static"
    assert verdict.ratio == pytest.approx(69.10 / 81.28) and verdict.ratio_iqr[1] < 1.0 and not verdict.within_noise
    assert verdict.build_ratio == pytest.approx(61.0 / 32.8) and verdict.build_ok


def test_a_faster_peer_outside_the_budget_does_not_count():
    rows = _measured()
    rows["ort-quantize_static"] = replace(rows["ort-quantize_static"], p50_ms=50.0, metric=0.85, meets_budget=False)
    verdict = model_verdict("ppocr-det", list(rows.values()))
    assert verdict.against == "ort-quantize_dynamic" and verdict.win  # 69 ms against the in-budget dynamic peer's 471 ms


def test_without_a_budget_meeting_peer_auto_must_beat_fp32():
    rows = _measured()
    for peer in ("ort-quantize_static", "ort-quantize_dynamic"):
        rows[peer] = replace(rows[peer], metric=0.5, meets_budget=False)
    verdict = model_verdict("ppocr-det", list(rows.values()))
    assert verdict.against == "fp32" and verdict.win and "no ORT quantizer meets the budget" in verdict.reason
    rows["auto"] = replace(rows["auto"], p50_ms=100.64, round_ms=[99.0, 101.2, 100.6, 102.3])  # as slow as FP32: not faster
    verdict = model_verdict("ppocr-det", list(rows.values()))
    assert not verdict.win and verdict.reason.endswith("not faster than FP32") and verdict.ratio == pytest.approx(1.0)
    # auto kept FP32's own file, the one budget-meeting choice: a tie by construction, whatever the medians say (ResNet
    # on this host: auto 0.97x FP32, the same model; Silero VAD 1.12x), never a win by timing
    rows["fp32"] = replace(rows["fp32"], model_sha256="ab12")
    for p50, per_round in ((97.6, [95.0, 97.9, 98.1, 97.0]), (112.0, [110.0, 113.0, 112.5, 111.0])):
        rows["auto"] = replace(rows["auto"], chosen="fp32", model_sha256="ab12", p50_ms=p50, round_ms=per_round)
        verdict = model_verdict("ppocr-det", list(rows.values()))
        assert verdict.win and verdict.tie and verdict.same_as == "fp32" and "auto kept FP32's own file" in verdict.reason
        assert verdict.reason.endswith("meets (tie by construction)")


def test_a_loss_within_the_per_round_spread_is_marked_as_noise_and_still_counts_as_a_loss():
    rows = _measured()
    rows["auto"] = replace(rows["auto"], p50_ms=82.9, round_ms=[78.0, 84.0, 83.5, 80.5])  # 2 % slower than the static peer
    verdict = model_verdict("ppocr-det", list(rows.values()))
    assert not verdict.win and verdict.within_noise and verdict.reason == "slower than ort-quantize_static"


def test_auto_outside_the_budget_failed_or_slow_to_build_loses():
    rows = _measured()
    outside = model_verdict("ppocr-det", [*rows.values()][:2] + [replace(rows["auto"], metric=0.8, meets_budget=False)] + [*rows.values()][3:])
    assert not outside.win and "outside the budget" in outside.reason and "0.8000 < 0.9" in outside.reason
    failed = model_verdict("ppocr-det", [r if r.variant != "auto" else replace(r, error="auto: no plan", p50_ms=None) for r in rows.values()])
    assert not failed.win and failed.reason == "auto failed: auto: no plan"
    slow = model_verdict("ppocr-det", [r if r.variant != "auto" else replace(r, build_s=197.9) for r in rows.values()])
    assert slow.build_ratio == pytest.approx(197.9 / 32.8) and slow.build_ok is False


def test_the_summary_counts_every_model_and_shows_losses():
    rows = list(_measured().values())
    loser = [replace(r, model="ppocr-cls") for r in rows]
    loser = [r if r.variant != "auto" else replace(r, p50_ms=90.0, round_ms=[88.0, 91.0, 90.5, 89.0], build_s=120.0) for r in loser]
    skipped = CorpusRow("ppocr-rec", "-", "-", error="corpus: no wheel of rapidocr-onnxruntime in /nowhere")
    jetson = CorpusRow("ppocr-det", "int8", JETSON, build_s=12.0, golden="pass (on ONNX Runtime CPU: no TensorRT here)", estimate_p50_ms=1.4)
    refused = CorpusRow("ppocr-det", "auto", JETSON, error="--precision auto searches ONNX Runtime plans")
    verdicts = model_verdicts([*rows, jetson, refused, *loser, skipped])
    assert [v.model for v in verdicts] == ["ppocr-det", "ppocr-cls", "ppocr-rec"]
    text = "\n".join(summary(verdicts, rounds=4))
    assert "**1 of 3 models: auto meets or beats the better budget-meeting ORT quantizer**" in text
    assert "the goal is 80% (3 of 3): **not met**. 1 win(s) by timing, 0 same-configuration tie(s)" in text
    assert "2 loss(es), 0 of them within the per-round noise." in text
    assert "**auto ≤ 3× int8 build time on 1 of 3 models** (1 without both builds)." in text
    assert "| ppocr-det | int8-static (int8) | 0.69 | 0.85 (static) | " in text
    assert "| **lose**: slower than ort-quantize_static | 120.0 / 32.8 = 3.7× **> 3×** |" in text
    assert "**lose**: not run: corpus: no wheel of rapidocr-onnxruntime" in text
    assert f"{JETSON}: built 1/2, golden 1/1" in text
    assert "4 interleaved rounds of 3 timed calls per variant" in text
    table = "\n".join(results_table([*rows, jetson, refused]))
    assert "| ppocr-det | x86-64-cpu | ort-quantize_static | 1.00 | 30.8 | 81.28 |" in table
    assert f"| ppocr-det | {JETSON} | int8 |  | 12.0 | est. 1.4 |" in table
    assert "| ppocr-det | x86-64-cpu | ort-quantize_dynamic |" in table and "| yes (≥ 0.9) |" in table
    assert "error: --precision auto searches ONNX Runtime plans" in table


def test_a_stateful_model_is_evaluated_with_its_own_state_carried_through_each_sequence(tmp_path):
    """A running sum (stateN = state + x): within a sequence each call gets the state the same session computed
    on the previous call, and each sequence starts from the state its first batch carries."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from edgekit.corpus.base import CorpusModel
    from edgekit.corpus.run import evaluate_outputs
    from edgekit.engines.ort_session import cpu_session

    graph = helper.make_graph([helper.make_node("Add", ["x", "state"], ["stateN"]), helper.make_node("Identity", ["stateN"], ["y"])], "running_sum",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2]) for n in ("x", "state")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2]) for n in ("y", "stateN")])
    path = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    ones, zeros = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)
    batches = [{"x": ones * (i + 1), "state": zeros + 100 * (i % 2)} for i in range(4)]  # the state in odd batches must be ignored
    model = CorpusModel("sum", "embedding", path, batches, batches, batches[0], "y", "test graph", state=(("state", "stateN"),), sequence_length=2)
    got = [out["y"][0, 0] for out in evaluate_outputs(cpu_session(path, 1), model)]
    assert got == [1.0, 3.0, 3.0, 7.0]


def test_interleaved_samples_shuffle_the_order_each_round_and_time_every_variant_alike() -> None:
    from edgekit.corpus.run import CALLS_PER_ROUND, interleaved_samples

    log: list[str] = []
    calls = {name: (lambda name=name: log.append(name)) for name in ("fp32", "fp16", "int8", "auto")}
    samples = interleaved_samples(calls, rounds=12, settle_s=0.0, seed=3)
    assert all(len(per_round) == 12 and all(len(calls_) == CALLS_PER_ROUND for calls_ in per_round) for per_round in samples.values())
    assert all(t >= 0.0 for per_round in samples.values() for calls_ in per_round for t in calls_)
    warmup, timed = log[:4], log[4:]
    per_turn = 1 + CALLS_PER_ROUND  # one untimed call, then the timed ones
    firsts = [timed[i * 4 * per_turn] for i in range(12)]  # the variant that opened each round
    assert warmup == ["fp32", "fp16", "int8", "auto"]
    assert len(set(firsts)) > 1  # not always FP32 first
    again: list[str] = []
    interleaved_samples({name: (lambda name=name: again.append(name)) for name in calls}, rounds=12, settle_s=0.0, seed=3)
    assert again == log  # seeded: a rerun times in the same order
