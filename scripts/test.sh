#!/usr/bin/env bash
# Set everything up (scripts/setup.sh test), then run the whole test suite with the same Python:
# $PYTHON when set, else this checkout's ./.venv (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
bash scripts/setup.sh test
exec "$PYTHON" -m pytest -q "$@"
