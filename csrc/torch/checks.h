// Argument checks shared by the CPU and CUDA bindings of apexlite::fused_adam_. Every message says
// which tensor is wrong, what was expected, and how the Python layer normally avoids the problem.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace apexlite {

inline bool is_float_kind(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline void check_same_layout(const at::Tensor& t, const at::Tensor& param, const char* list, size_t i) {
  TORCH_CHECK(t.device() == param.device(), "apexlite.fused_adam_: ", list, "[", i, "] is on ",
              t.device(), " but params[", i, "] is on ", param.device(),
              "; all tensors of one call must share a device (FusedAdam groups params by device).");
  TORCH_CHECK(t.numel() == param.numel(), "apexlite.fused_adam_: ", list, "[", i, "] has ",
              t.numel(), " elements but params[", i, "] has ", param.numel(), ".");
  TORCH_CHECK(t.layout() == at::kStrided, "apexlite.fused_adam_: ", list, "[", i,
              "] is sparse; FusedAdam needs dense tensors (use torch.optim.SparseAdam for sparse grads).");
  TORCH_CHECK(t.numel() <= 1 || t.strides() == param.strides(), "apexlite.fused_adam_: ", list, "[",
              i, "] has strides ", t.strides(), " but params[", i, "] has ", param.strides(),
              "; make it match with torch.empty_like(param, dtype=...).copy_(tensor).");
}

inline void check_uniform_dtype(at::TensorList list, const char* name) {
  for (size_t i = 1; i < list.size(); ++i) {
    TORCH_CHECK(list[i].scalar_type() == list[0].scalar_type(), "apexlite.fused_adam_: ", name, "[", i,
                "] is ", list[i].scalar_type(), " but ", name, "[0] is ", list[0].scalar_type(),
                "; each list must hold one dtype (FusedAdam groups params by dtype before the call).");
  }
}

inline void check_flag(const c10::optional<at::Tensor>& t, const at::Device& device, const char* name) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->numel() == 1, "apexlite.fused_adam_: ", name,
              " must be a 1-element float32 tensor, got ", t->scalar_type(), " with ", t->numel(),
              " elements.");
  TORCH_CHECK(t->device() == device, "apexlite.fused_adam_: ", name, " is on ", t->device(),
              " but the params are on ", device, "; move it with .to(params[0].device).");
}

// Validates the whole argument set of apexlite::fused_adam_ for the given backend.
inline void check_fused_adam_args(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                  at::TensorList exp_avg_sqs, at::TensorList state_steps,
                                  at::TensorList model_copies, const c10::optional<at::Tensor>& grad_scale,
                                  const c10::optional<at::Tensor>& found_inf, at::DeviceType backend) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  state_steps.size() == n && (model_copies.empty() || model_copies.size() == n),
              "apexlite.fused_adam_: list lengths differ (params ", n, ", grads ", grads.size(),
              ", exp_avgs ", exp_avgs.size(), ", exp_avg_sqs ", exp_avg_sqs.size(), ", state_steps ",
              state_steps.size(), ", model_copies ", model_copies.size(),
              "); model_copies may be empty, every other list needs one entry per param.");
  if (n == 0) return;
  const at::Device device = params[0].device();
  TORCH_CHECK(device.type() == backend, "apexlite.fused_adam_: the ", c10::DeviceTypeName(backend),
              " kernel got tensors on ", device, "; the op picks its kernel from the tensors' device, so "
              "pass tensors on one device (e.g. .to('cuda')).");
  check_uniform_dtype(params, "params");
  check_uniform_dtype(grads, "grads");
  check_uniform_dtype(exp_avgs, "exp_avgs");
  check_uniform_dtype(exp_avg_sqs, "exp_avg_sqs");
  check_uniform_dtype(model_copies, "model_copies");
  TORCH_CHECK(is_float_kind(params[0].scalar_type()) && is_float_kind(grads[0].scalar_type()),
              "apexlite.fused_adam_: params and grads must be float32, float16 or bfloat16; got ",
              params[0].scalar_type(), " params and ", grads[0].scalar_type(), " grads.");
  const at::ScalarType moment = exp_avgs[0].scalar_type();
  TORCH_CHECK((moment == at::kFloat || moment == at::kBFloat16) &&
                  exp_avg_sqs[0].scalar_type() == moment,
              "apexlite.fused_adam_: exp_avgs and exp_avg_sqs must both be float32 or both bfloat16; got ",
              moment, " and ", exp_avg_sqs[0].scalar_type(), ".");
  if (!model_copies.empty()) {
    const at::ScalarType copy = model_copies[0].scalar_type();
    TORCH_CHECK(params[0].scalar_type() == at::kFloat && (copy == at::kHalf || copy == at::kBFloat16),
                "apexlite.fused_adam_: model_copies must be float16 or bfloat16 copies of float32 params; "
                "got ", copy, " copies of ", params[0].scalar_type(), " params.");
  }
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.device() == device, "apexlite.fused_adam_: params[", i, "] is on ", p.device(),
                " but params[0] is on ", device, "; call the op once per device.");
    TORCH_CHECK(p.layout() == at::kStrided && p.is_non_overlapping_and_dense(),
                "apexlite.fused_adam_: params[", i, "] (shape ", p.sizes(), ", strides ", p.strides(),
                ") does not cover a dense block of memory; pass a contiguous tensor or use the "
                "pure-torch path (apexlite.optimizers._reference).");
    check_same_layout(grads[i], p, "grads", i);
    check_same_layout(exp_avgs[i], p, "exp_avgs", i);
    check_same_layout(exp_avg_sqs[i], p, "exp_avg_sqs", i);
    if (!model_copies.empty()) check_same_layout(model_copies[i], p, "model_copies", i);
    const at::Tensor& s = state_steps[i];
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.numel() == 1 && s.device() == device,
                "apexlite.fused_adam_: state_steps[", i, "] must be a 1-element float32 tensor on ", device,
                "; got ", s.scalar_type(), " with ", s.numel(), " elements on ", s.device(), ".");
  }
  check_flag(grad_scale, device, "grad_scale");
  check_flag(found_inf, device, "found_inf");
}

