// The device code both flat kernels share (fused_adam_flat.cu over whole buffers, fused_adam_flat_table.cu
// over grads read where they are): the Adam update of kVec consecutive elements per thread with one vector
// load or store per buffer (16 bytes of fp16/bf16, 2 x 16 of float32), a span of such updates spread over
// threads, where vectors may start, and how many blocks fill the device once.
// Also compiles as host C++ (APEXLITE_CUDA_HOST_EMULATION, see host_emulation.h) for the cuda_host tests.
#pragma once

#include <cstdint>
#include <type_traits>

#include "apexlite/adam_math.h"
#include "cuda_api.h"
#include "float_types.cuh"
#include "launchers.h"

namespace apexlite {
namespace cuda {
namespace flat {

constexpr int kFlatBlockSize = 256;  // threads per block
constexpr int kVec = 8;              // consecutive elements per thread per loop turn

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

// Elements [0, b.numel) of the buffers, spread over `threads` threads of which this is `thread`: elements
// [head, head + groups * kWidth) in vectors; the head (< kWidth elements before the first vector boundary)
// and the tail one per thread of the first warp.
template <int kWidth, typename P, typename G, typename M, typename C, AdamMode kMode>
__device__ __forceinline__ void update_span(const AdamFlatBuffers& b, const AdamScalars& s, bool store_grads,
                                            int64_t head, int64_t thread, int64_t threads) {
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

// The scalars of this call's update. The counters still hold the previous count (advance_flat_steps_kernel
// bumps them afterwards); the float addition is the CPU kernel's, so both take the same step in every float range.
__device__ __forceinline__ AdamScalars call_scalars(const AdamFlatBuffers& b, const AdamHyper& hyper,
                                                    const float* grad_scale) {
  const float step = b.steps[0] + 1.0f;
  return make_adam_scalars(hyper, static_cast<double>(step), grad_scale != nullptr ? *grad_scale : 1.0);
}

// How many elements `pointer` lies past a kVec-element boundary, or -1 when it is not even aligned to
// its element size.
__host__ __device__ inline int64_t elements_past_boundary(const void* pointer, size_t element_size) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (address % element_size != 0) return -1;
  return static_cast<int64_t>((address % (element_size * kVec)) / element_size);
}

// The elements to take one at a time before every buffer reaches a vector boundary together, or -1
// when the buffers lie at different distances from one (then no vector loads at all).
template <typename P, typename G, typename M, typename C>
__host__ __device__ inline int64_t common_head(const AdamFlatBuffers& b) {
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
inline int multiprocessors() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
    return 1024;
  }
  return sms;
}

// Blocks of `kKernel` (kFlatBlockSize threads) the device holds at once: its multiprocessors times the
// blocks one of them fits (registers decide: the float32 vector kernel's 72 a thread leave room for 3),
// asked once per kernel instance. A grid-stride walk over a larger grid runs in waves whose last is
// partly idle (8 blocks a multiprocessor would run as waves of 3, 3 and 2).
template <auto kKernel>
int64_t one_wave() {
  static const int per_sm = [] {
    int blocks = 0;
    const cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kFlatBlockSize, 0);
    return error == cudaSuccess && blocks > 0 ? blocks : 1;
  }();
  return static_cast<int64_t>(multiprocessors()) * per_sm;
}

// Enqueues the advance of `count` step counters by one, unless *found_inf is nonzero (fused_adam_flat.cu).
cudaError_t launch_advance_steps(float* steps, int64_t count, const float* found_inf, cudaStream_t stream);

}  // namespace flat
}  // namespace cuda
}  // namespace apexlite
