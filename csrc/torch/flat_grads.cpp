// apexlite._C.flat_grads: the per-step check of one FusedAdam flat buffer set, in one pass over its
// params with no Python per param (apexlite/optimizers/_flat_grads.py holds the same logic in Python,
// used when this library is not loaded, and documents the contract: NOTE [flat grads]).
//
// Given the set's members (params whose .data are views into the set's buffers) it answers whether
// this step can run on the flat buffers, and makes the grads one flat buffer when it can:
// * every member's grad already a view of one buffer of the set's layout: that buffer is returned;
// * some grads are fresh tensors (autograd made them after zero_grad(set_to_none=True)): their values
//   are copied into the buffer and each grad tensor is re-pointed into it (same Python object, shape,
//   strides and values; only its storage changes), so .grad keeps its identity and later in-place
//   writes (autograd accumulation, the unscaled grads of a GradScaler step) land in the buffer;
// * or, when the caller asks for it (grad_reads), the grads are handed back as a GradList (grad_list.h),
//   one per member,
//   to be read where they are by apexlite::fused_adam_flat_grad_list_: nothing is copied or re-pointed.
//   Always so, when the caller's kernels can read grads in place, for fresh grads that cannot move (views,
//   memory other tensors share: the unbound grads of a stacked tensor) but hold elements of their own;
// * anything else (a missing grad, another dtype or layout, a grad other tensors share that cannot be
//   read in place, a replaced param) is reported with a reason, and nothing has been changed.
// A ready or read-in-place answer carries, in the reason's place, how many grads were fresh.
// Member params' version counters are bumped (the kernel writes them raw).
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "flat_copy.h"
#include "grad_checks.h"
#include "grad_list.h"
#include "member_scan.h"

