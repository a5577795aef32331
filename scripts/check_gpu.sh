#!/usr/bin/env bash
# Check edgekit's GPU code on a machine with an NVIDIA GPU, without TensorRT: the pycuda layer under the
# TensorRT runner (device info, pinned buffers, streams, CUDA graphs), the NVML power sensor on the real
# driver (power, energy counter, GPU load under a matrix-product loop, `auto` choosing NVML, read cost),
# and the NVML fakes' names against the real pynvml. The TensorRT tests run too and skip where TensorRT is
# missing; scripts/verify_gpu.sh is the end-to-end TensorRT check.
#
#   scripts/check_gpu.sh [--out DIR] [--wheels DIR] [--python PY] [--cuda-root DIR] [--jobs N]
#
#   --out DIR        where the log and summary go (default out/check-gpu): check_gpu.log, nvidia-smi.txt,
#                    junit.xml, pycuda-build.log, summary.json (tests passed/failed/skipped with reasons,
#                    the numbers the tests recorded, the GPU, the seconds each step took)
#   --wheels DIR     a folder of wheels to install first (pip --no-index --no-deps into DIR/../site-check-gpu
#                    under /tmp, put on PYTHONPATH), for machines without a package index. If it also holds a
#                    pycuda-*.tar.gz sdist and `import pycuda.driver` fails, pycuda is built from it
#                    (needs pytools, platformdirs, mako among the wheels, and CUDA's headers and nvcc).
#   --python PY      the interpreter (default: $PYTHON, else .venv/bin/python, else python3)
#   --cuda-root DIR  CUDA for the pycuda build (default: $CUDA_HOME, else the folder above nvcc's bin/)
#   --jobs N         parallel compile jobs for the pycuda build (default: nproc)
#
# Exit status: 0 when every test passed or skipped, 1 when a test failed or errored, 2 for bad usage,
# 3 when this machine has no usable NVIDIA GPU (no nvidia-smi, or it lists no GPU), 4 when the wheels
# could not be installed or pycuda could not be built (see the log).
# Reads the GPU's state only (nvidia-smi queries); it changes no clock, power or compute setting.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

python=${PYTHON:-}
out=out/check-gpu
wheels=""
cuda_root=${CUDA_HOME:-}
jobs=$(nproc)

usage() { sed -n '2,28p' "$0"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --cuda-root) cuda_root=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "check_gpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
    echo "check_gpu: --wheels $wheels is not a folder" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/check_gpu.log
: > "$log"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$repo:$repo/runtime${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "check_gpu: $*" | tee -a "$log"; }
now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
step_seconds=()  # "name=seconds", for the summary

# 1. Is there an NVIDIA GPU? (read-only queries)
if ! command -v nvidia-smi > /dev/null; then
    say "nvidia-smi is not on PATH: no NVIDIA driver here, nothing to check"
    exit 3
fi
if ! nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || ! nvidia-smi -L >> "$out/nvidia-smi.txt" 2>&1; then
    say "nvidia-smi failed (see $out/nvidia-smi.txt): the driver is not usable"
    exit 3
fi
gpu_csv=$(nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm \
    --format=csv,noheader 2>&1 | head -n 1)
if [ -z "$gpu_csv" ]; then
    say "nvidia-smi lists no GPU"
    exit 3
fi
tee -a "$log" < "$out/nvidia-smi.txt"
say "GPU: $gpu_csv"
say "python: $("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)')"