inline void check_flat_role(const at::Tensor& t, const at::Tensor& param, const char* name) {
  TORCH_CHECK(t.device() == param.device(), "apexlite.fused_adam_flat_: ", name, " is on ", t.device(),
              " but param is on ", param.device(), "; every buffer of one call lives on one device.");
  TORCH_CHECK(t.layout() == at::kStrided && t.dim() == 1 && t.is_contiguous() && t.numel() == param.numel(),
              "apexlite.fused_adam_flat_: ", name, " must be a contiguous 1-D tensor of ", param.numel(),
              " elements like param; got shape ", t.sizes(), " with strides ", t.strides(), ".");
}

// Validates the arguments of apexlite::fused_adam_flat_ (one flat buffer per role) for the given backend.
inline void check_fused_adam_flat_args(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                                       const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                                       const c10::optional<at::Tensor>& model_copy,
                                       const c10::optional<at::Tensor>& grad_scale,
                                       const c10::optional<at::Tensor>& found_inf, at::DeviceType backend) {
  TORCH_CHECK(param.device().type() == backend, "apexlite.fused_adam_flat_: the ", c10::DeviceTypeName(backend),
              " kernel got tensors on ", param.device(), "; the op picks its kernel from param's device.");
  TORCH_CHECK(param.layout() == at::kStrided && param.dim() == 1 && param.is_contiguous(),
              "apexlite.fused_adam_flat_: param must be a contiguous 1-D buffer; got shape ", param.sizes(),
              " with strides ", param.strides(), ".");
  check_flat_role(grad, param, "grad");
  check_flat_role(exp_avg, param, "exp_avg");
  check_flat_role(exp_avg_sq, param, "exp_avg_sq");
  TORCH_CHECK(is_float_kind(param.scalar_type()) && is_float_kind(grad.scalar_type()),
              "apexlite.fused_adam_flat_: param and grad must be float32, float16 or bfloat16; got ",
              param.scalar_type(), " and ", grad.scalar_type(), ".");
  const at::ScalarType moment = exp_avg.scalar_type();
  TORCH_CHECK((moment == at::kFloat || moment == at::kBFloat16) && exp_avg_sq.scalar_type() == moment,
              "apexlite.fused_adam_flat_: exp_avg and exp_avg_sq must both be float32 or both bfloat16; got ",
              moment, " and ", exp_avg_sq.scalar_type(), ".");
  if (model_copy.has_value()) {
    check_flat_role(*model_copy, param, "model_copy");
    const at::ScalarType copy = model_copy->scalar_type();
    TORCH_CHECK(param.scalar_type() == at::kFloat && (copy == at::kHalf || copy == at::kBFloat16),
                "apexlite.fused_adam_flat_: model_copy must be a float16 or bfloat16 copy of a float32 param "
                "buffer; got a ", copy, " copy of a ", param.scalar_type(), " buffer.");
  }
  TORCH_CHECK(steps.scalar_type() == at::kFloat && steps.dim() == 1 && steps.is_contiguous() &&
                  steps.numel() >= 1 && steps.device() == param.device(),
              "apexlite.fused_adam_flat_: steps must be a contiguous 1-D float32 tensor of one counter per "
              "param, on ", param.device(), "; got ", steps.scalar_type(), " of shape ", steps.sizes(), " on ",
              steps.device(), ".");
  check_flag(grad_scale, param.device(), "grad_scale");
  check_flag(found_inf, param.device(), "found_inf");
}