namespace apexlite {
namespace {

enum Status : int { kReady = 0, kListPath = 1, kRebuild = 2, kReadInPlace = 3 };
// When fresh grads are read where they are (apexlite::fused_adam_flat_grad_list_) instead of moving
// into the grad buffer. Must match GRAD_READS in apexlite/optimizers/_flat_grads.py.
enum GradReads : int { kMoveFresh = 0, kReadLargeFresh = 1, kReadFresh = 2 };
int status_of(int reason) {
  return reason == kGroupChanged || reason == kParamMoved || reason == kMissingGrad || reason == kGradDtype
             ? kRebuild
             : kListPath;
}

// 1 when the group's params list holds exactly the params of `known` (a tuple), in order; 0 when
// not; -1 with a Python error when it is no sequence.
int same_group(PyObject* group_params, PyObject* known) {
  PyObject* fast = PySequence_Fast(group_params, "a param group's params must be a sequence");
  if (fast == nullptr) return -1;
  bool same = PySequence_Fast_GET_SIZE(fast) == PyTuple_GET_SIZE(known);
  for (Py_ssize_t i = 0; same && i < PyTuple_GET_SIZE(known); ++i) {
    same = PySequence_Fast_GET_ITEM(fast, i) == PyTuple_GET_ITEM(known, i);
  }
  Py_DECREF(fast);
  return same ? 1 : 0;
}

// The set the step's checks take, its per-member tables checked against its members.
SetView set_view(const char* function, PyObject* members, PyObject* masters, PyObject* param_spans_obj,
                 PyObject* offsets_obj, const at::Tensor& grad_like, int64_t total, int64_t shift) {
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  const at::Tensor& param_spans = THPVariable_Unpack(param_spans_obj);
  const at::Tensor& offsets = THPVariable_Unpack(offsets_obj);
  TORCH_CHECK(param_spans.numel() == 2 * count && offsets.numel() == count && param_spans.is_contiguous() &&
                  offsets.is_contiguous() && param_spans.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong,
              "apexlite._C.", function, ": param_spans and offsets must be contiguous int64 tensors of two entries (address, numel) and one entry per member");
  TORCH_CHECK(masters == Py_None || (PyTuple_Check(masters) && PyTuple_GET_SIZE(masters) == count), "apexlite._C.",
              function, ": masters must be None or a tuple of one tensor per member");
  return SetView{members, masters == Py_None ? nullptr : masters, param_spans.data_ptr<int64_t>(),
                 offsets.data_ptr<int64_t>(), shift, (shift + total) * grad_like.element_size(), grad_like.scalar_type()};
}

// The grad buffer's `total` elements from element `shift` of `storage`, as one tensor.
PyObject* wrap_buffer(const c10::Storage& storage, const at::Tensor& grad_like, int64_t total, int64_t shift) {
  at::Tensor flat = at::empty({0}, grad_like.options());
  flat.set_(storage, shift, {total}, {1});
  return THPVariable_Wrap(flat);
}

PyObject* flat_grads(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *group_params, *known, *members, *masters, *param_spans_obj, *offsets_obj, *grad_like_obj;
  long long total, shift;  // the grad buffer: `total` elements from element `shift` of its storage
  long long max_fresh_average;  // > 0: fresh grads larger than this on average are not copied
  int grad_reads;               // a GradReads
  if (!PyArg_ParseTuple(args, "OO!O!OOOOLLLi", &group_params, &PyTuple_Type, &known, &PyTuple_Type, &members,
                        &masters, &param_spans_obj, &offsets_obj, &grad_like_obj, &total, &shift,
                        &max_fresh_average, &grad_reads)) {
    return nullptr;
  }
  const at::Tensor& grad_like = THPVariable_Unpack(grad_like_obj);
  const SetView set = set_view("flat_grads", members, masters, param_spans_obj, offsets_obj, grad_like, total, shift);
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  const auto verdict = [](int reason) { return Py_BuildValue("iiO", status_of(reason), reason, Py_None); };

  const int same = same_group(group_params, known);
  if (same < 0) return nullptr;
  if (!same) return verdict(kGroupChanged);

  // The usual step first: every grad in place, as the last step left it (scan_in_place, a tight loop).
  // Anything else takes the full scan below, which does not bump again the members this one bumped.
  Py_ssize_t kept = 0;
  if (count > 0) {
    const c10::Storage kept_buffer = buffer_at(set, 0);
    if (kept_buffer) kept = scan_in_place(set, kept_buffer.unsafeGetStorageImpl(), 0, count);
    if (kept == count) return Py_BuildValue("inN", kReady, Py_ssize_t{0}, wrap_buffer(kept_buffer, grad_like, total, shift));
  }
  // Reasons that rebuild the layout return at once; the others are noted and the scan goes on, so
  // that a missing grad further on is never hidden behind them (its counter would fall behind).
  c10::Storage buffer;  // the grad buffer the in-place grads share, once one is seen
  // The grads as their .grad slots hold them: no reference is taken (two atomics per member saved),
  // which is safe because nothing in this call runs Python or touches a param's grad.
  std::vector<const at::Tensor*> grads(count);
  std::vector<bool> in_place(count, false);
  std::vector<Py_ssize_t> pinned;  // fresh grads that cannot move (kernels that read grads in place only)
  int64_t in_place_count = 0, fresh_elements = 0;
  int reason = kNone;
  for (Py_ssize_t i = 0; i < count; ++i) {
    prefetch_member(members, i, count);
    const at::Tensor& param = THPVariable_Unpack(PyTuple_GET_ITEM(members, i));
    // The kernel writes the params through raw pointers. Bumped here, while the param is at hand: a
    // step that then takes the per-tensor path bumps them again, which is harmless.
    if (i >= kept) param.unsafeGetTensorImpl()->bump_version();
    if (!param_as_built(set, i, param)) return verdict(kParamMoved);
    const at::Tensor& grad = grad_of(param);
    if (!grad.defined()) return verdict(kMissingGrad);
    if (grad.scalar_type() != set.dtype) return verdict(kGradDtype);
    if (has_master_grad(set, i)) {
      reason = reason ? reason : kMasterGrad;
    } else if (grad.layout() != at::kStrided || grad.device() != param.device() || !same_layout(grad, param)) {
      reason = reason ? reason : kOddGrad;
    }
    if (reason) continue;
    const c10::Storage& storage = grad.storage();
    const bool at_offset = grad.storage_offset() == shift + set.offsets[i];
    if (!buffer && at_offset && static_cast<int64_t>(storage.nbytes()) == set.buffer_bytes) buffer = storage;
    const bool mine = buffer && storage.unsafeGetStorageImpl() == buffer.unsafeGetStorageImpl();
    if (mine && !at_offset) {
      reason = kOddGrad;  // the buffer in another layout
    } else if (!mine && !movable(grad)) {
      if (grad_reads == kMoveFresh || !readable(grad)) {
        reason = kSharedGrad;
      } else {
        pinned.push_back(i);  // fresh, and can only be read where it is
      }
    }
    grads[i] = &grad;
    in_place[i] = mine;
    in_place_count += mine ? 1 : 0;
    fresh_elements += mine ? 0 : grad.numel();
  }
  if (reason) return verdict(reason);
  if (!pinned.empty() && any_shared(grads, pinned, buffer)) return verdict(kSharedGrad);
  const int64_t fresh_count = count - in_place_count;
  const bool large = max_fresh_average > 0 && fresh_elements > max_fresh_average * fresh_count;
  if (!pinned.empty() || (fresh_count > 0 && (grad_reads == kReadFresh || (large && grad_reads != kMoveFresh)))) {
    std::vector<at::Tensor> held;
    held.reserve(static_cast<size_t>(count));
    for (Py_ssize_t i = 0; i < count; ++i) held.push_back(*grads[i]);
    PyObject* list = make_grad_list(std::move(held));
    if (list == nullptr) return nullptr;
    return Py_BuildValue("inN", kReadInPlace, static_cast<Py_ssize_t>(fresh_count), list);
  }
  if (large) return verdict(kLargeFreshGrads);

  // Fresh grads move into the buffer only when no tensor but the in-place grads (and `buffer` here)
  // holds it: an old grad a caller kept would otherwise see its values overwritten. Else all move
  // into a new buffer.
  const bool reuse = buffer && (in_place_count == count || static_cast<int64_t>(buffer.use_count()) == in_place_count + 1);
  at::Tensor flat = at::empty({0}, grad_like.options());
  flat.set_(reuse ? buffer : at::empty({shift + total}, grad_like.options()).storage(), shift, {total}, {1});
  std::vector<at::Tensor> moving;
  std::vector<int64_t> moving_offsets;  // in `flat`
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!(reuse && in_place[i])) {
      moving.push_back(*grads[i]);
      moving_offsets.push_back(set.offsets[i]);
    }
  }
  if (!moving.empty()) copy_into(flat, moving, moving_offsets);
  for (size_t i = 0; i < moving.size(); ++i) {
    c10::TensorImpl* impl = moving[i].unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(flat.storage());
    impl->set_storage_offset(shift + moving_offsets[i]);
  }
  return Py_BuildValue("inN", kReady, static_cast<Py_ssize_t>(moving.size()), THPVariable_Wrap(flat));
  END_HANDLE_TH_ERRORS
}

