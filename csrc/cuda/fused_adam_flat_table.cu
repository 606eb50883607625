// CUDA kernel of apexlite::fused_adam_flat_grad_list_: the flat kernel's update (flat_update.cuh) over the
// buffers' ranges of many grads, each grad read where autograd left it. A chunk table in device memory
// (chunk_table.h, counted in elements) gives each run's grad address and buffer offset, so one launch
// covers every grad whatever their number; a grid of one wave walks the table, a block per run at a
// time. A run whose grad and buffers lie equally far from a vector boundary takes its head one element at
// a time and the rest in vectors; any other run goes one element at a time. Then one small launch
// advances the counters, as fused_adam_flat_'s.
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#include <cstdint>
#include <type_traits>

#include "apexlite/adam_math.h"
#include "chunk_table.h"
#include "cuda_api.h"
#include "flat_update.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace apexlite {
namespace cuda {
namespace flat {
namespace {

// The buffers' elements [entry.target, entry.target + entry.length), with the entry's grad.
template <typename P, typename G, typename M, typename C>
__device__ __forceinline__ AdamFlatBuffers run_of(const AdamFlatBuffers& b, const ChunkEntry& entry) {
  AdamFlatBuffers run = b;
  run.param = static_cast<P*>(b.param) + entry.target;
  run.grad = reinterpret_cast<G*>(entry.source);
  run.exp_avg = static_cast<M*>(b.exp_avg) + entry.target;
  run.exp_avg_sq = static_cast<M*>(b.exp_avg_sq) + entry.target;
  if constexpr (!std::is_same<C, NoCopy>::value) run.model_copy = static_cast<C*>(b.model_copy) + entry.target;
  run.numel = entry.length;
  return run;
}

template <typename P, typename G, typename M, typename C, AdamMode kMode>
__global__ void __launch_bounds__(kFlatBlockSize)
    fused_adam_flat_table_kernel(AdamFlatBuffers b, const ChunkEntry* table, int64_t entries, AdamHyper hyper,
                                 const float* grad_scale, const float* found_inf, bool store_grads) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const AdamScalars s = call_scalars(b, hyper, grad_scale);
  for (int64_t e = blockIdx.x; e < entries; e += gridDim.x) {
    const AdamFlatBuffers run = run_of<P, G, M, C>(b, table[e]);
    const int64_t head = common_head<P, G, M, C>(run);
    if (head < 0) {
      update_span<1, P, G, M, C, kMode>(run, s, store_grads, 0, threadIdx.x, blockDim.x);
    } else {
      update_span<kVec, P, G, M, C, kMode>(run, s, store_grads, head, threadIdx.x, blockDim.x);
    }
  }
}

template <typename P, typename G, typename M, typename C, AdamMode kMode>
cudaError_t launch_table(const AdamFlatBuffers& b, const ChunkEntry* table, int64_t entries, const AdamHyper& hyper,
                         const float* grad_scale, const float* found_inf, cudaStream_t stream) {
  constexpr auto kernel = fused_adam_flat_table_kernel<P, G, M, C, kMode>;
  const int64_t wave = one_wave<kernel>();
  const int blocks = static_cast<int>(entries < wave ? entries : wave);
  return launch_kernel(kernel, blocks, kFlatBlockSize, stream, b, table, entries, hyper, grad_scale, found_inf,
                       b.unscale_grads && grad_scale != nullptr);
}

}  // namespace
}  // namespace flat

cudaError_t launch_fused_adam_flat_table(const AdamFlatBuffers& b, const ChunkEntry* table, int64_t entries,
                                         const AdamHyper& hyper, AdamMode mode, const float* grad_scale,
                                         const float* found_inf, cudaStream_t stream) {
  if (b.moment_kind == FloatKind::kFloat16 || b.step_count < 1 || entries < 0) return cudaErrorInvalidValue;
  if (entries > 0) {
    const cudaError_t error = with_adam_types(
        b.param_kind, b.grad_kind, b.moment_kind, b.model_copy != nullptr, b.copy_kind, [&](auto p, auto g, auto m, auto c) {
          using P = typename decltype(p)::type;
          using G = typename decltype(g)::type;
          using M = typename decltype(m)::type;
          using C = typename decltype(c)::type;
          return mode == AdamMode::kDecoupled
                     ? flat::launch_table<P, G, M, C, AdamMode::kDecoupled>(b, table, entries, hyper, grad_scale,
                                                                            found_inf, stream)
                     : flat::launch_table<P, G, M, C, AdamMode::kL2>(b, table, entries, hyper, grad_scale, found_inf,
                                                                     stream);
        });
    if (error != cudaSuccess) return error;
  }
  return flat::launch_advance_steps(b.steps, b.step_count, found_inf, stream);
}

}  // namespace cuda
}  // namespace apexlite
