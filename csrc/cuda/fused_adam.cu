// CUDA kernel of apexlite::fused_adam_: load -> adam_update (adam_math.h) -> store, over many
// tensors per launch (multi_tensor_apply.cuh), then one small launch that advances the step counters.
// Includes only CUDA headers and apexlite's own; csrc/torch/fused_adam_cuda.cpp binds it to torch.
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#include <type_traits>

#include "apexlite/adam_math.h"
#include "cuda_api.h"
#include "float_types.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "multi_tensor_apply.cuh"

namespace apexlite {
namespace cuda {
namespace {

constexpr int kDepth = 5;  // params, grads, exp_avgs, exp_avg_sqs, model_copies
constexpr int kParamList = 0, kGradList = 1, kExpAvgList = 2, kExpAvgSqList = 3, kCopyList = 4;
constexpr int kMaxStepsPerLaunch = 480;

template <typename P, typename G, typename M, typename C, AdamMode kMode>
__global__ void __launch_bounds__(kBlockSize)
    fused_adam_kernel(TensorListMeta<kDepth> meta, AdamHyper hyper, const float* grad_scale, const float* found_inf,
                      bool store_unscaled_grads) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int slot = meta.block_to_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunkSize;
  const int64_t end = min(begin + kChunkSize, meta.numel[slot]);
  // The step counter still holds the previous count; advance_steps_kernel bumps it afterwards.
  const double step = static_cast<double>(*meta.steps[slot]) + 1.0;
  const AdamScalars s = make_adam_scalars(hyper, step, grad_scale != nullptr ? *grad_scale : 1.0);

  P* p = static_cast<P*>(meta.addresses[kParamList][slot]);
  G* g = static_cast<G*>(meta.addresses[kGradList][slot]);
  M* m = static_cast<M*>(meta.addresses[kExpAvgList][slot]);
  M* v = static_cast<M*>(meta.addresses[kExpAvgSqList][slot]);
  C* copy = static_cast<C*>(meta.addresses[kCopyList][slot]);

  for (int64_t base = begin + threadIdx.x; base < end; base += static_cast<int64_t>(blockDim.x) * kILP) {
    float rp[kILP], rg[kILP], rm[kILP], rv[kILP];
#pragma unroll
    for (int k = 0; k < kILP; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
      if (i < end) {
        rp[k] = to_float(p[i]);
        rg[k] = to_float(g[i]);
        rm[k] = to_float(m[i]);
        rv[k] = to_float(v[i]);
      }
    }
#pragma unroll
    for (int k = 0; k < kILP; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
      if (i < end) {
        adam_update<kMode>(rp[k], rg[k], rm[k], rv[k], s);
        p[i] = from_float<P>(rp[k]);
        m[i] = from_float<M>(rm[k]);
        v[i] = from_float<M>(rv[k]);
        if constexpr (!std::is_same<C, NoCopy>::value) copy[i] = from_float<C>(rp[k]);
        if (store_unscaled_grads) g[i] = from_float<G>(rg[k] * s.inv_scale);  // the value adam_update used
      }
    }
  }
}

struct StepList {
  float* steps[kMaxStepsPerLaunch];
  int count;
};
static_assert(sizeof(StepList) + sizeof(float*) <= kKernelArgBytes, "StepList exceeds the kernel-argument budget");
static_assert(sizeof(TensorListMeta<kDepth>) + sizeof(AdamHyper) + 2 * sizeof(float*) + sizeof(bool) <= kKernelArgBytes,
              "TensorListMeta exceeds the kernel-argument budget");

__global__ void advance_steps_kernel(StepList list, const float* found_inf) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < list.count && (found_inf == nullptr || *found_inf == 0.0f)) *list.steps[i] += 1.0f;
}

cudaError_t advance_steps(float* const* steps, int64_t count, const float* found_inf, cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kMaxStepsPerLaunch) {
    StepList list;
    list.count = static_cast<int>(count - first < kMaxStepsPerLaunch ? count - first : kMaxStepsPerLaunch);
    for (int i = 0; i < list.count; ++i) list.steps[i] = steps[first + i];
    const cudaError_t error = launch_kernel(advance_steps_kernel, 1, kMaxStepsPerLaunch, stream, list, found_inf);
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

template <typename P, typename G, typename M, typename C>
cudaError_t launch_typed(const AdamTensorLists& l, const AdamHyper& hyper, AdamMode mode, const float* grad_scale,
                         const float* found_inf, cudaStream_t stream) {
  void* const* const lists[kDepth] = {l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.model_copies};
  const bool store_grads = l.unscale_grads && grad_scale != nullptr;
  const auto kernel = mode == AdamMode::kDecoupled ? fused_adam_kernel<P, G, M, C, AdamMode::kDecoupled>
                                                   : fused_adam_kernel<P, G, M, C, AdamMode::kL2>;
  return multi_tensor_apply<kDepth>(lists, l.steps, l.numels, l.count,
                                    [&](const TensorListMeta<kDepth>& meta, int blocks) {
    return launch_kernel(kernel, blocks, kBlockSize, stream, meta, hyper, grad_scale, found_inf, store_grads);
  });
}

}  // namespace

cudaError_t launch_fused_adam(const AdamTensorLists& l, const AdamHyper& hyper, AdamMode mode,
                              const float* grad_scale, const float* found_inf, cudaStream_t stream) {
  const cudaError_t error = with_adam_types(
      l.param_kind, l.grad_kind, l.moment_kind, l.model_copies != nullptr, l.copy_kind, [&](auto p, auto g, auto m, auto c) {
        return launch_typed<typename decltype(p)::type, typename decltype(g)::type, typename decltype(m)::type,
                            typename decltype(c)::type>(l, hyper, mode, grad_scale, found_inf, stream);
      });
  if (error != cudaSuccess) return error;
  return advance_steps(l.steps, l.count, found_inf, stream);
}

}  // namespace cuda
}  // namespace apexlite
