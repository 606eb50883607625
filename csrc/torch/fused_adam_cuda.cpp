// CUDA bindings of apexlite::fused_adam_, fused_adam_flat_ and fused_adam_flat_grad_list_: validate the
// tensors (checks.h), turn them into raw pointers and hand them to the torch-free launchers in
// csrc/cuda/fused_adam.cu and fused_adam_flat.cu on torch's current stream. Nothing here waits for the device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "../cuda/launchers.h"
#include "checks.h"

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

void fused_adam_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList state_steps, at::TensorList model_copies,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     bool bias_correction, bool adam_w_mode, const c10::optional<at::Tensor>& grad_scale,
                     const c10::optional<at::Tensor>& found_inf, bool unscale_grads) {
  check_fused_adam_args(params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies, grad_scale,
                        found_inf, at::kCUDA);
  if (params.empty()) return;
  const c10::cuda::CUDAGuard device_guard(params[0].device());
  const std::vector<void*> param_ptrs = pointers(params), grad_ptrs = pointers(grads),
                           exp_avg_ptrs = pointers(exp_avgs), exp_avg_sq_ptrs = pointers(exp_avg_sqs),
                           copy_ptrs = pointers(model_copies);
  std::vector<float*> step_ptrs;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params.size(); ++i) {
    step_ptrs.push_back(state_steps[i].data_ptr<float>());
    numels.push_back(params[i].numel());
  }
  cuda::AdamTensorLists lists;
  lists.params = param_ptrs.data();
  lists.grads = grad_ptrs.data();
  lists.exp_avgs = exp_avg_ptrs.data();
  lists.exp_avg_sqs = exp_avg_sq_ptrs.data();
  lists.model_copies = model_copies.empty() ? nullptr : copy_ptrs.data();
  lists.steps = step_ptrs.data();
  lists.numels = numels.data();
  lists.count = static_cast<int64_t>(params.size());
  lists.param_kind = kind_of(params[0]);
  lists.grad_kind = kind_of(grads[0]);
  lists.moment_kind = kind_of(exp_avgs[0]);
  lists.copy_kind = model_copies.empty() ? cuda::FloatKind::kFloat16 : kind_of(model_copies[0]);
  lists.unscale_grads = unscale_grads;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};
  const cudaError_t error = cuda::launch_fused_adam(
      lists, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr,
      found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.fused_adam_: CUDA launch failed: ", cudaGetErrorString(error));
}

void fused_adam_flat_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                          const c10::optional<at::Tensor>& model_copy, double lr, double beta1, double beta2,
                          double eps, double weight_decay, bool bias_correction, bool adam_w_mode,
                          const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                          bool unscale_grads) {
  check_fused_adam_flat_args(param, grad, exp_avg, exp_avg_sq, steps, model_copy, grad_scale, found_inf, at::kCUDA);
  const c10::cuda::CUDAGuard device_guard(param.device());
  cuda::AdamFlatBuffers buffers;
  buffers.param = param.data_ptr();
  buffers.grad = grad.data_ptr();
  buffers.exp_avg = exp_avg.data_ptr();
  buffers.exp_avg_sq = exp_avg_sq.data_ptr();
  buffers.model_copy = model_copy.has_value() ? model_copy->data_ptr() : nullptr;
  buffers.steps = steps.data_ptr<float>();
  buffers.numel = param.numel();
  buffers.step_count = steps.numel();
  buffers.param_kind = kind_of(param);
  buffers.grad_kind = kind_of(grad);
  buffers.moment_kind = kind_of(exp_avg);
  buffers.copy_kind = model_copy.has_value() ? kind_of(*model_copy) : cuda::FloatKind::kFloat16;
  buffers.unscale_grads = unscale_grads;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};
  const cudaError_t error = cuda::launch_fused_adam_flat(
      buffers, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr,
      found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == cudaSuccess, "apexlite.fused_adam_flat_: CUDA launch failed: ", cudaGetErrorString(error));
}

// Each grad's range of the flat buffers as one tensor of the list kernel (csrc/cuda/fused_adam.cu), its
// counter one entry of `steps`: the grads are read where they are, in one launch per 32 ranges.
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
  const int64_t* starts = offsets.data_ptr<int64_t>();
  const auto at_offsets = [&](const at::Tensor& buffer) {
    std::vector<void*> out(grads.size());
    char* base = static_cast<char*>(buffer.data_ptr());
    for (size_t i = 0; i < grads.size(); ++i) out[i] = base + starts[i] * buffer.element_size();
    return out;
  };
  const std::vector<void*> param_ptrs = at_offsets(param), grad_ptrs = pointers(grads),
                           exp_avg_ptrs = at_offsets(exp_avg), exp_avg_sq_ptrs = at_offsets(exp_avg_sq),
                           copy_ptrs = model_copy.has_value() ? at_offsets(*model_copy) : std::vector<void*>();
  std::vector<float*> step_ptrs(grads.size());
  std::vector<int64_t> numels(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    step_ptrs[i] = steps.data_ptr<float>() + i;
    numels[i] = grads[i].numel();
  }
  cuda::AdamTensorLists lists;
  lists.params = param_ptrs.data();
  lists.grads = grad_ptrs.data();
  lists.exp_avgs = exp_avg_ptrs.data();
  lists.exp_avg_sqs = exp_avg_sq_ptrs.data();
  lists.model_copies = model_copy.has_value() ? copy_ptrs.data() : nullptr;
  lists.steps = step_ptrs.data();
  lists.numels = numels.data();
  lists.count = static_cast<int64_t>(grads.size());
  lists.param_kind = kind_of(param);
  lists.grad_kind = kind_of(grads[0]);
  lists.moment_kind = kind_of(exp_avg);
  lists.copy_kind = model_copy.has_value() ? kind_of(*model_copy) : cuda::FloatKind::kFloat16;
  lists.unscale_grads = unscale_grads;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};
  const cudaError_t error = cuda::launch_fused_adam(
      lists, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2,
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
