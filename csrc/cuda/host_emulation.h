// The CUDA built-ins apexlite's kernels use, for compiling csrc/cuda/*.cu as plain host C++ (g++).
// Used only when APEXLITE_CUDA_HOST_EMULATION is defined (the test build in tests/csrc/emulated_cuda.py);
// nvcc builds never see this file.
//
// A kernel becomes an ordinary function; run_grid() calls it once per (block, thread), serially,
// with blockIdx/threadIdx/blockDim/gridDim set as the device would. That is exact for kernels whose
// threads touch disjoint elements and use no shared memory, barriers, warp functions or atomics,
// which holds for every kernel in csrc/cuda/. __half and __nv_bfloat16 convert with the rounding the
// device uses (round to nearest even, the canonical NaN 0x7FFF), so results are bit for bit those
// the kernel's own arithmetic produces.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// --- runtime types and errors (the subset the kernels and launchers use) ------------------------
enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
using cudaError_t = cudaError;
struct CUstream_st;
using cudaStream_t = CUstream_st*;

// --- device queries: one device with kEmulatedSms multiprocessors, each holding kEmulatedBlocksPerSm
// blocks of any kernel at once (as registers would allow) -----------------------------------------
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
constexpr int kEmulatedSms = 4;          // small, so that grid-stride loops take several turns in the tests
constexpr int kEmulatedBlocksPerSm = 2;  // a one-wave grid is 8 blocks
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int /*device*/) {
  if (attribute != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = kEmulatedSms;
  return cudaSuccess;
}
template <typename Kernel>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel /*kernel*/, int /*block_size*/,
                                                                 size_t /*shared_bytes*/) {
  *blocks = kEmulatedBlocksPerSm;
  return cudaSuccess;
}

// --- built-in index variables ---------------------------------------------------------------------
struct HostDim3 {
  unsigned int x = 0, y = 1, z = 1;
};
inline thread_local HostDim3 blockIdx, threadIdx, blockDim, gridDim;

template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}

// --- 16-bit floats ---------------------------------------------------------------------------------
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2, "16-bit float storage must be 2 bytes");

namespace apexlite {
namespace host_emulation {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even of a float to IEEE binary16 bits, subnormals and overflow to infinity included.
inline uint16_t half_bits_rn(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7FFFu;                   // NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;           // >= 65520 rounds to infinity
  if (magnitude >= 0x38800000u) {                                // normal: >= 2^-14
    const uint32_t rebiased = magnitude - 0x38000000u;           // exponent bias 127 -> 15
    return static_cast<uint16_t>(sign | ((rebiased + 0x0FFFu + ((rebiased >> 13) & 1u)) >> 13));
  }
  const int exponent = static_cast<int>(magnitude >> 23);
  if (exponent < 102) return static_cast<uint16_t>(sign);        // below 2^-25: rounds to zero
  const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u; // value = mantissa * 2^(exponent - 150)
  const int shift = 126 - exponent;                              // to units of 2^-24, the subnormal step
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (units & 1u))) ++units;
  return static_cast<uint16_t>(sign | units);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  const float subnormal = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24, exact
  return sign ? -subnormal : subnormal;
}

inline uint16_t bfloat16_bits_rn(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One recorded launch: grid and block size (what the packing tests inspect).
struct Launch {
  int blocks;
  int threads;
};

inline std::vector<Launch>& launch_log() {
  static std::vector<Launch> log;
  return log;
}

// Runs `body` (a kernel call) for every thread of every block, in order; checks the launch
// configuration the way the device would reject it.
template <typename Body>
cudaError_t run_grid(int blocks, int threads, Body&& body) {
  if (blocks < 1 || threads < 1 || threads > 1024) return cudaErrorInvalidConfiguration;
  launch_log().push_back(Launch{blocks, threads});
  gridDim = HostDim3{static_cast<unsigned int>(blocks), 1, 1};
  blockDim = HostDim3{static_cast<unsigned int>(threads), 1, 1};
  for (int b = 0; b < blocks; ++b) {
    blockIdx = HostDim3{static_cast<unsigned int>(b), 0, 0};
    for (int t = 0; t < threads; ++t) {
      threadIdx = HostDim3{static_cast<unsigned int>(t), 0, 0};
      body();
    }
  }
  return cudaSuccess;
}

}  // namespace host_emulation
}  // namespace apexlite

inline float __half2float(__half h) { return apexlite::host_emulation::half_to_float(h.bits); }
inline __half __float2half_rn(float f) { return __half{apexlite::host_emulation::half_bits_rn(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) {
  return apexlite::host_emulation::bits_float(static_cast<uint32_t>(b.bits) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{apexlite::host_emulation::bfloat16_bits_rn(f)};
}