// The first chunk check of a set that FusedAdam steps in pieces (NOTE [flat grads]): members [begin, end)
// are scanned until one is not exactly as the set left it at its last step, that is, its param where
// the set put it and its grad in place in the set's grad buffer (a grad at its offset, laid out like
// its param, with no master grad). Returns (stop, flat): members [begin, stop) passed and had their
// versions bumped; `flat` is the grad buffer as one tensor (the one passed in, or, when None, made
// from the first member's grad); stop is -1 when begin is 0 and the group's params list changed.
// Nothing else is changed: the members from `stop` on are left to the full check or the per-tensor path.
PyObject* flat_grads_in_place(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *group_params, *known, *members, *masters, *param_spans_obj, *offsets_obj, *grad_like_obj, *flat_obj;
  long long total, shift, begin, end;
  if (!PyArg_ParseTuple(args, "OO!O!OOOOLLLLO", &group_params, &PyTuple_Type, &known, &PyTuple_Type, &members,
                        &masters, &param_spans_obj, &offsets_obj, &grad_like_obj, &total, &shift, &begin, &end,
                        &flat_obj)) {
    return nullptr;
  }
  const at::Tensor& grad_like = THPVariable_Unpack(grad_like_obj);
  const SetView set =
      set_view("flat_grads_in_place", members, masters, param_spans_obj, offsets_obj, grad_like, total, shift);
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  TORCH_CHECK(0 <= begin && begin <= end && end <= count, "apexlite._C.flat_grads_in_place: members [", begin, ", ",
              end, ") is no range of the ", count, " members");
  TORCH_CHECK(flat_obj == Py_None || THPVariable_Check(flat_obj),
              "apexlite._C.flat_grads_in_place: flat must be None or the tensor an earlier call returned");
  if (begin == 0) {
    const int same = same_group(group_params, known);
    if (same < 0) return nullptr;
    if (!same) return Py_BuildValue("LO", -1LL, Py_None);
  }
  c10::Storage buffer;
  if (flat_obj != Py_None) buffer = THPVariable_Unpack(flat_obj).storage();
  if (!buffer && begin < end) buffer = buffer_at(set, begin);
  if (!buffer) return Py_BuildValue("nO", begin, flat_obj);
  const Py_ssize_t stop = scan_in_place(set, buffer.unsafeGetStorageImpl(), begin, end);
  if (flat_obj != Py_None) return Py_BuildValue("nO", stop, flat_obj);
  if (stop == begin) return Py_BuildValue("nO", stop, Py_None);
  return Py_BuildValue("nN", stop, wrap_buffer(buffer, grad_like, total, shift));
  END_HANDLE_TH_ERRORS
}

