#!/usr/bin/env bash
# CI check of apexlite's CUDA code on a machine without a GPU:
#   1. compile every csrc/cuda/*.cu on its own with `nvcc -c` (the .cu files need no torch);
#   2. build the whole apexlite._C extension (CPU + CUDA kernels) through setup.py against a CUDA
#      build of torch kept in a separate venv (APEXLITE_CUDA=1, the explicit install path), import it,
#      and check that its ops register and that the CUDA kernel rejects CPU tensors with apexlite's message;
#   3. the first-use path of an install that compiled nothing (pip's build isolation): `python -m apexlite
#      doctor --build` in that venv compiles the CPU library and the CUDA kernel into a temporary
#      TORCH_EXTENSIONS_DIR, and the CUDA kernel must then be JIT-cached and registered.
# Each part is skipped, with a message, when its tools are missing. The venv's interpreter is only run
# from a directory this user owns and nobody else can write to (never a fixed path in a shared temp
# directory, where another user could plant an interpreter first). Tunables (environment):
#   APEXLITE_CUDA_VENV  venv holding the CUDA torch      (default ${XDG_CACHE_HOME:-~/.cache}/apexlite/cuda-venv)
#   APEXLITE_CUDA_TORCH torch requirement for that venv  (default torch==2.14.1, from local wheels)
#   TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-2}
VENV=${APEXLITE_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/apexlite/cuda-venv}
CUDA_TORCH=${APEXLITE_CUDA_TORCH:-torch==2.14.1}
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x "$CUDA_HOME/bin/nvcc" ] && NVCC=$CUDA_HOME/bin/nvcc
if [ -z "$NVCC" ]; then
    echo "check_cuda_build: nvcc not found (PATH, \$CUDA_HOME/bin); skipping the CUDA checks."
    exit 0
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/apexlite-cuda-check.XXXXXX")  # private (0700), random name
trap 'rm -rf "$WORK"' EXIT
ARCH=sm_$(echo "${TORCH_CUDA_ARCH_LIST%%[ ;]*}" | tr -d '.')

echo "check_cuda_build: nvcc -c ($("$NVCC" --version | tail -1), $ARCH)"
for cu in csrc/cuda/*.cu; do
    "$NVCC" -c -std=c++17 -O3 --fmad=false -arch="$ARCH" -Icsrc/include -Icsrc/cuda "$cu" -o "$WORK/$(basename "$cu").o"
    echo "  ok  $cu"
done

# Refuses a venv (or a parent folder) that another user owns or that others may write to.
private_dir() {
    local dir=$1
    while [ "$dir" != "/" ] && [ -n "$dir" ]; do
        if [ -e "$dir" ]; then
            if [ "$(stat -c %u "$dir")" != "$(id -u)" ] && [ "$(stat -c %u "$dir")" != 0 ]; then
                echo "check_cuda_build: $dir belongs to another user; set APEXLITE_CUDA_VENV to a folder you own." >&2
                return 1
            fi
            if [ $(( 0$(stat -c %a "$dir") & 022 )) -ne 0 ] && [ ! -k "$dir" ] ; then
                echo "check_cuda_build: $dir is writable by other users; set APEXLITE_CUDA_VENV to a private folder." >&2
                return 1
            fi
        fi
        dir=$(dirname "$dir")
    done
}
mkdir -p -m 700 "$(dirname "$VENV")"
private_dir "$VENV" || exit 1

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -W ignore -c "import torch" 2>/dev/null; then
    echo "check_cuda_build: creating $VENV with $CUDA_TORCH (from the local wheel store, several minutes once)"
    if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet "$CUDA_TORCH" "setuptools>=77" wheel ninja wrapt; }; then
        echo "check_cuda_build: $CUDA_TORCH is not installable here; skipping the full extension build."
        exit 0
    fi
fi
if [ "$("$VENV/bin/python" -W ignore -c 'import torch; print(torch.version.cuda or "")')" = "" ]; then
    echo "check_cuda_build: torch in $VENV has no CUDA; skipping the full extension build."
    exit 0
fi
"$VENV/bin/pip" install --quiet "setuptools>=77" wheel ninja wrapt

echo "check_cuda_build: building apexlite._C with CUDA against $("$VENV/bin/python" -W ignore -c 'import torch; print(torch.__version__)')"
start=$(date +%s)
APEXLITE_CUDA=1 APEXLITE_REQUIRE_EXTENSION=1 "$VENV/bin/python" setup.py --quiet build_ext \
    --build-lib "$WORK/lib" --build-temp "$WORK/tmp" > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
echo "  built in $(( $(date +%s) - start )) s"

cd "$WORK"  # away from the checkout, whose apexlite/ holds the CPU-only build
"$VENV/bin/python" - "$WORK/lib" <<'PY'
import glob, importlib.util, sys, warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch

so = glob.glob(f"{sys.argv[1]}/apexlite/_C*.so")[0]
spec = importlib.util.spec_from_file_location("apexlite._C", so)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
for op in ("apexlite::fused_adam_", "apexlite::fused_adam_flat_", "apexlite::fused_adam_flat_grad_list_",
           "apexlite::flat_gather_"):
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), f"{op} has no {key} kernel"
cpu = [torch.zeros(4)]
args = (cpu, cpu, [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(())], [])
hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, bias_correction=True, adam_w_mode=True)
try:
    torch.ops.apexlite.fused_adam_.default._op_dk(torch._C.DispatchKey.CUDA, *args, **hyper)
except RuntimeError as error:
    assert "CUDA kernel got tensors on cpu" in str(error), error
else:
    raise AssertionError("the CUDA kernel accepted CPU tensors")
print(f"  ok  imported {so}; CPU and CUDA kernels of the four ops registered; CPU tensors rejected by the CUDA kernel")
PY

echo "check_cuda_build: first-use build, as after a plain pip install (python -m apexlite doctor --build)"
cd "$ROOT"
start=$(date +%s)
TORCH_EXTENSIONS_DIR="$WORK/extensions" "$VENV/bin/python" -W "ignore:Failed to initialize NumPy" \
    -m apexlite doctor --build > "$WORK/doctor.log" 2>&1 || { cat "$WORK/doctor.log"; exit 1; }
grep -qE "^CUDA kernel +JIT-cached: " "$WORK/doctor.log" || { cat "$WORK/doctor.log"; exit 1; }
TORCH_EXTENSIONS_DIR="$WORK/extensions" "$VENV/bin/python" -W "ignore:Failed to initialize NumPy" - <<'PY'
import torch
from apexlite._native import kernel_state as state
from apexlite._native import loader

found = state.find_cuda(loader.status())
torch.ops.load_library(str(found.library.path))
assert state.has_kernel("CUDA"), f"{found.library.path} registers no CUDA kernel"
PY
echo "  ok  CPU library and CUDA kernel compiled on first use in $(( $(date +%s) - start )) s, CUDA kernel registered"
