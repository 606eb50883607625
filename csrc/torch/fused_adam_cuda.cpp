// CUDA bindings of apexlite::fused_adam_, fused_adam_flat_ and fused_adam_flat_grad_list_: validate the
// tensors (checks.h), turn them into raw pointers and hand them to the torch-free launchers in
// csrc/cuda/fused_adam.cu, fused_adam_flat.cu and fused_adam_flat_table.cu on torch's current stream. Nothing here waits for the device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "../cuda/launchers.h"
#include "checks.h"
#include "device_table.h"
#include "grad_runs.h"

namespace apexlite {
namespace {

cuda::FloatKind kind_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return cuda::FloatKind::kFloat16;
    case at::kBFloat16: return cuda::FloatKind::kBFloat16;
    default: return cuda::FloatKind::kFloat32;
  }
}

std::vector<void*> pointers(at::TensorList list) {
  std::vector<void*> out;
  out.reserve(list.size());
  for (const at::Tensor& t : list) out.push_back(t.data_ptr());
  return out;
}

// One call of the list kernel (csrc/cuda/fused_adam.cu): per-tensor device pointers in host arrays, and
// each list's element type (copy_kind is ignored when `copies` is empty).
struct ListCall {
  std::vector<void*> params, grads, exp_avgs, exp_avg_sqs, copies;
  std::vector<float*> steps;
  std::vector<int64_t> numels;
  cuda::FloatKind param_kind, grad_kind, moment_kind, copy_kind;
};

void launch_list_call(const ListCall& call, const AdamHyper& hyper, bool adam_w_mode,
                      const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                      bool unscale_grads, const char* op) {
  cuda::AdamTensorLists lists;
  lists.params = call.params.data();
  lists.grads = call.grads.data();
  lists.exp_avgs = call.exp_avgs.data();
  lists.exp_avg_sqs = call.exp_avg_sqs.data();
  lists.model_copies = call.copies.empty() ? nullptr : call.copies.data();
  lists.steps = call.steps.data();
  lists.numels = call.numels.data();
  lists.count = static_cast<int64_t>(call.params.size());
  lists.param_kind = call.param_kind;
  lists.grad_kind = call.grad_kind;
  lists.moment_kind = call.moment_kind;
  lists.copy_kind = call.copy_kind;
  lists.unscale_grads = unscale_grads;
  const cudaError_t error = cuda::launch_fused_adam(
      lists, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr,
      found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.", op, ": CUDA launch failed: ", cudaGetErrorString(error));
}

void fused_adam_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList state_steps, at::TensorList model_copies,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     bool bias_correction, bool adam_w_mode, const c10::optional<at::Tensor>& grad_scale,
                     const c10::optional<at::Tensor>& found_inf, bool unscale_grads) {
  check_fused_adam_args(params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies, grad_scale,
                        found_inf, at::kCUDA);
  if (params.empty()) return;
  const c10::cuda::CUDAGuard device_guard(params[0].device());
  ListCall call{pointers(params), pointers(grads), pointers(exp_avgs), pointers(exp_avg_sqs), pointers(model_copies),
                {}, {}, kind_of(params[0]), kind_of(grads[0]), kind_of(exp_avgs[0]),
                model_copies.empty() ? cuda::FloatKind::kFloat16 : kind_of(model_copies[0])};
  for (size_t i = 0; i < params.size(); ++i) {
    call.steps.push_back(state_steps[i].data_ptr<float>());
    call.numels.push_back(params[i].numel());
  }
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};
  if (!memory_overlaps(params)) {
    launch_list_call(call, hyper, adam_w_mode, grad_scale, found_inf, unscale_grads, "fused_adam_");
    return;
  }
  // Params that share memory (weights tied with `b.data = a.data`) step one launch each, in list order, as
  // torch's for-loop Adam steps them: the blocks of one launch run at once and would race on that memory.
  for (size_t i = 0; i < params.size(); ++i) {
    const auto one = [i](const auto& all) { return all.empty() ? all : std::decay_t<decltype(all)>{all[i]}; };
    const ListCall single{one(call.params), one(call.grads), one(call.exp_avgs), one(call.exp_avg_sqs),
                          one(call.copies), one(call.steps), one(call.numels), call.param_kind, call.grad_kind,
                          call.moment_kind, call.copy_kind};
    launch_list_call(single, hyper, adam_w_mode, grad_scale, found_inf, unscale_grads, "fused_adam_");
  }
}

