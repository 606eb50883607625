// The chunk table (csrc/cuda/chunk_table.h) of apexlite::fused_adam_flat_grad_list_'s grads, counted in
// elements: each grad's runs of at most `chunk` elements, their addresses and their offsets in the flat
// buffers. Built the same way by the CPU kernel and the CUDA binding.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "../cuda/chunk_table.h"

namespace apexlite {

inline std::vector<cuda::ChunkEntry> grad_runs(at::TensorList grads, const at::Tensor& offsets, int64_t chunk) {
  std::vector<uint64_t> sources(grads.size());
  std::vector<int64_t> numels(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    sources[i] = reinterpret_cast<uint64_t>(grads[i].data_ptr());
    numels[i] = grads[i].numel();
  }
  return cuda::chunk_table(sources.data(), offsets.data_ptr<int64_t>(), numels.data(),
                           static_cast<int64_t>(grads.size()), chunk, grads.empty() ? 1 : grads[0].element_size());
}

}  // namespace apexlite
