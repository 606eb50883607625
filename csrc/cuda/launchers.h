// Torch-free entry points of apexlite's CUDA kernels: raw device pointers, sizes and a stream.
// The torch bindings (csrc/torch/*_cuda.cpp) validate tensors and call these.
#pragma once

#include <cstdint>

#include "apexlite/adam_math.h"
#include "cuda_api.h"

namespace apexlite {
namespace cuda {

// Element type of one tensor list.
enum class FloatKind : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Parallel per-tensor arrays (host memory) describing one fused Adam call. Entry i of every array
// belongs to tensor i; all tensors live on the current device and share, per list, one FloatKind.
struct AdamTensorLists {
  void* const* params;           // updated weights (or fp32 masters)
  void* const* grads;            // written only when unscale_grads is set and a grad_scale is given
  void* const* exp_avgs;
  void* const* exp_avg_sqs;
  void* const* model_copies;     // nullptr when no half copies are written
  float* const* steps;           // device float32 step counters, advanced after the update
  const int64_t* numels;
  int64_t count;
  FloatKind param_kind;          // kFloat32 whenever model_copies is set
  FloatKind grad_kind;
  FloatKind moment_kind;         // kFloat32 or kBFloat16
  FloatKind copy_kind;           // kFloat16 or kBFloat16; ignored without model_copies
  bool unscale_grads;            // with a grad_scale, also store grad / grad_scale into grads
};

// Enqueues the Adam/AdamW update of every tensor plus the step-counter advance on `stream`.
// grad_scale and found_inf are device pointers to one float each, or nullptr. A nonzero *found_inf
// turns the whole call into a no-op, decided on the device: the host never waits (grads stay as
// they are then, scaled, as torch's fused optimizers leave them on a skipped step).
cudaError_t launch_fused_adam(const AdamTensorLists& lists, const AdamHyper& hyper, AdamMode mode,
                              const float* grad_scale, const float* found_inf, cudaStream_t stream);

// One fused Adam call over flat buffers (apexlite::fused_adam_flat_): one device pointer per role,
// each to `numel` elements of its kind; `steps` to `step_count` float32 counters that all hold the
// same count. The update takes steps[0] + 1; every counter then advances by one.
struct AdamFlatBuffers {
  void* param;
  void* grad;        // written only when unscale_grads is set and a grad_scale is given
  void* exp_avg;
  void* exp_avg_sq;
  void* model_copy;  // nullptr when no half copy is written
  float* steps;
  int64_t numel;
  int64_t step_count;
  FloatKind param_kind;   // kFloat32 whenever model_copy is set
  FloatKind grad_kind;
  FloatKind moment_kind;  // kFloat32 or kBFloat16
  FloatKind copy_kind;    // kFloat16 or kBFloat16; ignored without model_copy
  bool unscale_grads;
};

// Enqueues the update (one launch over the whole buffers, vector loads where every pointer allows)
// and the counters' advance (one more launch) on `stream`; found_inf as for launch_fused_adam.
cudaError_t launch_fused_adam_flat(const AdamFlatBuffers& buffers, const AdamHyper& hyper, AdamMode mode,
                                   const float* grad_scale, const float* found_inf, cudaStream_t stream);

struct ChunkEntry;  // chunk_table.h
constexpr int64_t kMaxGridBlocks = 1 << 30;  // blocks per launch (the device allows 2^31 - 1)

// The flat buffers' elements of many grads' ranges, each grad read where it is (apexlite::
// fused_adam_flat_grad_list_): `table` is device memory holding `entries` chunk-table entries counted in
// elements, each a run of one grad (source) and of the buffers from element `target` on, at most
// kGradChunkElems long; `buffers.grad` is unused. One launch for the update whatever the number of grads,
// one for the counters; found_inf as for launch_fused_adam.
constexpr int64_t kGradChunkElems = 1 << 14;  // 8 loop turns of a block of 256 threads x 8 elements
cudaError_t launch_fused_adam_flat_table(const AdamFlatBuffers& buffers, const ChunkEntry* table, int64_t entries,
                                         const AdamHyper& hyper, AdamMode mode, const float* grad_scale,
                                         const float* found_inf, cudaStream_t stream);

// Enqueues the copy of every table entry's bytes into `flat` (a device buffer) on `stream`; `table` is
// device memory holding `entries` entries counted in bytes (flat_gather.h).
cudaError_t launch_flat_gather(void* flat, const ChunkEntry* table, int64_t entries, cudaStream_t stream);

}  // namespace cuda
}  // namespace apexlite
