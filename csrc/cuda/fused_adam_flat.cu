// CUDA kernel of apexlite::fused_adam_flat_: the Adam update (adam_math.h) over one flat buffer per
// role, whatever number of params the buffers hold: one launch, no per-tensor table, then one small
// launch that advances the step counters. Each thread takes kVec consecutive elements per loop turn
// (flat_update.cuh) and walks the buffers grid-stride, with a grid of as many blocks as the device holds
// at once (one wave). Buffers that all start the same number of elements past a vector boundary (a range
// of a set's buffers: FusedAdam launches a set in pieces, so the device starts while the host still
// checks the rest) take their first elements one at a time, the rest in vectors; buffers misaligned
// unequally take the whole loop one element at a time.
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#include <cstdint>

#include "apexlite/adam_math.h"
#include "cuda_api.h"
#include "flat_update.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace apexlite {
namespace cuda {
namespace flat {
namespace {

constexpr int kStepBlockSize = 256;

template <typename P, typename G, typename M, typename C, AdamMode kMode, int kWidth>
__global__ void __launch_bounds__(kFlatBlockSize)
    fused_adam_flat_kernel(AdamFlatBuffers b, AdamHyper hyper, const float* grad_scale, const float* found_inf,
                           bool store_grads, int64_t head) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const AdamScalars s = call_scalars(b, hyper, grad_scale);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  update_span<kWidth, P, G, M, C, kMode>(b, s, store_grads, head, thread, static_cast<int64_t>(gridDim.x) * blockDim.x);
}

__global__ void advance_flat_steps_kernel(float* steps, int64_t count, const float* found_inf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && (found_inf == nullptr || *found_inf == 0.0f)) steps[i] += 1.0f;
}

// Launches one instance of the kernel with a grid of at most one wave (one_wave()): every block has the
// same share of the grid-stride walk.
template <typename P, typename G, typename M, typename C, AdamMode kMode, int kWidth>
cudaError_t launch_one_wave(const AdamFlatBuffers& b, const AdamHyper& hyper, const float* grad_scale,
                            const float* found_inf, bool store_grads, int64_t head, cudaStream_t stream) {
  constexpr auto kernel = fused_adam_flat_kernel<P, G, M, C, kMode, kWidth>;
  const int64_t units = (b.numel - head) / kWidth, wave = one_wave<kernel>();
  const int64_t wanted = (units + kFlatBlockSize - 1) / kFlatBlockSize;
  const int blocks = static_cast<int>(wanted < 1 ? 1 : (wanted < wave ? wanted : wave));
  return launch_kernel(kernel, blocks, kFlatBlockSize, stream, b, hyper, grad_scale, found_inf, store_grads, head);
}

template <typename P, typename G, typename M, typename C, int kWidth>
cudaError_t launch_mode(const AdamFlatBuffers& b, const AdamHyper& hyper, AdamMode mode, const float* grad_scale,
                        const float* found_inf, int64_t head, cudaStream_t stream) {
  const bool store_grads = b.unscale_grads && grad_scale != nullptr;
  return mode == AdamMode::kDecoupled
             ? launch_one_wave<P, G, M, C, AdamMode::kDecoupled, kWidth>(b, hyper, grad_scale, found_inf,
                                                                         store_grads, head, stream)
             : launch_one_wave<P, G, M, C, AdamMode::kL2, kWidth>(b, hyper, grad_scale, found_inf, store_grads,
                                                                  head, stream);
}

template <typename P, typename G, typename M, typename C>
cudaError_t launch_typed(const AdamFlatBuffers& b, const AdamHyper& hyper, AdamMode mode, const float* grad_scale,
                         const float* found_inf, cudaStream_t stream) {
  const int64_t head = common_head<P, G, M, C>(b);
  return head < 0 ? launch_mode<P, G, M, C, 1>(b, hyper, mode, grad_scale, found_inf, 0, stream)  // one at a time
                  : launch_mode<P, G, M, C, kVec>(b, hyper, mode, grad_scale, found_inf, head, stream);
}

}  // namespace

cudaError_t launch_advance_steps(float* steps, int64_t count, const float* found_inf, cudaStream_t stream) {
  const int blocks = static_cast<int>((count + kStepBlockSize - 1) / kStepBlockSize);
  return launch_kernel(advance_flat_steps_kernel, blocks, kStepBlockSize, stream, steps, count, found_inf);
}

}  // namespace flat

cudaError_t launch_fused_adam_flat(const AdamFlatBuffers& b, const AdamHyper& hyper, AdamMode mode,
                                   const float* grad_scale, const float* found_inf, cudaStream_t stream) {
  if (b.moment_kind == FloatKind::kFloat16 || b.step_count < 1) return cudaErrorInvalidValue;
  if (b.numel > 0) {
    const cudaError_t error = with_adam_types(
        b.param_kind, b.grad_kind, b.moment_kind, b.model_copy != nullptr, b.copy_kind, [&](auto p, auto g, auto m, auto c) {
          return flat::launch_typed<typename decltype(p)::type, typename decltype(g)::type,
                                    typename decltype(m)::type, typename decltype(c)::type>(b, hyper, mode, grad_scale,
                                                                                             found_inf, stream);
        });
    if (error != cudaSuccess) return error;
  }
  return flat::launch_advance_steps(b.steps, b.step_count, found_inf, stream);
}

}  // namespace cuda
}  // namespace apexlite
