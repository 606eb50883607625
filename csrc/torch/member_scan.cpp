// The per-member passes of FusedAdam's grad checks: see member_scan.h.
#include "member_scan.h"

#include <torch/csrc/autograd/python_variable.h>

#include <ATen/Parallel.h>

#include <atomic>

#include "grad_checks.h"

namespace apexlite {
namespace {

// The parallel scan's grain: a longer range is cut into at most range / grain parts, one a thread (a cold
// member costs 25-160 ns to scan; waking the intra-op threads, a few us).
constexpr int64_t kScanGrain = 256;

// How far ahead prefetch_member's stages start.
constexpr Py_ssize_t kAhead = 4;

const at::Tensor& param_at(PyObject* members, Py_ssize_t i) { return THPVariable_Unpack(PyTuple_GET_ITEM(members, i)); }

void prefetch_lines(const void* address) {
  const char* bytes = static_cast<const char*>(address);
  for (int line = 0; line < 3; ++line) __builtin_prefetch(bytes + 64 * line);
}

bool in_place_at(const SetView& set, const c10::StorageImpl* buffer, Py_ssize_t i) {
  const at::Tensor& param = param_at(set.members, i);
  if (address_of(param) != set.expected[i]) return false;
  const at::Tensor& grad = grad_of(param);
  return lies_at(grad, param, set.dtype, set.shift + set.offsets[i]) &&
         grad.storage().unsafeGetStorageImpl() == buffer && !has_master_grad(set, i);
}

void bump(PyObject* members, Py_ssize_t i) { param_at(members, i).unsafeGetTensorImpl()->bump_version(); }

// Lowers `first` to `i` when `i` is lower.
void lower_to(std::atomic<int64_t>& first, int64_t i) {
  int64_t seen = first.load();
  while (i < seen && !first.compare_exchange_weak(seen, i)) {
  }
}

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

// The first part bumps its members as it goes (a miss there is the first miss); the other parts' members
// wait until the first miss is known, then are bumped in a second parallel pass (their lines still cached).
Py_ssize_t scan_in_place(const SetView& set, const c10::StorageImpl* buffer, Py_ssize_t begin, Py_ssize_t end) {
  std::atomic<int64_t> first_miss{end};
  int64_t first_part_end = end;
  at::parallel_for(begin, end, kScanGrain, [&](int64_t part_begin, int64_t part_end) {
    const bool first_part = part_begin == begin;
    if (first_part) first_part_end = part_end;
    for (int64_t i = part_begin; i < part_end && i < first_miss.load(std::memory_order_relaxed); ++i) {
      prefetch_member(set.members, i, part_end);
      if (!in_place_at(set, buffer, i)) {
        lower_to(first_miss, i);
        return;
      }
      if (first_part) bump(set.members, i);
    }
  });
  const int64_t stop = first_miss.load();
  if (stop > first_part_end) {
    at::parallel_for(first_part_end, stop, kScanGrain, [&](int64_t part_begin, int64_t part_end) {
      for (int64_t i = part_begin; i < part_end; ++i) bump(set.members, i);
    });
  }
  return static_cast<Py_ssize_t>(stop);
}

bool grads_all_in(PyObject* members, const int64_t* offsets, int64_t shift, at::ScalarType dtype,
                  const c10::StorageImpl* buffer) {
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  std::atomic<bool> all_in{true};
  at::parallel_for(0, count, kScanGrain, [&](int64_t part_begin, int64_t part_end) {
    for (int64_t i = part_begin; i < part_end && all_in.load(std::memory_order_relaxed); ++i) {
      prefetch_member(members, i, part_end);
      const at::Tensor& param = param_at(members, i);
      const at::Tensor& grad = grad_of(param);
      if (!lies_at(grad, param, dtype, shift + offsets[i]) || grad.requires_grad() ||
          grad.storage().unsafeGetStorageImpl() != buffer) {
        all_in.store(false, std::memory_order_relaxed);
      }
    }
  });
  return all_in.load();
}

void bump_grad_versions(PyObject* members) {
  at::parallel_for(0, PyTuple_GET_SIZE(members), kScanGrain, [&](int64_t part_begin, int64_t part_end) {
    for (int64_t i = part_begin; i < part_end; ++i) grad_of(param_at(members, i)).unsafeGetTensorImpl()->bump_version();
  });
}

}  // namespace apexlite
