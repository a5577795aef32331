#!/usr/bin/env bash
# Verify TensorRT on a machine with an NVIDIA GPU or on a Jetson: build every demo recipe with the
# TensorRT backend, run each bundle with TensorRT and with ONNX Runtime on the CPU, compare the outputs
# (and the golden outputs), time both, and write one JSON report.
#
#   scripts/verify_gpu.sh --target NAME [--precisions "fp32 fp16 int8"] [--out DIR] [--iterations N]
#
# NAME is the target profile of this machine (jetson-agx-orin-64gb, jetson-orin-nano-8gb, jetson-agx-thor,
# nvidia-h100, or a .yaml of your own GPU). Needs, besides edgekit: TensorRT's Python bindings and pycuda
# (on a Jetson both come through JetPack: `sudo apt install nvidia-jetpack`, then build pycuda against its
# CUDA), and the `edgekit build --backend` option. If Polygraphy is installed (`pip install polygraphy`),
# each ONNX model is also compared by `polygraphy run --trt --onnxrt` as an independent peer.
# Exit status: 0 when every bundle built and matched, 1 when one did not, 2 for bad usage, 3 when this
# machine cannot run TensorRT (the report says why).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
target=""
precisions="fp32 fp16"
out=out/verify-gpu
iterations=100
recipes=(recipes/digits-cnn.yaml recipes/digits-cnn-pruned.yaml recipes/minilm.yaml recipes/minilm-hf.yaml)

while [ $# -gt 0 ]; do
    case "$1" in
        --target) target=$2; shift 2 ;;
        --precisions) precisions=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --iterations) iterations=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "verify_gpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$target" ]; then
    echo "verify_gpu: give --target: the profile of this machine (\`edgekit targets\` lists them)" >&2
    exit 2
fi
mkdir -p "$out/bundles" "$out/logs"
export HF_HUB_OFFLINE=1

# 1. Can this machine run TensorRT at all? (Clear errors: TensorRT or pycuda missing, no CUDA device.)
if ! "$python" - "$out/preflight.json" <<'PY'
import json, sys
from edgekit_runtime.errors import EdgekitError
result = {"ok": False}
try:
    from edgekit_runtime.tensorrt_engines.version import detect_tensorrt
    from edgekit_runtime.backends.cuda_buffers import describe_device
    version = detect_tensorrt()
    info = describe_device(0)
    result = {"ok": True, "tensorrt": str(version), "api": str(version.api), "gpu": info.__dict__}
except EdgekitError as err:
    result["error"] = str(err)
    sys.stderr.write(f"verify_gpu: {err}\n")
open(sys.argv[1], "w").write(json.dumps(result, indent=2) + "\n")
sys.exit(0 if result["ok"] else 3)
PY
then
    echo "verify_gpu: this machine cannot run TensorRT; see $out/preflight.json" >&2
    exit 3
fi

# 2. Build every demo recipe at every precision with the TensorRT backend (engines build here: this is
#    the target's own hardware, so the host-matches-target rule builds them into the bundle).
: > "$out/builds.jsonl"
for recipe in "${recipes[@]}"; do
    for precision in $precisions; do
        name="$(basename "$recipe" .yaml)-$target-$precision"
        started=$(date +%s)
        if "$python" -m edgekit.cli.main build "$recipe" --target "$target" --backend tensorrt --precision "$precision" \
                --out "$out/bundles/$name" --force --json > "$out/logs/$name.json" 2> "$out/logs/$name.log"; then
            status=built
        else
            status=failed
            echo "verify_gpu: $name failed to build; see $out/logs/$name.log" >&2
        fi
        printf '{"name": "%s", "recipe": "%s", "precision": "%s", "status": "%s", "seconds": %d}\n' \
            "$name" "$recipe" "$precision" "$status" "$(( $(date +%s) - started ))" >> "$out/builds.jsonl"
    done
done

# 3. Compare TensorRT with ONNX Runtime CPU on the golden inputs, time both, and write the report.
"$python" - "$out" "$iterations" <<'PY'
import datetime as dt, json, platform, shutil, subprocess, sys
from pathlib import Path
import numpy as np
from edgekit_runtime.backends import create_runner
from edgekit_runtime.backends.cuda_buffers import describe_device
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.tensorrt_engines.plan import TensorRTBuildPlan
from edgekit_runtime.tensorrt_engines.version import detect_tensorrt
from edgekit_runtime.timing import benchmark_runner

