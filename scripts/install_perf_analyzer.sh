#!/usr/bin/env bash
# Install Triton's perf_analyzer (the bin/perf_analyzer of the tritonclient 2.41.0 manylinux wheel) with the
# two shared libraries it needs beside it, under a cache folder (default /var/cache/edgekit/perf_analyzer):
#
#   bin/perf_analyzer          from the tritonclient==2.41.0 manylinux wheel (PyPI)
#   lib/libb64.so.0d           from Debian's libb64-0d package (apt-get download; not installed system-wide)
#   lib/libcudart.so.12        from the nvidia-cuda-runtime-cu12 wheel (PyPI); loaded, never used on a CPU host
#   SOURCE                     where each file came from (scripts/bench_serving.py prints it)
#
#   scripts/install_perf_analyzer.sh [CACHE_DIR]        # then: bench_serving.py finds CACHE_DIR/bin/perf_analyzer
#
# Not part of CI: it downloads about 110 MB from PyPI and Debian. x86-64 Linux only (the wheel is manylinux x86_64).
set -euo pipefail
CACHE="${1:-${EDGEKIT_PERF_ANALYZER_DIR:-/var/cache/edgekit/perf_analyzer}}"
TRITONCLIENT_VERSION=2.41.0
PYTHON="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
if [ -x "$CACHE/bin/perf_analyzer" ] && LD_LIBRARY_PATH="$CACHE/lib" "$CACHE/bin/perf_analyzer" --version >/dev/null 2>&1; then
  echo "perf_analyzer already installed: $CACHE/bin/perf_analyzer"; exit 0
fi
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE/bin" "$CACHE/lib"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 --platform manylinux2014_x86_64 \
  --python-version 3.11 --dest "$WORK/tc" "tritonclient==$TRITONCLIENT_VERSION"
WHEEL="$(ls "$WORK"/tc/tritonclient-*.whl)"
"$PYTHON" - "$WHEEL" "$CACHE/bin/perf_analyzer" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    names = [n for n in wheel.namelist() if n.endswith("/bin/perf_analyzer")]
    if not names:
        sys.exit(f"{sys.argv[1]} holds no bin/perf_analyzer (is it the manylinux x86_64 wheel?)")
    with wheel.open(names[0]) as source, open(sys.argv[2], "wb") as target:
        shutil.copyfileobj(source, target)
PY
chmod +x "$CACHE/bin/perf_analyzer"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 \
  --dest "$WORK/cuda" "nvidia-cuda-runtime-cu12"
CUDA_WHEEL="$(ls "$WORK"/cuda/nvidia_cuda_runtime_cu12-*.whl)"
"$PYTHON" - "$CUDA_WHEEL" "$CACHE/lib" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    names = [n for n in wheel.namelist() if n.rsplit("/", 1)[-1] == "libcudart.so.12"]
    if not names:
        sys.exit(f"{sys.argv[1]} holds no libcudart.so.12")
    with wheel.open(names[0]) as source, open(sys.argv[2] + "/libcudart.so.12", "wb") as target:
        shutil.copyfileobj(source, target)
PY
if [ -e /usr/lib/x86_64-linux-gnu/libb64.so.0d ]; then
  cp /usr/lib/x86_64-linux-gnu/libb64.so.0d "$CACHE/lib/"; B64_FROM="/usr/lib/x86_64-linux-gnu/libb64.so.0d (installed)"
else
  (cd "$WORK" && apt-get download libb64-0d >/dev/null 2>&1) || { apt-get update -qq && (cd "$WORK" && apt-get download libb64-0d); }
  DEB="$(ls "$WORK"/libb64-0d_*.deb)"
  dpkg-deb -x "$DEB" "$WORK/b64"
  cp "$WORK"/b64/usr/lib/*/libb64.so.0d "$CACHE/lib/"; B64_FROM="Debian $(basename "$DEB")"
fi
cat > "$CACHE/SOURCE" <<TXT
perf_analyzer: $(basename "$WHEEL") (PyPI), bin/perf_analyzer
libcudart.so.12: $(basename "$CUDA_WHEEL") (PyPI)
libb64.so.0d: $B64_FROM
installed: $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/install_perf_analyzer.sh
TXT
LD_LIBRARY_PATH="$CACHE/lib" "$CACHE/bin/perf_analyzer" --version >/dev/null 2>&1 || {
  echo "perf_analyzer does not start; missing libraries:"; LD_LIBRARY_PATH="$CACHE/lib" ldd "$CACHE/bin/perf_analyzer" | grep "not found"; exit 1; }
echo "installed $CACHE/bin/perf_analyzer"; cat "$CACHE/SOURCE"
