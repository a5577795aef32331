#!/usr/bin/env bash
# The device side under the oldest Python it supports (issue 21): edgekit-runtime requires Python
# >= 3.10 (JetPack 6 ships 3.10), so its tests run here under a real CPython 3.10 too.
#
#  1. find a CPython 3.10: $EDGEKIT_PY310 if set, else python3.10 on PATH, pyenv's 3.10.x
#     ($PYENV_ROOT/versions, default ~/.pyenv) or uv's managed 3.10.x, the newest patch release first;
#  2. a venv of it with the pinned runtime and test dependencies below, cached in
#     $EDGEKIT_PY310_CACHE (default /var/cache/edgekit/py310-venv) under a hash of the interpreter's
#     version, those pins, runtime/pyproject.toml and constraints.txt, so a warm run reuses it;
#  3. edgekit-runtime built as a wheel from runtime/ and installed into it (every run, without its
#     dependencies), then `pip check` (the pins satisfy the runtime's declared requirements);
#  4. `pytest tests/runtime -m "not slow"` under 3.10 with that installed runtime. The tests build
#     their fixtures with onnx and sign bundles with the host package's signing code, which they import
#     from this checkout (edgekit/ is pure Python at the top of the repo; torch is not installed).
#     "not slow" leaves out the bare-venv install test (a fresh pip install from the index, minutes)
#     and the 30-second broker outage; the full suite runs them under the host's Python.
#
# No CPython 3.10 on the machine: the check prints SKIP and why, and exits 0 (1 with
# EDGEKIT_PY310_REQUIRED=1). Debian bookworm packages only 3.11, and neither pyenv (python.org
# sources) nor uv (python-build-standalone builds on GitHub) can download one where only the package
# registries are reachable. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1

# Newest releases with CPython 3.10 wheels of what the runtime needs (NumPy 2.3 and ONNX Runtime 1.24
# dropped 3.10), then what tests/runtime imports: pytest, hypothesis, jsonschema, Triton's clients
# for the Open Inference Protocol tests, onnx for the fixtures, and the host modules' pydantic, rich,
# fastjsonschema and prometheus_client (tests that run a real collector beside an agent import the
# collector, whose /metrics it writes), and the runtime's openvino extra (CPython 3.10 wheels exist, so the
# OpenVINO runner's tests run here instead of skipping). setuptools builds the runtime's wheel.
pins=(
    numpy==2.2.6 onnxruntime==1.23.2 cryptography==50.0.2 paho-mqtt==2.2.0 pyyaml==6.0.4
    grpcio==1.85.3 protobuf==6.33.6 nvidia-ml-py==13.615.71
    pytest==9.2.0 hypothesis==6.168.5 jsonschema==4.26.0 "tritonclient[grpc,http]==2.73.0"
    onnx==1.23.2 ml_dtypes==0.5.4 pydantic==2.14.4 rich==15.0.0 fastjsonschema==2.22.3 prometheus_client==0.26.0
    openvino==2026.4.1 setuptools==84.2.1
)
cache="${EDGEKIT_PY310_CACHE:-/var/cache/edgekit/py310-venv}"
start=$SECONDS

say() { echo "check_py310: $*" >&2; }

is_python310() {
    [ -x "$1" ] && "$1" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null
}

find_python310() {
    local candidate
    if [ -n "${EDGEKIT_PY310:-}" ]; then
        is_python310 "$EDGEKIT_PY310" || { say "FAIL: EDGEKIT_PY310=$EDGEKIT_PY310 is not a CPython 3.10 with venv; unset it or name one"; return 2; }
        "$EDGEKIT_PY310" -c 'import sys; print(sys.executable)'
        return 0
    fi
    while IFS= read -r candidate; do
        if [ -n "$candidate" ] && is_python310 "$candidate"; then
            "$candidate" -c 'import sys; print(sys.executable)'  # past pyenv's shims
            return 0
        fi
    done < <(command -v python3.10 || true
             compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/3.10.*/bin/python3.10" | sort -rV || true
             compgen -G "$HOME/.local/share/uv/python/cpython-3.10.*/bin/python3.10" | sort -rV || true)
    return 1
}

found=0
python310="$(find_python310)" || found=$?
[ "$found" -ne 2 ] || exit 1
if [ "$found" -ne 0 ]; then
    say "SKIP: no CPython 3.10 here (looked at \$EDGEKIT_PY310, python3.10 on PATH, ${PYENV_ROOT:-$HOME/.pyenv}/versions/3.10.*, uv's cpython-3.10.*)."
    say "Debian bookworm packages Python 3.11 only, and pyenv and uv download 3.10 from python.org and GitHub, which this machine may not reach. Install one (pyenv install 3.10) or set EDGEKIT_PY310."
    [ "${EDGEKIT_PY310_REQUIRED:-0}" = 1 ] && exit 1
    exit 0
fi
version="$("$python310" -c 'import platform; print(platform.python_version())')"
say "using CPython $version at $python310"

key="$( { echo "$version"; printf '%s\n' "${pins[@]}"; cat runtime/pyproject.toml constraints.txt; } | sha256sum | cut -c1-16)"
venv="$cache/$key"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

if [ ! -f "$venv/.complete" ]; then
    say "creating the venv $venv (cold: a few minutes)"
    mkdir -p "$cache"
    rm -rf "$venv"
    "$python310" -m venv "$venv"
    pip install -q --upgrade "pip>=24"
    pip install -q -c constraints.txt "${pins[@]}"
    touch "$venv/.complete"
    # venvs of an older pin list or interpreter are stale
    find "$cache" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
else
    say "reusing the venv $venv"
fi

# Built from a copy so that setuptools leaves no build/ or egg-info in runtime/.
work="$(mktemp -d /tmp/edgekit-py310.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp -r runtime "$work/runtime"
rm -rf "$work/runtime/build" "$work/runtime/"*.egg-info
if ! { pip wheel --no-deps --no-build-isolation "$work/runtime" -w "$work/wheels" &&
        pip install --no-deps --force-reinstall "$work"/wheels/edgekit_runtime-*.whl; } >"$work/install.log" 2>&1; then
    tail -n 40 "$work/install.log" >&2
    say "FAIL: building or installing edgekit-runtime from runtime/ (log above)"
    exit 1
fi
pip check >&2
installed="$("$venv/bin/python" -c 'import edgekit_runtime; print(edgekit_runtime.__file__)')"
case "$installed" in
    "$venv"/*) say "edgekit-runtime installed at $installed" ;;
    *) say "FAIL: edgekit_runtime imports from $installed, not from the venv's installed wheel"; exit 1 ;;
esac
say "set-up took $((SECONDS - start)) s; running tests/runtime under Python $version"

rc=0
"$venv/bin/python" -m pytest tests/runtime -m "not slow" -q -rs --durations=10 -p no:cacheprovider "$@" || rc=$?
if [ "$rc" -eq 0 ]; then
    say "PASS under CPython $version in $((SECONDS - start)) s"
else
    say "FAIL (pytest exit $rc) under CPython $version in $((SECONDS - start)) s"
fi
exit "$rc"
