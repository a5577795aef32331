#!/usr/bin/env bash
# Runs INSIDE the emulated arm64 rootfs (proot + qemu-aarch64), started by scripts/check_arm64.sh with
# the run's work directory bound at /check. Subcommands:
#   setup              venv from the rootfs's python3, edgekit-runtime and its aarch64 wheels, offline
#   install NAME...    `edgekit-agent install` each bundle /check/bundles/NAME with /check/agents/NAME.yaml
#                      (signature, file hashes and the golden self-check on ONNX Runtime's ARM kernels)
#   agent NAME         `edgekit-agent run` with /check/agents/NAME.yaml (until SIGTERM)
set -euo pipefail
venv=/check/venv

case "${1:-}" in
setup)
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --no-index --find-links /check/wheels \
        --find-links /check/local-wheels edgekit-runtime
    "$venv/bin/python" - <<'PY'
import importlib.util, platform, sys
import numpy, onnxruntime, edgekit_runtime
assert platform.machine() == "aarch64", f"machine is {platform.machine()}, not aarch64"
assert importlib.util.find_spec("torch") is None, "torch is importable in the device venv"
print(f"guest: {platform.machine()} Python {platform.python_version()} numpy {numpy.__version__} "
      f"onnxruntime {onnxruntime.__version__} ({', '.join(onnxruntime.get_available_providers())}) "
      f"edgekit-runtime {edgekit_runtime.__version__}")
PY
    ;;
install)
    shift
    for name in "$@"; do
        "$venv/bin/edgekit-agent" install --config "/check/agents/$name.yaml" "/check/bundles/$name"
    done
    ;;
agent)
    exec "$venv/bin/edgekit-agent" -v run --config "/check/agents/$2.yaml"
    ;;
*)
    echo "usage: guest.sh setup | install NAME... | agent NAME" >&2
    exit 2
    ;;
esac