// The flat launchers' view of the buffers; without a grad buffer (`grad` undefined: the grads come by
// table) the grad pointer is null and the grad kind is the caller's to set.
cuda::AdamFlatBuffers flat_buffers(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                                   const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                                   const c10::optional<at::Tensor>& model_copy, bool unscale_grads) {
  cuda::AdamFlatBuffers buffers;
  buffers.param = param.data_ptr();
  buffers.grad = grad.defined() ? grad.data_ptr() : nullptr;
  buffers.exp_avg = exp_avg.data_ptr();
  buffers.exp_avg_sq = exp_avg_sq.data_ptr();
  buffers.model_copy = model_copy.has_value() ? model_copy->data_ptr() : nullptr;
  buffers.steps = steps.data_ptr<float>();
  buffers.numel = param.numel();
  buffers.step_count = steps.numel();
  buffers.param_kind = kind_of(param);
  buffers.grad_kind = grad.defined() ? kind_of(grad) : cuda::FloatKind::kFloat32;
  buffers.moment_kind = kind_of(exp_avg);
  buffers.copy_kind = model_copy.has_value() ? kind_of(*model_copy) : cuda::FloatKind::kFloat16;
  buffers.unscale_grads = unscale_grads;
  return buffers;
}

void fused_adam_flat_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                          const c10::optional<at::Tensor>& model_copy, double lr, double beta1, double beta2,
                          double eps, double weight_decay, bool bias_correction, bool adam_w_mode,
                          const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                          bool unscale_grads) {
  check_fused_adam_flat_args(param, grad, exp_avg, exp_avg_sq, steps, model_copy, grad_scale, found_inf, at::kCUDA);
  const c10::cuda::CUDAGuard device_guard(param.device());
  const cuda::AdamFlatBuffers buffers = flat_buffers(param, grad, exp_avg, exp_avg_sq, steps, model_copy, unscale_grads);
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};
  const cudaError_t error = cuda::launch_fused_adam_flat(
      buffers, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr,
      found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.fused_adam_flat_: CUDA launch failed: ", cudaGetErrorString(error));
}

// The flat buffers' elements of each grad's range, the grads read where they are: a chunk table of the
// grads' runs (csrc/cuda/chunk_table.h) built in one pass on the host and handed to the device without
// waiting, then one launch of the table kernel (csrc/cuda/fused_adam_flat_table.cu) and one for the
// counters, whatever the number of grads.
void fused_adam_flat_grad_list_cuda(const at::Tensor& param, at::TensorList grads, const at::Tensor& offsets,
                                    const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                                    const c10::optional<at::Tensor>& model_copy, double lr, double beta1,
                                    double beta2, double eps, double weight_decay, bool bias_correction,
                                    bool adam_w_mode, const c10::optional<at::Tensor>& grad_scale,
                                    const c10::optional<at::Tensor>& found_inf, bool unscale_grads) {
  check_fused_adam_flat_args(param, param, exp_avg, exp_avg_sq, steps, model_copy, grad_scale, found_inf, at::kCUDA);
  check_flat_grad_list(param, grads, offsets, steps);
  if (grads.empty()) return;
  const c10::cuda::CUDAGuard device_guard(param.device());
  const std::vector<cuda::ChunkEntry> table = grad_runs(grads, offsets, cuda::kGradChunkElems);
  const at::Tensor on_device = device_table(table, param.device());
  cuda::AdamFlatBuffers buffers = flat_buffers(param, at::Tensor(), exp_avg, exp_avg_sq, steps, model_copy, unscale_grads);
  buffers.grad_kind = kind_of(grads[0]);
  const cudaError_t error = cuda::launch_fused_adam_flat_table(
      buffers, static_cast<const cuda::ChunkEntry*>(on_device.data_ptr()), static_cast<int64_t>(table.size()),
      AdamHyper{lr, beta1, beta2, eps, weight_decay, bias_correction}, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr,
      found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.fused_adam_flat_grad_list_: CUDA launch failed: ",
              cudaGetErrorString(error));
}

}  // namespace

TORCH_LIBRARY_IMPL(apexlite, CUDA, m) {
  m.impl("fused_adam_", &fused_adam_cuda);
  m.impl("fused_adam_flat_", &fused_adam_flat_cuda);
  m.impl("fused_adam_flat_grad_list_", &fused_adam_flat_grad_list_cuda);
}

}  // namespace apexlite
