// The one way apexlite launches a kernel: `kernel<<<blocks, threads, 0, stream>>>(args...)` under nvcc,
// and a serial run of every block and thread in the host emulation build (host_emulation.h). Every
// launch in csrc/cuda/ goes through launch_kernel(), so the host tests execute the same launch lines
// (grid sizes, arguments) that run on the device.
#pragma once

#include <utility>

#include "cuda_api.h"

namespace apexlite {
namespace cuda {

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), int blocks, int threads, cudaStream_t stream, Args&&... args) {
#if defined(APEXLITE_CUDA_HOST_EMULATION)
  (void)stream;
  return host_emulation::run_grid(blocks, threads, [&] { kernel(args...); });
#else
  kernel<<<blocks, threads, 0, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#endif
}

}  // namespace cuda
}  // namespace apexlite