// Validates the grads of apexlite::fused_adam_flat_grad_list_ against its buffers (checked by
// check_fused_adam_flat_args, with `param` standing in for the grad buffer): one dense grad per counter,
// all of one float dtype on param's device, their element ranges in order, apart and inside the buffers.
inline void check_flat_grad_list(const at::Tensor& param, at::TensorList grads, const at::Tensor& offsets,
                                 const at::Tensor& steps) {
  const int64_t count = static_cast<int64_t>(grads.size());
  TORCH_CHECK(offsets.device().is_cpu() && offsets.scalar_type() == at::kLong && offsets.dim() == 1 &&
                  offsets.is_contiguous() && offsets.numel() == count && steps.numel() == count,
              "apexlite.fused_adam_flat_grad_list_: offsets must be a contiguous 1-D int64 CPU tensor and steps "
              "hold one entry per grad; got ", count, " grads, ", offsets.numel(), " offsets on ", offsets.device(),
              " and ", steps.numel(), " counters.");
  const int64_t* start = offsets.data_ptr<int64_t>();
  int64_t end = 0;
  for (int64_t i = 0; i < count; ++i) {
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.device() == param.device() && g.layout() == at::kStrided && g.is_non_overlapping_and_dense() &&
                    g.scalar_type() == grads[0].scalar_type() && is_float_kind(g.scalar_type()),
                "apexlite.fused_adam_flat_grad_list_: grads[", i, "] must be a dense float32, float16 or bfloat16 "
                "tensor of grads[0]'s dtype on ", param.device(), "; got ", g.scalar_type(), " on ", g.device(),
                " with strides ", g.strides(), ".");
    TORCH_CHECK(start[i] >= end && start[i] + g.numel() <= param.numel(), "apexlite.fused_adam_flat_grad_list_: "
                "grads[", i, "] (", g.numel(), " elements at offset ", start[i], ") overlaps the grad before it "
                "or leaves the buffers (", param.numel(), " elements); give offsets in order, one range per grad.");
    end = start[i] + g.numel();
  }
}

// Validates the arguments of apexlite::flat_gather_ for the given backend.
inline void check_flat_gather_args(const at::Tensor& flat, at::TensorList sources, at::IntArrayRef offsets,
                                   at::DeviceType backend) {
  TORCH_CHECK(flat.device().type() == backend && flat.layout() == at::kStrided && flat.dim() == 1 &&
                  flat.is_contiguous(),
              "apexlite.flat_gather_: flat must be a contiguous 1-D ", c10::DeviceTypeName(backend),
              " tensor; got shape ", flat.sizes(), " on ", flat.device(), ".");
  TORCH_CHECK(offsets.size() == sources.size(), "apexlite.flat_gather_: ", sources.size(), " sources but ",
              offsets.size(), " offsets; give one offset per source.");
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& s = sources[i];
    TORCH_CHECK(s.device() == flat.device() && s.scalar_type() == flat.scalar_type() && s.layout() == at::kStrided &&
                    s.is_non_overlapping_and_dense(),
                "apexlite.flat_gather_: sources[", i, "] must be a dense ", flat.scalar_type(), " tensor on ",
                flat.device(), " (its elements one block of memory); got ", s.scalar_type(), " on ", s.device(),
                " with strides ", s.strides(), ".");
    TORCH_CHECK(offsets[i] >= 0 && offsets[i] + s.numel() <= flat.numel(), "apexlite.flat_gather_: sources[", i,
                "] (", s.numel(), " elements) does not fit in flat (", flat.numel(), ") at offset ", offsets[i], ".");
  }
}

// Whether any two non-empty tensors of the list touch the same bytes (weights tied with `b.data = a.data`,
// or views that partly overlap): their updates must then run one after the other, as torch's for-loop
// Adam runs them, never at once. Each tensor's extent runs from its lowest to its highest element.
inline bool memory_overlaps(at::TensorList list) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;  // [first byte, one past the last byte)
  spans.reserve(list.size());
  for (const at::Tensor& t : list) {
    if (t.numel() == 0) continue;
    int64_t low = 0, high = 0;  // element offsets of the lowest and highest element from data_ptr
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? low : high) += reach;
    }
    const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
    const auto size = static_cast<int64_t>(t.element_size());
    spans.emplace_back(start + low * size, start + (high + 1) * size);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) return true;
    spans[i].second = std::max(spans[i].second, spans[i - 1].second);
  }
  return false;
}

}  // namespace apexlite
