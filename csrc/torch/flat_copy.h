// Moving fresh grads into a flat grad buffer, for FusedAdam's grad check (flat_grads.cpp), and the CPU
// kernel of apexlite::flat_gather_ (the CUDA one is flat_gather_cuda.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace apexlite {

// Copies each grad into `flat` at its offset: the gather kernel where the device has one (one launch
// whatever the number of grads), else one foreach copy (apexlite's CUDA kernel not loaded).
void copy_into(const at::Tensor& flat, const std::vector<at::Tensor>& grads, const std::vector<int64_t>& offsets);

}  // namespace apexlite
