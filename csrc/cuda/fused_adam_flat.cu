// CUDA kernel of apexlite::fused_adam_flat_: the Adam update (adam_math.h) over one flat buffer per
// role, whatever number of params the buffers hold: one launch, no per-tensor table, then one small
// launch that advances the step counters. Each thread takes kVec consecutive elements per loop turn
// with one vector load or store per buffer (16 bytes of fp16/bf16, 2 x 16 of float32) and walks the
// buffers grid-stride, with a grid of as many blocks as the device holds at once (one wave). Buffers
// that all start the same number of elements past a vector boundary (a range of a set's buffers:
// FusedAdam launches a set in pieces, so the device starts while the host still checks the rest) take
// their first elements one at a time, the rest in vectors; buffers misaligned unequally take the whole
// loop one element at a time.
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#include <cstdint>
#include <type_traits>

#include "apexlite/adam_math.h"
#include "cuda_api.h"
#include "float_types.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace apexlite {
namespace cuda {
namespace {

constexpr int kFlatBlockSize = 256;  // threads per block
constexpr int kVec = 8;              // consecutive elements per thread per loop turn
constexpr int kStepBlockSize = 256;

template <typename T>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <int kWidth, typename T>
__device__ __forceinline__ void load(const T* src, int64_t i, float (&out)[kWidth]) {
  if constexpr (kWidth == 1) {
    out[0] = to_float(src[i]);
  } else {
    const Pack<T> pack = *reinterpret_cast<const Pack<T>*>(src + i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) out[k] = to_float(pack.v[k]);
  }
}

template <int kWidth, typename T>
__device__ __forceinline__ void store(T* dst, int64_t i, const float (&in)[kWidth]) {
  if constexpr (kWidth == 1) {
    dst[i] = from_float<T>(in[0]);
  } else {
    Pack<T> pack;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) pack.v[k] = from_float<T>(in[k]);
    *reinterpret_cast<Pack<T>*>(dst + i) = pack;
  }
}

// Updates elements [i, i + kWidth) of the buffers.
template <int kWidth, typename P, typename G, typename M, typename C, AdamMode kMode>
__device__ __forceinline__ void update(const AdamFlatBuffers& b, int64_t i, const AdamScalars& s, bool store_grads) {
  float rp[kWidth], rg[kWidth], rm[kWidth], rv[kWidth];
  load<kWidth>(static_cast<const P*>(b.param), i, rp);
  load<kWidth>(static_cast<const G*>(b.grad), i, rg);
  load<kWidth>(static_cast<const M*>(b.exp_avg), i, rm);
  load<kWidth>(static_cast<const M*>(b.exp_avg_sq), i, rv);
#pragma unroll
  for (int k = 0; k < kWidth; ++k) adam_update<kMode>(rp[k], rg[k], rm[k], rv[k], s);
  store<kWidth>(static_cast<P*>(b.param), i, rp);
  store<kWidth>(static_cast<M*>(b.exp_avg), i, rm);
  store<kWidth>(static_cast<M*>(b.exp_avg_sq), i, rv);
  if constexpr (!std::is_same<C, NoCopy>::value) store<kWidth>(static_cast<C*>(b.model_copy), i, rp);
  if (store_grads) {  // the value adam_update used, as the list kernel stores it
#pragma unroll
    for (int k = 0; k < kWidth; ++k) rg[k] = rg[k] * s.inv_scale;
    store<kWidth>(static_cast<G*>(b.grad), i, rg);
  }
}

template <typename P, typename G, typename M, typename C, AdamMode kMode, int kWidth>
__global__ void __launch_bounds__(kFlatBlockSize)
    fused_adam_flat_kernel(AdamFlatBuffers b, AdamHyper hyper, const float* grad_scale, const float* found_inf,
                           bool store_grads, int64_t head) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  // The counters still hold the previous count (advance_flat_steps_kernel bumps them afterwards);
  // the float addition is the CPU kernel's, so both take the same step in every float range.
  const float step = b.steps[0] + 1.0f;
  const AdamScalars s = make_adam_scalars(hyper, static_cast<double>(step), grad_scale != nullptr ? *grad_scale : 1.0);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Elements [head, head + groups * kWidth) in vectors; the head (< kWidth elements before the first
  // vector boundary) and the tail one per thread of the first warp.
  const int64_t groups = (b.numel - head) / kWidth;
  for (int64_t k = thread; k < groups; k += threads) {
    update<kWidth, P, G, M, C, kMode>(b, head + k * kWidth, s, store_grads);
  }
  if constexpr (kWidth > 1) {
    if (thread < head) update<1, P, G, M, C, kMode>(b, thread, s, store_grads);
    const int64_t i = head + groups * kWidth + thread;
    if (i < b.numel) update<1, P, G, M, C, kMode>(b, i, s, store_grads);
  }
}

__global__ void advance_flat_steps_kernel(float* steps, int64_t count, const float* found_inf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && (found_inf == nullptr || *found_inf == 0.0f)) steps[i] += 1.0f;
}

