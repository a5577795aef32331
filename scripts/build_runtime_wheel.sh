#!/usr/bin/env bash
# Build edgekit-runtime's wheel from runtime/ into out/wheels/ (ignored; or the folder given), the wheel that
# README.md and docs/agent.md install on a device with
#     pip install --find-links out/wheels 'edgekit-runtime[grpc]'
# edgekit-runtime is not on a package index, so this (or `pip install ./runtime`) is how it gets installed.
# Built from a copy so that setuptools leaves no build/ or egg-info in runtime/. Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
out=${1:-out/wheels}
work="$(mktemp -d /tmp/edgekit-wheel.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp -r runtime "$work/runtime"
rm -rf "$work/runtime/build" "$work/runtime/"*.egg-info
mkdir -p "$out"
rm -f "$out"/edgekit_runtime-*.whl
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation "$work/runtime" -w "$out" >&2
ls "$out"/edgekit_runtime-*.whl
