// The element types of apexlite's CUDA kernels: float32, fp16 and bf16 storage read into float
// registers and rounded back (to nearest even), and the dispatch from a FloatKind to its CUDA type.
// Shared by fused_adam.cu (tensor lists) and fused_adam_flat.cu (flat buffers).
#pragma once

#include <type_traits>

#include "cuda_api.h"
#include "launchers.h"

namespace apexlite {
namespace cuda {

struct NoCopy {};  // the copy type when no half copies are written

template <typename T>
struct Tag {
  using type = T;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Calls fn(Tag<T>{}) with the CUDA type of `kind`.
template <typename Fn>
cudaError_t with_type(FloatKind kind, Fn&& fn) {
  switch (kind) {
    case FloatKind::kFloat32: return fn(Tag<float>{});
    case FloatKind::kFloat16: return fn(Tag<__half>{});
    case FloatKind::kBFloat16: return fn(Tag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// Calls fn(Tag<P>{}, Tag<G>{}, Tag<M>{}, Tag<C>{}) with the storage types of one Adam launch: params,
// grads, moments (float32 or bf16: fp16 moments underflow) and the half copies written from float32
// masters (NoCopy when `has_copy` is false). Refuses the combinations no kernel is built for.
template <typename Fn>
cudaError_t with_adam_types(FloatKind param, FloatKind grad, FloatKind moment, bool has_copy, FloatKind copy,
                            Fn&& fn) {
  if (moment == FloatKind::kFloat16) return cudaErrorInvalidValue;
  return with_type(param, [&](auto p_tag) {
    return with_type(grad, [&](auto g_tag) {
      using P = typename decltype(p_tag)::type;
      const auto with_moments = [&](auto m_tag) {
        if (!has_copy) return fn(p_tag, g_tag, m_tag, Tag<NoCopy>{});
        if constexpr (std::is_same<P, float>::value) {
          return with_type(copy, [&](auto c_tag) {
            if constexpr (std::is_same<typename decltype(c_tag)::type, float>::value) {
              return cudaErrorInvalidValue;  // a float32 copy of float32 params is pointless
            } else {
              return fn(p_tag, g_tag, m_tag, c_tag);
            }
          });
        } else {
          return cudaErrorInvalidValue;  // half copies are only written from float32 masters
        }
      };
      return moment == FloatKind::kBFloat16 ? with_moments(Tag<__nv_bfloat16>{}) : with_moments(Tag<float>{});
    });
  });
}

}  // namespace cuda
}  // namespace apexlite
