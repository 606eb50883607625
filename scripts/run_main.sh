#!/usr/bin/env bash
# The main job: set everything up, then run the ImageNet-style legacy apex script unchanged through
# `python -m apexlite run`. The script prints the loss and loss scale of every step.
# Extra arguments go to the script, e.g.: bash scripts/run_main.sh --opt-level O2 --keep-batchnorm-fp32 True
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
if [ "$#" -eq 0 ]; then
  set -- --opt-level O1 --epochs 1 --steps-per-epoch 30
fi
exec "$PY" -m apexlite run examples/imagenet_amp.py "$@"
