// Hands a table built on the host (csrc/cuda/chunk_table.h) to the device without waiting: copied into
// pinned memory, then copied on torch's current stream. The caching host allocator keeps the pinned block
// until that copy has run, so the caller may return at once.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

namespace apexlite {

template <typename Entry>
at::Tensor device_table(const std::vector<Entry>& table, const at::Device& device) {
  const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(Entry));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), table.data(), static_cast<size_t>(bytes));
  return host.to(device, /*non_blocking=*/true);
}

}  // namespace apexlite
