#!/usr/bin/env bash
# Quickstart 2: set up, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest -q "$@"