// zero_grad for one flat buffer set: 0 when done, 1 when its grads are not all in the buffer (the
// caller clears them one by one), 2 when the group's params list changed. set_to_none drops each
// member's grad as `p.grad = None` does. Otherwise, when every member's grad is a plain tensor laid
// out in the set's grad buffer, the buffer is zeroed in one fill and each grad's version advances, as
// `grad.zero_()` on each would do; the params are not touched (zero_grad between forward and backward
// must leave their versions alone).
PyObject* flat_zero_grads(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *group_params, *known, *members, *offsets_obj, *grad_like_obj;
  long long total, shift;
  int set_to_none;
  if (!PyArg_ParseTuple(args, "OO!O!OOLLp", &group_params, &PyTuple_Type, &known, &PyTuple_Type, &members,
                        &offsets_obj, &grad_like_obj, &total, &shift, &set_to_none)) {
    return nullptr;
  }
  const int same = same_group(group_params, known);
  if (same < 0) return nullptr;
  if (!same) return PyLong_FromLong(2);
  const Py_ssize_t count = PyTuple_GET_SIZE(members);
  if (set_to_none) {
    for (Py_ssize_t i = 0; i < count; ++i) THPVariable_Unpack(PyTuple_GET_ITEM(members, i)).mutable_grad().reset();
    return PyLong_FromLong(0);
  }
  const at::Tensor& offset_tensor = THPVariable_Unpack(offsets_obj);
  const at::Tensor& grad_like = THPVariable_Unpack(grad_like_obj);
  TORCH_CHECK(offset_tensor.numel() == count && offset_tensor.is_contiguous() && offset_tensor.scalar_type() == at::kLong,
              "apexlite._C.flat_zero_grads: offsets must be a contiguous int64 tensor of one entry per member");
  if (count == 0) return PyLong_FromLong(0);
  const int64_t* offsets = offset_tensor.data_ptr<int64_t>();
  const at::Tensor& first_grad = grad_of(THPVariable_Unpack(PyTuple_GET_ITEM(members, 0)));
  if (!first_grad.defined() ||
      static_cast<int64_t>(first_grad.storage().nbytes()) != (shift + total) * grad_like.element_size()) {
    return PyLong_FromLong(1);
  }
  const c10::Storage buffer = first_grad.storage();
  if (!grads_all_in(members, offsets, shift, grad_like.scalar_type(), buffer.unsafeGetStorageImpl())) {
    return PyLong_FromLong(1);
  }
  at::Tensor flat = at::empty({0}, grad_like.options());
  flat.set_(buffer, shift, {total}, {1});
  flat.zero_();
  bump_grad_versions(members);
  return PyLong_FromLong(0);
  END_HANDLE_TH_ERRORS
}

PyMethodDef kFunctions[] = {
    {"flat_grads", flat_grads, METH_VARARGS,
     "flat_grads(group_params, known, members, masters, param_spans, offsets, grad_like, total, shift, "
     "max_fresh_average, grad_reads) -> "
     "(status, reason, flat grad or GradList or None): see apexlite/optimizers/_flat_grads.py"},
    {"flat_grads_in_place", flat_grads_in_place, METH_VARARGS,
     "flat_grads_in_place(group_params, known, members, masters, param_spans, offsets, grad_like, total, shift, begin, "
     "end, flat) -> (stop, flat): see apexlite/optimizers/_flat_grads.py"},
    {"flat_zero_grads", flat_zero_grads, METH_VARARGS,
     "flat_zero_grads(group_params, known, members, offsets, grad_like, total, shift, set_to_none) -> "
     "0 (done), 1 (grads not all in the buffer) or 2 (params list changed): see apexlite/optimizers/_flat_grads.py"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int register_flat_grad_functions(PyObject* module) { return PyModule_AddFunctions(module, kFunctions); }

}  // namespace apexlite
