#!/usr/bin/env bash
# onnxruntime-gpu on a machine with an NVIDIA GPU and no package index: rebuild the wheel from parts that
# travelled separately (scripts/wheel_parts.py), check its sha256, install it beside the machine's CUDA 13
# libraries, and run edgekit's CUDA-provider checks with it:
#   1. the providers: onnxruntime's version, get_available_providers(), and the providers a session on the
#      CUDA provider really got;
#   2. the GPU tests (IOBinding, device-resident I/O, CUDA graphs, fp16, golden self-checks as the agent loads
#      a bundle, TensorRT-missing fallback to CUDA, `edgekit bench --device cuda` beside PyTorch, NVML);
#   3. bundles built on the dev host (scripts/gpu_bundle_check.py: the agent's load and self-check, then
#      `edgekit bench --device cuda` with NVML energy per inference);
#   4. scripts/gpu_baseline_ort.py: ONNX Runtime's CUDA provider beside PyTorch, same GPU, one run.
#
#   scripts/check_ort_gpu.sh --parts-record FILE --parts DIR [--parts DIR...] [--wheels DIR] [--bundles DIR]
#                            [--out DIR] [--python PY] [--skip STEP,...] [--baseline-args "..."]
#
#   --parts-record FILE  parts.json written by `wheel_parts.py split`
#   --parts DIR          a folder holding parts (searched one level down too); repeat for several
#   --wheels DIR         other wheels edgekit needs there (pip --no-index --no-deps into the same target)
#   --bundles DIR        bundle folders to check (step 3)
#   --skip STEPS         any of tests,bundles,baseline
# Exit status: 0 all ran and passed, 1 a check failed (see the log), 2 bad usage, 3 no NVIDIA GPU,
# 4 the wheel could not be rebuilt or installed, 5 the CUDA provider is not available after the install.
# Reads the GPU's state only (nvidia-smi queries); it changes no clock, power or compute setting.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
record="" parts=() wheels="" bundles="" out=out/check-ort-gpu python=${PYTHON:-python3} skip="" baseline_args=""
while [ $# -gt 0 ]; do
    case "$1" in
        --parts-record) record=$2; shift 2 ;;
        --parts) parts+=("$2"); shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --bundles) bundles=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        --baseline-args) baseline_args=$2; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "check_ort_gpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$record" ] || [ ${#parts[@]} -eq 0 ]; then echo "check_ort_gpu: --parts-record and --parts are required" >&2; exit 2; fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
log=$out/check_ort_gpu.log
: > "$log"
say() { echo "check_ort_gpu: $*" | tee -a "$log"; }
skipped() { [[ ",$skip," == *",$1,"* ]]; }
status=0

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1; then
    say "no usable NVIDIA driver here (nvidia-smi missing or failing)"; exit 3
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw,power.limit,clocks.sm --format=csv >> "$out/nvidia-smi.txt" 2>&1
say "GPU: $(tail -n 1 "$out/nvidia-smi.txt")"

# 1. The wheel, rebuilt and checked, then installed into its own target folder.
site=/tmp/site-ort-gpu
started=$SECONDS
rm -rf /tmp/ort-gpu-wheel "$site"
if ! "$python" scripts/wheel_parts.py join "$record" "${parts[@]}" --out /tmp/ort-gpu-wheel 2>&1 | tee -a "$log"; then
    say "the wheel could not be rebuilt"; exit 4
fi
wheel_files=(/tmp/ort-gpu-wheel/*.whl)
if [ -n "$wheels" ]; then wheel_files+=("$wheels"/*.whl); fi
if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheel_files[@]}" >> "$log" 2>&1; then
    say "pip could not install the wheels (see $log)"; exit 4
fi
say "installed ${#wheel_files[@]} wheel(s) into $site in $((SECONDS - started)) s"
export PYTHONPATH="$site:$repo:$repo/runtime" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# The CUDA 13 runtime, cuDNN, cuBLAS, cuFFT, cuRAND wheels beside PyTorch: their lib folders on the loader path.
cuda_libs=$("$python" - <<'PY'
import glob, os, site
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(os.path.join(p, "nvidia"))]
print(":".join(sorted({os.path.dirname(f) for r in roots for f in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)})))
PY
)
export LD_LIBRARY_PATH="$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# 2. Which providers: available, and what a session really gets.
if ! "$python" - "$out/providers.json" <<'PY' 2>&1 | tee -a "$log"; then say "the CUDA provider is not usable"; exit 5; fi
import json, sys, tempfile
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]); model.ir_version = 9
path = tempfile.mktemp(suffix=".onnx"); onnx.save(model, path)
report = {"onnxruntime": ort.__version__, "file": ort.__file__, "device": ort.get_device(), "available_providers": ort.get_available_providers()}
session = ort.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
report["session_providers"] = session.get_providers()
x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
report["relu_on_gpu_ok"] = bool((session.run(None, {"x": x})[0] == np.maximum(x, 0)).all())
json.dump(report, open(sys.argv[1], "w"), indent=1); print(json.dumps(report))
sys.exit(0 if report["session_providers"][0] == "CUDAExecutionProvider" and report["relu_on_gpu_ok"] else 1)
PY

# 3. The GPU tests (and the CPU tests of the same files, which now see onnxruntime-gpu).
if ! skipped tests; then
    started=$SECONDS
    timeout 200 "$python" -m pytest -p no:cacheprovider -q -rA -o junit_family=xunit1 --junitxml="$out/junit.xml" \
        tests/runtime/test_onnxruntime_device_io.py tests/runtime/test_onnxruntime_runner.py tests/cli/test_bench_cuda.py \
        tests/runtime/sensors/test_sensor_nvml_gpu.py > "$out/pytest.log" 2>&1
    code=$?
    tail -n 40 "$out/pytest.log" | tee -a "$log"
    say "pytest exit status $code in $((SECONDS - started)) s"
    [ $code -eq 0 ] || status=1
fi

# 4. Bundles built on the dev host: the agent's load and golden self-check, then edgekit bench on CUDA.
if [ -n "$bundles" ] && ! skipped bundles; then
    started=$SECONDS
    timeout 120 "$python" scripts/gpu_bundle_check.py "$bundles"/*/ --out "$out/bundles" 2>&1 | tee -a "$log"
    code=${PIPESTATUS[0]}
    say "bundle checks exit status $code in $((SECONDS - started)) s"
    [ $code -eq 0 ] || status=1
fi

# 5. ONNX Runtime's CUDA provider beside PyTorch, same GPU, one run.
if ! skipped baseline; then
    started=$SECONDS
    # shellcheck disable=SC2086  # --baseline-args holds several arguments
    timeout 240 "$python" scripts/gpu_baseline_ort.py time --out "$out/gpu_ort.json" $baseline_args 2>&1 | tee "$out/baseline.log" | tail -n 90 | tee -a "$log"
    code=${PIPESTATUS[0]}
    say "baseline exit status $code in $((SECONDS - started)) s"
    [ $code -eq 0 ] || status=1
fi
exit $status
