// Portability macros shared by the host (g++) and device (nvcc) builds of apexlite's kernels.
// Includes nothing from torch or CUDA, so every translation unit can take it.
#pragma once

#if defined(__CUDACC__)
#define APEXLITE_HD __host__ __device__
#else
#define APEXLITE_HD
#endif

// Marks pointers that never alias each other inside one kernel loop; lets g++ vectorise it.
#if defined(__CUDACC__) || defined(__GNUC__) || defined(__clang__)
#define APEXLITE_RESTRICT __restrict__
#else
#define APEXLITE_RESTRICT
#endif
