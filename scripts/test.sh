#!/usr/bin/env bash
# Set everything up (scripts/setup.sh test), then run the whole test suite with the same Python:
# $PYTHON when set, else this checkout's ./.venv (created on first use).
# The tests run in APEXLITE_TEST_WORKERS processes (pytest-xdist; default 2, 0 runs them in this one):
# most of the suite's time is child processes that start Python and torch, which two workers overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
bash scripts/setup.sh test
exec "$PYTHON" -m pytest -q -n "${APEXLITE_TEST_WORKERS:-2}" --dist worksteal "$@"
