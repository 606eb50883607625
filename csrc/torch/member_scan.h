// The per-member scans of FusedAdam's grad checks and zero_grad (flat_grads.cpp), on the calling thread. A
// scan of a cold set waits on cache misses (about ten scattered lines a member), so each member's lines are
// prefetched a few members ahead. The scans once ran in parts on the intra-op threads: a third faster on a
// quiet machine at 10,000 params (2 cores), but a parallel region ends at a barrier for all its
// threads, and beside one busy process (a data loader's worker, say) a thread the scheduler did not run in time
// stalled one call in ten or more by 4-24 ms (BENCHMARKS.md, "The scans on the calling thread again").
#pragma once

#include <torch/csrc/python_headers.h>

#include <ATen/ATen.h>

#include <cstdint>

#include "grad_checks.h"

namespace apexlite {

// Why a set's step leaves the flat buffers. Must match REASONS in apexlite/optimizers/_flat_grads.py.
enum Reason : int {
  kNone = 0,
  kGroupChanged = 1,
  kParamMoved = 2,
  kMissingGrad = 3,
  kGradDtype = 4,
  kMasterGrad = 5,
  kOddGrad = 6,
  kSharedGrad = 7,
  kLargeFreshGrads = 8,
};

// A set's members as the checks read them (borrowed: the caller holds the tuples and tables).
struct SetView {
  PyObject* members;        // tuple of params
  PyObject* masters;        // tuple of fp32 masters, or nullptr
  const int64_t* expected;  // each param's data address and numel when the set was built, in pairs
  const int64_t* offsets;   // each member's offset in the grad buffer
  int64_t shift;            // where the grad buffer starts in its storage (elements)
  int64_t buffer_bytes;     // the grad buffer's storage size
  at::ScalarType dtype;     // the grads' dtype
};

// Whether member i's param is where, and as large as, the set built it (a replaced .data is not). Inline: it
// runs once per member per step, in two translation units.
inline bool param_as_built(const SetView& set, Py_ssize_t i, const at::Tensor& param) {
  return address_of(param) == set.expected[2 * i] && param.unsafeGetTensorImpl()->numel() == set.expected[2 * i + 1];
}

// Whether member i's fp32 master holds a grad of its own (amp O2 with clipping or accumulation).
bool has_master_grad(const SetView& set, Py_ssize_t i);

// The grad buffer as member `i`'s grad finds it: that grad's storage when it has the buffer's size, else none.
c10::Storage buffer_at(const SetView& set, Py_ssize_t i);

// The first member of [begin, end) not exactly as the set left it (end when all are): its param where the
// set put it, its grad in place in `buffer` (at its offset, laid out like its param), no master grad.
// The members before it have their versions bumped (the kernel writes them through raw pointers); no other.
Py_ssize_t scan_in_place(const SetView& set, const c10::StorageImpl* buffer, Py_ssize_t begin, Py_ssize_t end);

// zero_grad's check of kept grads: whether every member's grad is a plain tensor (not requiring grad) of
// `dtype` laid out like its param from element shift + offsets[i] of `buffer`. Changes nothing.
bool grads_all_in(PyObject* members, const int64_t* offsets, int64_t shift, at::ScalarType dtype,
                  const c10::StorageImpl* buffer);

// Advances every member's grad version by one, as grad.zero_() on each would.
void bump_grad_versions(PyObject* members);

// Starts loading what a scan of member i reads, for the members up to `end`, in stages (each needs the
// previous one's pointer): the objects of one param sit at scattered addresses, and a cold pass waits on
// each miss in turn.
void prefetch_member(PyObject* members, Py_ssize_t i, Py_ssize_t end);

}  // namespace apexlite
