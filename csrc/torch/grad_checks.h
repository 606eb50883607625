// What FusedAdam's grad check (flat_grads.cpp) asks of one param and its grad; the Python twins are in
// apexlite/optimizers/_grad_checks.py, the same rules at Python speed.
#pragma once

#include <torch/csrc/python_headers.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace apexlite {

// Equal strides on every dim that addresses memory (size > 1): the same dense block, element for element.
inline bool same_layout(const at::Tensor& grad, const at::Tensor& param) {
  // sizes and strides read once each (Tensor::size(d) and stride(d) wrap and check d on every call)
  const c10::TensorImpl* grad_impl = grad.unsafeGetTensorImpl();
  const c10::TensorImpl* param_impl = param.unsafeGetTensorImpl();
  const c10::IntArrayRef sizes = param_impl->sizes();
  if (grad_impl->sizes() != sizes) return false;
  const c10::IntArrayRef grad_strides = grad_impl->strides();
  const c10::IntArrayRef param_strides = param_impl->strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 1 && grad_strides[d] != param_strides[d]) return false;
  }
  return true;
}

// A grad defined, of `dtype`, dense, on its param's device and laid out like it from element `start` of
// its storage: where a set's grad buffer holds it (the storage itself is checked by the caller).
inline bool lies_at(const at::Tensor& grad, const at::Tensor& param, at::ScalarType dtype, int64_t start) {
  return grad.defined() && grad.scalar_type() == dtype && grad.layout() == at::kStrided &&
         grad.device() == param.device() && grad.storage_offset() == start && same_layout(grad, param);
}

// A param's .grad as its autograd metadata holds it. Tensor::grad() would also check, on every call,
// whether a missing grad deserves a warning (a non-leaf tensor's): about a third of the scan's work.
inline const at::Tensor& grad_of(const at::Tensor& param) { return param.unsafeGetTensorImpl()->grad(); }

// Where a param's data starts, as data_ptr() gives it, without data_ptr()'s checks (the members are
// dense tensors with storage, checked when the set was built).
inline int64_t address_of(const at::Tensor& param) {
  const c10::TensorImpl* impl = param.unsafeGetTensorImpl();
  return reinterpret_cast<int64_t>(static_cast<const char*>(impl->unsafe_storage().data()) +
                                   impl->storage_offset() * static_cast<int64_t>(impl->itemsize()));
}

// A grad whose storage apexlite may re-point: its own memory, referenced by no other tensor.
inline bool movable(const at::Tensor& grad) {
  const c10::TensorImpl* impl = grad.unsafeGetTensorImpl();
  return !grad.is_view() && !grad.requires_grad() && impl->allow_tensor_metadata_change() && !grad.is_inference() &&
         !grad.key_set().has(c10::DispatchKey::Python) && grad.storage().use_count() == 1;
}

// A grad the kernels can read where it is though it cannot move (a view, memory other tensors share):
// plain memory (no Python subclass) holding the values as they read (no lazy negation).
inline bool readable(const at::Tensor& grad) { return !grad.key_set().has(c10::DispatchKey::Python) && !grad.is_neg(); }

// Whether any two of the grads at `pinned` share memory, or one lies in `buffer`: such grads are read
// where they are only when each element belongs to one grad (the kernels may write the unscaled grads).
inline bool any_shared(const std::vector<const at::Tensor*>& grads, const std::vector<Py_ssize_t>& pinned,
                       const c10::Storage& buffer) {
  struct Extent {
    const c10::StorageImpl* storage;
    int64_t begin, end;
  };
  std::vector<Extent> extents;
  extents.reserve(pinned.size());
  for (const Py_ssize_t i : pinned) {
    const at::Tensor& grad = *grads[i];
    const c10::StorageImpl* storage = grad.storage().unsafeGetStorageImpl();
    if (buffer && storage == buffer.unsafeGetStorageImpl()) return true;
    extents.push_back(Extent{storage, grad.storage_offset(), grad.storage_offset() + grad.numel()});
  }
  const auto before = [](const Extent& a, const Extent& b) {
    return a.storage != b.storage ? a.storage < b.storage : a.begin < b.begin;
  };
  if (!std::is_sorted(extents.begin(), extents.end(), before)) {  // (views of one tensor come in order)
    std::sort(extents.begin(), extents.end(), before);
  }
  for (size_t k = 1; k < extents.size(); ++k) {
    if (extents[k].storage == extents[k - 1].storage && extents[k].begin < extents[k - 1].end) return true;
  }
  return false;
}

}  // namespace apexlite
