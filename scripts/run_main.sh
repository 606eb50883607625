#!/usr/bin/env bash
# The main job: install what it needs (scripts/setup.sh main: scripts/requirements-main.txt's torch, wrapt,
# ninja, numpy and libcst, then apexlite; no test tools), then run the ImageNet-style legacy apex script unchanged through `python -m apexlite run`. The
# script prints the loss and loss scale of every step. Python: $PYTHON when set, else this checkout's
# ./.venv (created on first use).
# Extra arguments go to the script, e.g.: bash scripts/run_main.sh --opt-level O2 --keep-batchnorm-fp32 True
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
bash scripts/setup.sh main
if [ "$#" -eq 0 ]; then
  set -- --opt-level O1 --epochs 1 --steps-per-epoch 30
fi
exec "$PYTHON" -m apexlite run examples/imagenet_amp.py "$@"
