// CUDA binding of apexlite::flat_gather_: builds the chunk table on the host in one pass over the
// sources (csrc/cuda/flat_gather.h), hands it to the device from pinned memory without waiting, and
// launches the gather kernel (csrc/cuda/flat_gather.cu): one launch whatever the number of sources.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "../cuda/flat_gather.h"
#include "../cuda/launchers.h"
#include "checks.h"
#include "device_table.h"

namespace apexlite {
namespace {

void flat_gather_cuda(const at::Tensor& flat, at::TensorList sources, at::IntArrayRef offsets) {
  check_flat_gather_args(flat, sources, offsets, at::kCUDA);
  const c10::cuda::CUDAGuard device_guard(flat.device());
  const int64_t size = flat.element_size();
  std::vector<uint64_t> from;
  std::vector<int64_t> to, bytes;
  from.reserve(sources.size());
  to.reserve(sources.size());
  bytes.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    from.push_back(reinterpret_cast<uint64_t>(sources[i].data_ptr()));
    to.push_back(offsets[i] * size);
    bytes.push_back(sources[i].numel() * size);
  }
  const std::vector<cuda::GatherEntry> table =
      cuda::gather_table(from.data(), to.data(), bytes.data(), static_cast<int64_t>(from.size()));
  if (table.empty()) return;
  const at::Tensor on_device = device_table(table, flat.device());
  const cudaError_t error = cuda::launch_flat_gather(flat.data_ptr(), static_cast<const cuda::GatherEntry*>(on_device.data_ptr()),
                                                     static_cast<int64_t>(table.size()), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.flat_gather_: CUDA launch failed: ", cudaGetErrorString(error));
}

}  // namespace

TORCH_LIBRARY_IMPL(apexlite, CUDA, m) { m.impl("flat_gather_", &flat_gather_cuda); }

}  // namespace apexlite
