#!/usr/bin/env bash
# Quickstart 1: set up, then build the demo recipes for this host's CPU and inspect the bundles.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/edgekit build recipes/digits-cnn.yaml --target x86-64-cpu --out bundles/digits-cnn --force
.venv/bin/edgekit build recipes/minilm.yaml --target x86-64-cpu --out bundles/minilm --force
.venv/bin/edgekit inspect bundles/minilm
