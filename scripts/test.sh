#!/usr/bin/env bash
# Set everything up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pytest -q "$@"