# 2. Carried wheels (machines without a package index).
if [ -n "$wheels" ]; then
    site=/tmp/site-check-gpu
    started=$(now)
    shopt -s nullglob
    wheel_files=("$wheels"/*.whl)
    shopt -u nullglob
    if [ ${#wheel_files[@]} -gt 0 ]; then
        if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                "${wheel_files[@]}" >> "$log" 2>&1; then
            say "installing the wheels of $wheels failed (see $log)"
            exit 4
        fi
        export PYTHONPATH="$PYTHONPATH:$site"
        say "installed ${#wheel_files[@]} wheel(s) into $site in $(seconds_since "$started") s"
    fi
    step_seconds+=("wheels=$(seconds_since "$started")")
fi

# 3. pycuda: use the installed one, else build the carried sdist.
cuda_root_for_build() {
    if [ -n "$cuda_root" ]; then echo "$cuda_root"; return; fi
    local nvcc
    nvcc=$(command -v nvcc || true)
    if [ -z "$nvcc" ]; then return 1; fi
    dirname "$(dirname "$(readlink -f "$nvcc")")"
}

# A folder holding `libcuda.so` for the linker: CUDA's stubs, else a link to the driver's libcuda.so.1.
libcuda_dir_for_build() {
    local root=$1 candidate driver
    for candidate in "$root/lib64/stubs" "$root/lib/stubs" "$root/targets/x86_64-linux/lib/stubs"; do
        if [ -e "$candidate/libcuda.so" ]; then echo "$candidate"; return; fi
    done
    driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    if [ -z "$driver" ]; then
        for candidate in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
            if [ -e "$candidate/libcuda.so.1" ]; then driver=$candidate/libcuda.so.1; break; fi
        done
    fi
    if [ -z "$driver" ]; then return 1; fi
    mkdir -p /tmp/check-gpu-libcuda
    ln -sf "$driver" /tmp/check-gpu-libcuda/libcuda.so
    echo /tmp/check-gpu-libcuda
}

build_pycuda() {
    local sdist=$1 root libdir build started
    root=$(cuda_root_for_build) || { say "no nvcc on PATH and no --cuda-root: cannot build pycuda"; return 1; }
    if [ ! -e "$root/include/cuda.h" ]; then say "$root/include/cuda.h is missing: give --cuda-root"; return 1; fi
    libdir=$(libcuda_dir_for_build "$root") || { say "no libcuda.so found (CUDA stubs or the driver's)"; return 1; }
    build=/tmp/check-gpu-pycuda
    rm -rf "$build" && mkdir -p "$build"
    tar -xzf "$sdist" -C "$build"
    build=$(echo "$build"/pycuda-*/)
    say "building $(basename "$sdist") against $root (libcuda from $libdir), $jobs jobs"
    started=$(now)
    if ! (cd "$build" && "$python" configure.py --cuda-root="$root" --cudadrv-lib-dir="$libdir" --no-cuda-enable-curand \
            && "$python" setup.py build_ext --inplace -j "$jobs") > "$out/pycuda-build.log" 2>&1; then
        say "the pycuda build failed after $(seconds_since "$started") s; the end of $out/pycuda-build.log:"
        tail -n 30 "$out/pycuda-build.log" | tee -a "$log"
        return 1
    fi
    step_seconds+=("pycuda_build=$(seconds_since "$started")")
    say "built pycuda in $(seconds_since "$started") s"
    export PYTHONPATH="$PYTHONPATH:$build"
}

if "$python" -c 'import pycuda.driver' > /dev/null 2>&1; then
    say "pycuda is installed: $("$python" -c 'import pycuda; print(pycuda.VERSION_TEXT)')"
else
    sdist=""
    if [ -n "$wheels" ]; then sdist=$(find "$wheels" -maxdepth 1 -name 'pycuda-*.tar.gz' | head -n 1); fi
    if [ -n "$sdist" ]; then
        build_pycuda "$sdist" || exit 4
        "$python" -c 'import pycuda.driver' >> "$log" 2>&1 || { say "the built pycuda does not import (see $log)"; exit 4; }
    else
        say "pycuda is not installed and no pycuda sdist was given: the pycuda tests will skip"
    fi
fi

# 4. The tests: the files that hold every `gpu`-marked test (their CPU tests run too), the NVML fakes (with
#    the name check against the real pynvml), the real-NVML tests and the sensor registry.
tests=(
    tests/engines/test_tensorrt_runner.py
    tests/runtime/test_onnxruntime_runner.py
    tests/runtime/test_onnxruntime_device_io.py
    tests/cli/test_bench_cuda.py
    tests/runtime/sensors/test_sensor_nvml.py
    tests/runtime/sensors/test_sensor_nvml_gpu.py
    tests/runtime/sensors/test_sensor_registry.py
)
started=$(now)
set +e
"$python" -m pytest -p no:cacheprovider -rA -o junit_family=xunit1 --junitxml="$out/junit.xml" "${tests[@]}" 2>&1 \
    | tee -a "$log"
pytest_status=${PIPESTATUS[0]}
set -e
step_seconds+=("pytest=$(seconds_since "$started")")

# 5. The summary: counts, skip reasons, recorded numbers, the GPU.
"$python" - "$out" "$gpu_csv" "$pytest_status" "${step_seconds[@]}" <<'PY' | tee -a "$log"
import datetime as dt, json, platform, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, gpu_csv, status = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
steps = dict(item.split("=", 1) for item in sys.argv[4:])
cases = []
junit = out / "junit.xml"
if junit.exists():
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, detail = "passed", None
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, detail = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag], node.get("message")
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "seconds": float(case.get("time") or 0),
                      **({"detail": detail} if detail else {}), **({"numbers": properties} if properties else {})})
counts = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "error", "skipped")}
summary = {
    "check": "edgekit scripts/check_gpu.sh",
    "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    "machine": platform.node(),
    "python": sys.version.split()[0],
    "gpu": gpu_csv,
    "pytest_exit_status": status,
    "counts": counts,
    "step_seconds": {k: float(v) for k, v in steps.items()},
    "tests": cases,
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
for c in cases:
    numbers = " ".join(f"{k}={v}" for k, v in c.get("numbers", {}).items())
    detail = f" ({c['detail'][:110]})" if c["outcome"] != "passed" and "detail" in c else ""
    print(f"{c['outcome']:<8} {c['test'].rsplit('.', 1)[-1]} {numbers}{detail}")
print(f"summary: {counts} on {gpu_csv}; steps {steps}; written to {out / 'summary.json'}")
PY
if [ "$pytest_status" -ne 0 ]; then
    say "pytest exit status $pytest_status: a test failed or errored (see $log)"
    exit 1
fi
exit 0
