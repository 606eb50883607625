#!/usr/bin/env bash
# One command that checks apexlite on a GPU machine within a budget (8 minutes by default), leaving a record:
#   1. build    apexlite._C with the CUDA kernel for this GPU (APEXLITE_CUDA=1, MAX_JOBS = all cores);
#   2. doctor   `python -m apexlite doctor`;
#   3. bench    alone on a quiet GPU and host (the last run had the benchmarks after the suites, at load 8.6):
#               FusedAdam at 1-10,000 tensors against torch's fused/foreach AdamW and the copy roofline, its
#               zero_grad against theirs, the host cost of its grad checks on a quiet host and with every core
#               kept busy (bench_flat_scan), bench/bench_gpu.py's figures, and repeated amp.initialize on CUDA;
#   4. tests    two steps side by side: tests_cuda, the project's `cuda` tests (the `cuda_host` ones need no GPU:
#               CI runs them) in $APEXLITE_GPU_CHECK_TEST_WORKERS pytest-xdist workers (default 4; 0: one
#               process), and tests_torch_version, the CPU tests whose subject is torch-version sensitive
#               (compiled norms but the slow inductor ones, unscale routes, repeated initialize, checkpoint order);
#   5. apex_*   beside the tests, apex's own L0 suites run_amp, run_optimizers, run_fp16util and
#               run_fused_layer_norm, unported (scripts/run_apex_l0.py --device cuda), judged against
#               scripts/apex_l0_expected.tsv, each a process of its own.
# Every step has its own time limit (`timeout`), so a stall or a failure in one still reports the others, and
# no step outlives the whole check's budget, $APEXLITE_GPU_CHECK_BUDGET_S seconds (default 480): a step gets
# the smaller of its limit and the budget's rest, and one that would get under 5 s is skipped, saying so. The
# command so ends within the budget plus timeout's 10 s grace, inside a 10-minute call with room left on a
# 15-minute loan. Step limits: build 150 s, doctor 30, benchmarks 255, tests and apex's suites side by side 240.
# Measured on an NVIDIA H200 (16 cores, 2026-11-27, commit 403d2ca, the older order: tests before benchmarks,
# tests_cuda in one process): 330 s in all (build 23, doctor 3, tests and apex's suites 240: tests_cuda 224 and
# run_fused_layer_norm 183 the longest, benchmarks 56; bench_zero_grad and bench_flat_scan came later).
# The record, in $APEXLITE_GPU_CHECK_OUT (default gpu_check_results): summary.md (a line per step: status,
# seconds, the log's last line), logs/STEP.log, the benchmarks' results.md/json (bench_gpu) and
# adam_tensor_counts/ and zero_grad/ results.md/json.
# apex's tests are read from $APEXLITE_APEX_TESTS, a folder holding apex's tests/L0 (an export of apex at
# e13873de, the last commit with amp: `git -C APEX archive e13873de tests/L0 | tar -x -C DIR`); without it
# step 5 is skipped, saying so. They need expecttest and numpy beside pytest.
# Exit status: 0 when every step passed (or no GPU is visible: it says so), 2 when torch cannot be imported.
# Environment: PYTHON (default: this checkout's ./.venv where it exists, else python3), TORCH_CUDA_ARCH_LIST
# (default: this GPU's), APEXLITE_GPU_CHECK_STEPS (default "build doctor bench tests apex"),
# APEXLITE_GPU_CHECK_COMMIT (the commit the summary names; default: git's HEAD, if the tree is a checkout).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else PY=python3; fi
OUT=${APEXLITE_GPU_CHECK_OUT:-gpu_check_results}
APEX_TESTS=${APEXLITE_APEX_TESTS:-}
STEPS=${APEXLITE_GPU_CHECK_STEPS:-build doctor bench tests apex}
BUDGET=${APEXLITE_GPU_CHECK_BUDGET_S:-480}
TEST_WORKERS=${APEXLITE_GPU_CHECK_TEST_WORKERS:-4}
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu_check: $PY cannot import torch; set PYTHON to the interpreter that has torch and apexlite's requirements (or run scripts/setup.sh first, which makes ./.venv)" >&2
    exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: torch sees no CUDA device ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')); nothing to check here. Run it on a GPU machine."
    exit 0