// How many elements `pointer` lies past a kVec-element boundary, or -1 when it is not even aligned to
// its element size.
int64_t elements_past_boundary(const void* pointer, size_t element_size) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (address % element_size != 0) return -1;
  return static_cast<int64_t>((address % (element_size * kVec)) / element_size);
}

// The elements to take one at a time before every buffer reaches a vector boundary together, or -1
// when the buffers lie at different distances from one (then no vector loads at all).
template <typename P, typename G, typename M, typename C>
int64_t common_head(const AdamFlatBuffers& b) {
  const int64_t past = elements_past_boundary(b.param, sizeof(P));
  const bool same = past >= 0 && elements_past_boundary(b.grad, sizeof(G)) == past &&
                    elements_past_boundary(b.exp_avg, sizeof(M)) == past &&
                    elements_past_boundary(b.exp_avg_sq, sizeof(M)) == past &&
                    (b.model_copy == nullptr || elements_past_boundary(b.model_copy, sizeof(C)) == past);
  if (!same) return -1;
  const int64_t head = (kVec - past) % kVec;
  return head < b.numel ? head : b.numel;
}

// The device's multiprocessors (1024 blocks' worth when the runtime does not say).
int multiprocessors() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
    return 1024;
  }
  return sms;
}

// Launches one instance of the kernel with a grid of at most one wave: as many blocks as the device
// holds at once, its multiprocessors times the blocks one of them fits (registers decide: the float32
// vector kernel's 72 a thread leave room for 3 blocks of 256 threads, asked once per instance). Every
// block has the same share of a grid-stride walk, so a larger grid runs in waves whose last is partly
// idle (8 blocks a multiprocessor would run as waves of 3, 3 and 2).
template <typename P, typename G, typename M, typename C, AdamMode kMode, int kWidth>
cudaError_t launch_one_wave(const AdamFlatBuffers& b, const AdamHyper& hyper, const float* grad_scale,
                            const float* found_inf, bool store_grads, int64_t head, cudaStream_t stream) {
  const auto kernel = fused_adam_flat_kernel<P, G, M, C, kMode, kWidth>;
  static const int per_sm = [&] {
    int blocks = 0;
    const cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kFlatBlockSize, 0);
    return error == cudaSuccess && blocks > 0 ? blocks : 1;
  }();
  const int64_t units = (b.numel - head) / kWidth, wave = static_cast<int64_t>(multiprocessors()) * per_sm;
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

cudaError_t launch_fused_adam_flat(const AdamFlatBuffers& b, const AdamHyper& hyper, AdamMode mode,
                                   const float* grad_scale, const float* found_inf, cudaStream_t stream) {
  if (b.moment_kind == FloatKind::kFloat16 || b.step_count < 1) return cudaErrorInvalidValue;
  if (b.numel > 0) {
    const cudaError_t error = with_adam_types(
        b.param_kind, b.grad_kind, b.moment_kind, b.model_copy != nullptr, b.copy_kind, [&](auto p, auto g, auto m, auto c) {
          return launch_typed<typename decltype(p)::type, typename decltype(g)::type, typename decltype(m)::type,
                              typename decltype(c)::type>(b, hyper, mode, grad_scale, found_inf, stream);
        });
    if (error != cudaSuccess) return error;
  }
  const int blocks = static_cast<int>((b.step_count + kStepBlockSize - 1) / kStepBlockSize);
  return launch_kernel(advance_flat_steps_kernel, blocks, kStepBlockSize, stream, b.steps, b.step_count, found_inf);
}

}  // namespace cuda
}  // namespace apexlite
