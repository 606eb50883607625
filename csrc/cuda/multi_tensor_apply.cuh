// Packs many tensors into few kernel launches. Each CUDA block handles one chunk of one tensor; the
// block -> (tensor, chunk) map and the tensor addresses travel by value in the kernel argument.
#pragma once

#include <cstdint>

#include "cuda_api.h"

namespace apexlite {
namespace cuda {

constexpr int kBlockSize = 512;          // threads per block
constexpr int kILP = 4;                  // elements each thread keeps in flight per loop turn
constexpr int64_t kChunkSize = 65536;    // elements per block: 32 loop turns of kBlockSize * kILP
constexpr int kKernelArgBytes = 4096;    // the kernel-parameter budget every supported CUDA version has
constexpr int kReservedArgBytes = 128;   // the kernel's other arguments (hyper-parameters, flag pointers)
constexpr int kMaxTensorsPerLaunch = 32;

// Per-launch tables for kDepth parallel tensor lists. The block table gets whatever the tensor table
// leaves of the budget: a tensor costs kDepth addresses + numel + step pointer, a block 1 + 4 bytes.
template <int kDepth>
struct TensorListMeta {
  static constexpr int kBytesPerTensor = 8 * kDepth + 8 + 8;
  static constexpr int kMaxBlocks =
      (kKernelArgBytes - kReservedArgBytes - kMaxTensorsPerLaunch * kBytesPerTensor) / 5;

  void* addresses[kDepth][kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  float* steps[kMaxTensorsPerLaunch];
  int32_t block_to_chunk[kMaxBlocks];
  uint8_t block_to_tensor[kMaxBlocks];
};
static_assert(kMaxTensorsPerLaunch <= 255, "block_to_tensor stores slots in one byte");

// Walks the tensors, fills TensorListMeta, and calls `launch(meta, num_blocks)` whenever a table
// is full. Zero-element tensors are skipped while packing: they own no chunk.
//
// NOTE [flush rule]: a launch happens (1) when the tensor table is full and the current tensor's
// last chunk is in, (2) when the block table is full, and (3) once after the loop for whatever is
// still pending. Rule 3 matters: without it the blocks packed after the last full table, e.g. when
// the list ends with empty tensors, would never run. A tensor cut by rule 2 continues as slot 0 of
// the next launch.
template <int kDepth, typename Launch>
cudaError_t multi_tensor_apply(void* const* const (&lists)[kDepth], float* const* steps, const int64_t* numels,
                               int64_t count, Launch&& launch) {
  using Meta = TensorListMeta<kDepth>;
  Meta meta;
  int tensors = 0;
  int blocks = 0;
  for (int64_t t = 0; t < count; ++t) {
    if (numels[t] == 0) continue;
    for (int d = 0; d < kDepth; ++d) meta.addresses[d][tensors] = lists[d] ? lists[d][t] : nullptr;
    meta.numel[tensors] = numels[t];
    meta.steps[tensors] = steps[t];
    ++tensors;
    const int64_t chunks = (numels[t] + kChunkSize - 1) / kChunkSize;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[blocks] = static_cast<uint8_t>(tensors - 1);
      meta.block_to_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if ((tensors == kMaxTensorsPerLaunch && last_chunk) || blocks == Meta::kMaxBlocks) {
        const cudaError_t error = launch(meta, blocks);
        if (error != cudaSuccess) return error;
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
        } else {  // carry the unfinished tensor over as slot 0
          for (int d = 0; d < kDepth; ++d) meta.addresses[d][0] = meta.addresses[d][tensors - 1];
          meta.numel[0] = meta.numel[tensors - 1];
          meta.steps[0] = meta.steps[tensors - 1];
          tensors = 1;
        }
      }
    }
  }
  return blocks > 0 ? launch(meta, blocks) : cudaSuccess;  // see NOTE [flush rule]
}

}  // namespace cuda
}  // namespace apexlite
