// The per-member passes of FusedAdam's grad checks: see member_scan.h.
#include "member_scan.h"

#include <torch/csrc/autograd/python_variable.h>

#include "grad_checks.h"

namespace apexlite {
namespace {

// How far ahead prefetch_member's stages start.
constexpr Py_ssize_t kAhead = 4;

const at::Tensor& param_at(PyObject* members, Py_ssize_t i) { return THPVariable_Unpack(PyTuple_GET_ITEM(members, i)); }

void prefetch_lines(const void* address) {
  const char* bytes = static_cast<const char*>(address);
  for (int line = 0; line < 3; ++line) __builtin_prefetch(bytes + 64 * line);
}

bool in_place_at(const SetView& set, const c10::StorageImpl* buffer, Py_ssize_t i) {
  const at::Tensor& param = param_at(set.members, i);
  if (!param_as_built(set, i, param)) return false;
  const at::Tensor& grad = grad_of(param);
  return lies_at(grad, param, set.dtype, set.shift + set.offsets[i]) &&
         grad.storage().unsafeGetStorageImpl() == buffer && !has_master_grad(set, i);
}

void bump(PyObject* members, Py_ssize_t i) { param_at(members, i).unsafeGetTensorImpl()->bump_version(); }

}  // namespace

void prefetch_member(PyObject* members, Py_ssize_t i, Py_ssize_t end) {
  if (i + 3 * kAhead < end) __builtin_prefetch(PyTuple_GET_ITEM(members, i + 3 * kAhead));
  if (i + 2 * kAhead < end) prefetch_lines(param_at(members, i + 2 * kAhead).unsafeGetTensorImpl());
  if (i + kAhead < end) {
    const c10::AutogradMetaInterface* meta = param_at(members, i + kAhead).unsafeGetTensorImpl()->autograd_meta();
    if (meta != nullptr) __builtin_prefetch(meta);
  }
  if (i + 1 < end) {
    const at::Tensor& next_grad = grad_of(param_at(members, i + 1));
    if (next_grad.defined()) prefetch_lines(next_grad.unsafeGetTensorImpl());
  }
}

bool has_master_grad(const SetView& set, Py_ssize_t i) {
  return set.masters != nullptr && grad_of(param_at(set.masters, i)).defined();
}

c10::Storage buffer_at(const SetView& set, Py_ssize_t i) {
  const at::Tensor& grad = grad_of(param_at(set.members, i));
  if (grad.defined() && static_cast<int64_t>(grad.storage().nbytes()) == set.buffer_bytes) return grad.storage();
  return c10::Storage();
}

Py_ssize_t scan_in_place(const SetView& set, const c10::StorageImpl* buffer, Py_ssize_t begin, Py_ssize_t end) {
  for (Py_ssize_t i = begin; i < end; ++i) {
    prefetch_member(set.members, i, end);
    if (!in_place_at(set, buffer, i)) return i;
    bump(set.members, i);
  }
  return end;
}

bool grads_all_in(PyObject* members, const int64_t* offsets, int64_t shift, at::ScalarType dtype,
                  const c10::StorageImpl* buffer) {
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  for (Py_ssize_t i = 0; i < count; ++i) {
    prefetch_member(members, i, count);
    const at::Tensor& param = param_at(members, i);
    const at::Tensor& grad = grad_of(param);
    if (!lies_at(grad, param, dtype, shift + offsets[i]) || grad.requires_grad() ||
        grad.storage().unsafeGetStorageImpl() != buffer) {
      return false;
    }
  }
  return true;
}

void bump_grad_versions(PyObject* members) {
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  for (Py_ssize_t i = 0; i < count; ++i) grad_of(param_at(members, i)).unsafeGetTensorImpl()->bump_version();
}

}  // namespace apexlite
