#!/usr/bin/env bash
# One command that checks apexlite on a GPU machine (skips with a message where torch sees no GPU):
#   1. builds apexlite._C with the CUDA kernel for this GPU (needs nvcc; without it the CUDA-kernel
#      tests skip and FusedAdam runs on torch's fused ops, which the rest still checks);
#   2. prints `python -m apexlite doctor`;
#   3. runs the `cuda` tests (CUDA kernel vs CPU kernel vs reference, O0-O3 training on CUDA, host
#      syncs per step) and the `cuda_host` tests;
#   4. runs the GPU benchmarks (bench/bench_gpu.py): FusedAdam vs torch's fused AdamW at 10M/100M
#      params with achieved bandwidth as % of peak, the O2 step vs torch's chain, O1 vs autocast,
#      peak memory O0-O3; writes $OUT/results.json and $OUT/results.md (a block for BENCHMARKS.md).
# Exit status: that of the tests (the benchmarks run either way). Environment: PYTHON (default
# python3), APEXLITE_GPU_CHECK_OUT (default gpu_check_results), TORCH_CUDA_ARCH_LIST (default: this GPU's).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${APEXLITE_GPU_CHECK_OUT:-gpu_check_results}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: torch sees no CUDA device ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "torch not importable")); nothing to check here. Run it on a GPU machine."
    exit 0
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if command -v nvcc >/dev/null || [ -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "gpu_check: building apexlite._C with the CUDA kernel (sm ${TORCH_CUDA_ARCH_LIST})"
    APEXLITE_CUDA=1 APEXLITE_REQUIRE_EXTENSION=1 "$PY" -m pip install --quiet --no-build-isolation --no-deps -e . \
        || { echo "gpu_check: the CUDA build failed (above)"; exit 1; }
else
    echo "gpu_check: no nvcc (PATH, \$CUDA_HOME/bin): the CUDA kernel is not built; checking the torch-ops path only"
fi
"$PY" -m apexlite doctor

echo "gpu_check: tests (-m 'cuda or cuda_host')"
"$PY" -m pytest -q -m "cuda or cuda_host" tests
tests_status=$?

echo "gpu_check: benchmarks"
"$PY" -m bench.bench_gpu --out "$OUT" || echo "gpu_check: the benchmarks failed (above)"
echo "gpu_check: tests exit status $tests_status; results in $OUT/ (paste $OUT/results.md into BENCHMARKS.md)"
exit $tests_status
