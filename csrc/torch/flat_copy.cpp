// apexlite::flat_gather_ on the CPU, and copy_into (flat_copy.h): how fresh grads move into a grad buffer.
#include "flat_copy.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstring>

#include "checks.h"

namespace apexlite {
namespace {

// apexlite::flat_gather_ on the CPU: one memcpy per source (the sources are dense and of flat's dtype).
void flat_gather_cpu(const at::Tensor& flat, at::TensorList sources, at::IntArrayRef offsets) {
  check_flat_gather_args(flat, sources, offsets, at::kCPU);
  char* base = static_cast<char*>(flat.data_ptr());
  const int64_t size = flat.element_size();
  at::parallel_for(0, static_cast<int64_t>(sources.size()), 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(base + offsets[i] * size, sources[i].data_ptr(), sources[i].numel() * size);
    }
  });
}

}  // namespace

void copy_into(const at::Tensor& flat, const std::vector<at::Tensor>& grads, const std::vector<int64_t>& offsets) {
  if (flat.is_cpu()) {
    flat_gather_cpu(flat, grads, offsets);
    return;
  }
  static const auto gather = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("apexlite::flat_gather_", "")
                                 .typed<void(const at::Tensor&, at::TensorList, at::IntArrayRef)>();
  if (gather.hasKernelForDispatchKey(flat.key_set().highestPriorityTypeId())) {
    gather.call(flat, grads, offsets);
    return;
  }
  std::vector<at::Tensor> targets, sources;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = grads[i].numel();
    targets.push_back(flat.narrow(0, offsets[i], n));
    sources.push_back(grads[i].as_strided({n}, {1}));  // the grad's dense block in memory order
  }
  at::_foreach_copy_(targets, sources);
}

TORCH_LIBRARY_IMPL(apexlite, CPU, m) { m.impl("flat_gather_", &flat_gather_cpu); }

}  // namespace apexlite
