// CUDA kernel of apexlite::flat_gather_: copies many tensors' memory into one flat buffer in one launch,
// one block per table entry (flat_gather.h). A block moves 16 bytes per thread per turn when its
// source, target and length allow, else 4, else 2 (every dtype apexlite gathers is 2 or 4 bytes).
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#include <cstdint>

#include "cuda_api.h"
#include "flat_gather.h"
#include "launch.cuh"
#include "launchers.h"

namespace apexlite {
namespace cuda {
namespace {

constexpr int kGatherBlockSize = 256;

struct alignas(16) Bytes16 {
  uint32_t v[4];
};

template <typename Unit>
__device__ __forceinline__ void copy_units(const char* source, char* target, int64_t bytes) {
  const int64_t units = bytes / static_cast<int64_t>(sizeof(Unit));
  const Unit* from = reinterpret_cast<const Unit*>(source);
  Unit* to = reinterpret_cast<Unit*>(target);
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) to[k] = from[k];
}

__global__ void __launch_bounds__(kGatherBlockSize) flat_gather_kernel(char* flat, const GatherEntry* table) {
  const GatherEntry entry = table[blockIdx.x];
  const char* source = reinterpret_cast<const char*>(entry.source);
  char* target = flat + entry.target;
  const uint64_t alignment = reinterpret_cast<uint64_t>(source) | reinterpret_cast<uint64_t>(target) |
                             static_cast<uint64_t>(entry.length);
  if (alignment % 16 == 0) {
    copy_units<Bytes16>(source, target, entry.length);
  } else if (alignment % 4 == 0) {
    copy_units<uint32_t>(source, target, entry.length);
  } else {
    copy_units<uint16_t>(source, target, entry.length);
  }
}

}  // namespace

cudaError_t launch_flat_gather(void* flat, const GatherEntry* table, int64_t entries, cudaStream_t stream) {
  for (int64_t first = 0; first < entries; first += kMaxGridBlocks) {
    const int64_t blocks = entries - first < kMaxGridBlocks ? entries - first : kMaxGridBlocks;
    const cudaError_t error = launch_kernel(flat_gather_kernel, static_cast<int>(blocks), kGatherBlockSize, stream,
                                            static_cast<char*>(flat), table + first);
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace apexlite
