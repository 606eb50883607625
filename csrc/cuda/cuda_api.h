// The CUDA runtime, fp16 and bf16 headers for apexlite's kernels: the real ones under nvcc and in the
// torch binding, host_emulation.h when APEXLITE_CUDA_HOST_EMULATION is defined (the g++ test build
// that runs the kernels' own source on the CPU, see tests/csrc/emulated_cuda.py).
#pragma once

#if defined(APEXLITE_CUDA_HOST_EMULATION)
#include "host_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