out, iterations = Path(sys.argv[1]), int(sys.argv[2])
builds = [json.loads(line) for line in (out / "builds.jsonl").read_text().splitlines() if line.strip()]

def compare(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    rows_a, rows_b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    cos = np.sum(rows_a * rows_b, 1) / (np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1) + 1e-12)
    return {"max_abs_diff": float(np.abs(a - b).max(initial=0.0)), "cosine_min": float(cos.min(initial=1.0))}

def polygraphy(bundle, plan):
    if shutil.which("polygraphy") is None:
        return {"ran": False, "reason": "polygraphy is not installed"}
    profile = plan.profiles[0].shapes
    shape = lambda point: " ".join(f"{r.name}:{list(getattr(r, point))}".replace(" ", "") for r in profile)
    atol, rtol, _ = bundle.golden_tolerances
    cmd = ["polygraphy", "run", str(bundle.model_path), "--trt", "--onnxrt", "--atol", str(atol), "--rtol", str(rtol)]
    cmd += ["--trt-min-shapes", *shape("min").split(), "--trt-opt-shapes", *shape("opt").split(), "--trt-max-shapes", *shape("max").split()]
    if "FP16" in plan.builder_flags:
        cmd.append("--fp16")
    if "INT8" in plan.builder_flags:
        cmd.append("--int8")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    return {"ran": True, "passed": done.returncode == 0, "command": " ".join(cmd), "output_tail": (done.stdout + done.stderr)[-2000:]}

results = []
for build in builds:
    entry = dict(build)
    results.append(entry)
    if build["status"] != "built":
        entry["log_tail"] = (out / "logs" / f"{build['name']}.log").read_text(errors="replace")[-2000:]
        continue
    try:
        bundle = open_bundle(out / "bundles" / build["name"])
        section = bundle.backend.get("tensorrt") or {}
        plan = TensorRTBuildPlan.read(bundle.root / section.get("plan", "tensorrt/plan.json"))
        entry["api"], entry["engine_built_on"] = section.get("api"), section.get("engine_built_on")
        with create_runner(bundle) as trt, OnnxRuntimeRunner(bundle.model_path, bundle.io, ["CPUExecutionProvider"]) as cpu:
            entry["engine_source"] = trt.materialised.source if trt.materialised else None
            entry["self_check"] = self_check(bundle, trt, raise_on_failure=False).to_dict()
            diffs = {}
            for golden in bundle.golden_batches:
                inputs, _ = golden.load()
                got, ref = trt.infer(inputs), cpu.infer(inputs)
                for name in ref:
                    d = compare(got[name], ref[name])
                    prev = diffs.get(name, {"max_abs_diff": 0.0, "cosine_min": 1.0})
                    diffs[name] = {"max_abs_diff": max(prev["max_abs_diff"], d["max_abs_diff"]), "cosine_min": min(prev["cosine_min"], d["cosine_min"])}
            entry["tensorrt_vs_onnxruntime_cpu"] = diffs
            feeds, _ = bundle.golden_batches[0].load()
            timings = {label: benchmark_runner(runner, feeds, warmup=10, iterations=iterations).to_dict()
                       for label, runner in (("tensorrt", trt), ("onnxruntime_cpu", cpu))}
            entry["timing"] = timings
            entry["speedup_p50"] = timings["onnxruntime_cpu"]["p50_ms"] / timings["tensorrt"]["p50_ms"]
        entry["polygraphy"] = polygraphy(bundle, plan)
        entry["passed"] = bool(entry["self_check"]["passed"]) and entry["polygraphy"].get("passed", True)
    except EdgekitError as err:
        entry["passed"], entry["error"] = False, str(err)

report = {
    "report": "edgekit TensorRT verification",
    "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    "machine": platform.node(),
    "tensorrt": str(detect_tensorrt()),
    "gpu": describe_device(0).__dict__,
    "iterations": iterations,
    "bundles": results,
    "passed": bool(results) and all(r.get("passed") for r in results),
}
(out / "verify_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
for r in results:
    speed = f"{r['speedup_p50']:.1f}x vs ORT CPU" if "speedup_p50" in r else ""
    sys.stdout.write(f"{'ok ' if r.get('passed') else 'BAD'} {r['name']:<48} {r['status']:<7} {speed}\n")
sys.stdout.write(f"report: {out / 'verify_gpu.json'}\n")
sys.exit(0 if report["passed"] else 1)
PY
