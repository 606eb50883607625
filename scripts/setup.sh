#!/usr/bin/env bash
# Install apexlite and its dependencies into the current Python environment.
# torch is pinned to the CPU build that this machine keeps on local disk; users may use any torch>=2.1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet "torch==2.13.0" "wrapt>=1.14" "pytest>=7" setuptools wheel
# --no-build-isolation: build against the torch installed above, never download another one.
"$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