fi
mkdir -p "$OUT/logs"
SUMMARY=$OUT/summary.md
START=$(date +%s)
DEADLINE=$((START + BUDGET))
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
{
    echo "# GPU check $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "$("$PY" -c 'import torch; print(torch.cuda.get_device_name(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)') | $(nproc) cores | commit ${APEXLITE_GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo
    echo "| step | status | seconds | limit | last line of its log |"
    echo "|---|---|---:|---:|---|"
} > "$SUMMARY"

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# budget_limit LIMIT_SECONDS: the smaller of LIMIT_SECONDS and what is left of the budget.
budget_limit() {
    local left=$(( DEADLINE - $(date +%s) ))
    echo $(( left < $1 ? left : $1 ))
}

# step NAME LIMIT_SECONDS COMMAND...: runs it under its limit, cut to what is left of the budget, logs to
# logs/NAME.log and adds its summary line; skipped (status 1) when under 5 s of the budget are left.
step() {
    local name=$1 limit started rc status last
    limit=$(budget_limit "$2")
    shift 2
    if (( limit < 5 )); then
        echo "| $name | SKIPPED: the check's budget of $BUDGET s was spent | 0 | 0 | - |" >> "$SUMMARY"
        echo "gpu_check: $name: skipped, the budget of $BUDGET s was spent"
        return 1
    fi
    started=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    rc=$?
    case $rc in 0) status=passed ;; 124|137) status="STOPPED at its limit" ;; *) status="FAILED (exit $rc)" ;; esac
    last=$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -n 1 | cut -c1-160 | tr '|' '/')
    echo "| $name | $status | $(( $(date +%s) - started )) | $limit | $last |" >> "$SUMMARY"
    echo "gpu_check: $name: $status ($(( $(date +%s) - started )) s)"
    return $rc
}

# The project's GPU tests; beside them, the CPU tests whose subject depends on the torch version (this machine's
# torch is not CI's): torch.compile of the norms, the unscale routes, repeated initialize, checkpoint order.
# tests_cuda: in $2 xdist workers when pytest-xdist is there (the GPU is shared; 224 s in one process at 403d2ca).
cuda_tests() {
    local workers=()
    if [ "$2" -gt 0 ] && "$1" -c "import xdist" 2>/dev/null; then workers=(-n "$2" --dist worksteal); fi
    "$1" -m pytest -q -p no:cacheprovider --durations=15 -o faulthandler_timeout=120 "${workers[@]}" -m cuda tests \
        --ignore=tests/migrate
}
torch_version_tests() {
    "$1" -m pytest -q -p no:cacheprovider --durations=5 -o faulthandler_timeout=120 -m "not slow" \
        tests/normalization/test_compiled_norms.py tests/amp/test_unscale.py tests/amp/test_registrations_are_weak.py \
        tests/amp/test_checkpoint_order.py
}

failures=0
if wanted build; then
    step build 150 env APEXLITE_CUDA=1 APEXLITE_REQUIRE_EXTENSION=1 \
        "$PY" -m pip install --no-build-isolation --no-deps -v -e . || failures=$((failures + 1))
fi
if wanted doctor; then
    step doctor 30 "$PY" -m apexlite doctor || failures=$((failures + 1))
fi

if wanted bench; then
    step bench_adam_tensors 100 "$PY" -m bench.bench_adam_tensor_counts --device cuda --out "$OUT/adam_tensor_counts" --budget-s 70 \
        || failures=$((failures + 1))
    step bench_zero_grad 35 "$PY" -m bench.bench_zero_grad --device cuda --out "$OUT/zero_grad" --budget-s 15 \
        || failures=$((failures + 1))
    step bench_flat_scan 30 bash -c "'$PY' -m bench.bench_flat_scan && '$PY' -m bench.bench_flat_scan --busy $(nproc)" \
        || failures=$((failures + 1))
    step bench_gpu 60 "$PY" -m bench.bench_gpu --out "$OUT" --sizes 1e8 --rounds 5 || failures=$((failures + 1))
    step bench_repeated_initialize 30 "$PY" -m bench.bench_repeated_initialize --device cuda --configurations 300 \
        || failures=$((failures + 1))
fi

pids=()
if wanted tests; then
    step tests_cuda 240 bash -c "$(declare -f cuda_tests); cuda_tests '$PY' '$TEST_WORKERS'" &
    pids+=($!)
    step tests_torch_version 240 bash -c "$(declare -f torch_version_tests); torch_version_tests '$PY'" &
    pids+=($!)
fi
if wanted apex; then
    if [ -n "$APEX_TESTS" ] && [ -d "$APEX_TESTS/tests/L0" ]; then
        apex_limit=$(budget_limit 240)  # the runner stops its suite 15 s before the step's limit, reporting
        for suite in run_amp run_optimizers run_fp16util run_fused_layer_norm; do
            step "apex_$suite" "$apex_limit" "$PY" scripts/run_apex_l0.py "$APEX_TESTS" --device cuda --suite "$suite" \
                --timeout $(( apex_limit > 30 ? apex_limit - 15 : 15 )) --test-timeout 60 --keep "$OUT/apex_tree_$suite" --log-dir "$OUT/logs/apex_$suite" &
            pids+=($!)
        done
    else
        echo "| apex | skipped: APEXLITE_APEX_TESTS holds no tests/L0 | 0 | - | - |" >> "$SUMMARY"
        echo "gpu_check: apex's suites skipped (set APEXLITE_APEX_TESTS to a folder holding apex's tests/L0)"
        failures=$((failures + 1))
    fi
fi
for pid in "${pids[@]}"; do
    wait "$pid" || failures=$((failures + 1))
done
rm -rf "$OUT"/apex_tree_*

{
    echo
    echo "Total: $(( $(date +%s) - START )) s of a $BUDGET s budget; $failures step(s) not passed."
} >> "$SUMMARY"
cat "$SUMMARY"
exit $(( failures > 0 ))
