// C entry points of the host emulation build (APEXLITE_CUDA_HOST_EMULATION): csrc/cuda/fused_adam.cu,
// fused_adam_flat.cu, fused_adam_flat_table.cu and flat_gather.cu compiled by g++ and loaded with ctypes by
// tests/csrc/emulated_cuda.py. Pointers are host memory. Never part of apexlite._C.
#include <cstdint>

#include "chunk_table.h"
#include "flat_gather.h"
#include "launchers.h"

using apexlite::AdamHyper;
using apexlite::AdamMode;
using apexlite::cuda::AdamFlatBuffers;
using apexlite::cuda::AdamTensorLists;
using apexlite::cuda::FloatKind;

namespace {

// The flat launchers' view of host buffers; kinds are FloatKind values.
AdamFlatBuffers buffers_of(void* param, void* grad, void* exp_avg, void* exp_avg_sq, void* model_copy, float* steps,
                           int64_t numel, int64_t step_count, int param_kind, int grad_kind, int moment_kind,
                           int copy_kind, int unscale_grads) {
  AdamFlatBuffers buffers;
  buffers.param = param;
  buffers.grad = grad;
  buffers.exp_avg = exp_avg;
  buffers.exp_avg_sq = exp_avg_sq;
  buffers.model_copy = model_copy;
  buffers.steps = steps;
  buffers.numel = numel;
  buffers.step_count = step_count;
  buffers.param_kind = static_cast<FloatKind>(param_kind);
  buffers.grad_kind = static_cast<FloatKind>(grad_kind);
  buffers.moment_kind = static_cast<FloatKind>(moment_kind);
  buffers.copy_kind = static_cast<FloatKind>(copy_kind);
  buffers.unscale_grads = unscale_grads != 0;
  return buffers;
}

}  // namespace

extern "C" {

// launch_fused_adam on host pointers; kinds are FloatKind values. Returns the cudaError_t value.
int apexlite_emulated_fused_adam(void* const* params, void* const* grads, void* const* exp_avgs,
                                 void* const* exp_avg_sqs, void* const* model_copies, float* const* steps,
                                 const int64_t* numels, int64_t count, int param_kind, int grad_kind,
                                 int moment_kind, int copy_kind, double lr, double beta1, double beta2, double eps,
                                 double weight_decay, int bias_correction, int adam_w_mode, const float* grad_scale,
                                 const float* found_inf, int unscale_grads) {
  AdamTensorLists lists;
  lists.params = params;
  lists.grads = grads;
  lists.exp_avgs = exp_avgs;
  lists.exp_avg_sqs = exp_avg_sqs;
  lists.model_copies = model_copies;
  lists.steps = steps;
  lists.numels = numels;
  lists.count = count;
  lists.param_kind = static_cast<FloatKind>(param_kind);
  lists.grad_kind = static_cast<FloatKind>(grad_kind);
  lists.moment_kind = static_cast<FloatKind>(moment_kind);
  lists.copy_kind = static_cast<FloatKind>(copy_kind);
  lists.unscale_grads = unscale_grads != 0;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction != 0};
  return static_cast<int>(apexlite::cuda::launch_fused_adam(
      lists, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2, grad_scale, found_inf, nullptr));
}

// launch_fused_adam_flat on host pointers; kinds are FloatKind values. Returns the cudaError_t value.
int apexlite_emulated_fused_adam_flat(void* param, void* grad, void* exp_avg, void* exp_avg_sq, void* model_copy,
                                      float* steps, int64_t numel, int64_t step_count, int param_kind, int grad_kind,
                                      int moment_kind, int copy_kind, double lr, double beta1, double beta2,
                                      double eps, double weight_decay, int bias_correction, int adam_w_mode,
                                      const float* grad_scale, const float* found_inf, int unscale_grads) {
  const AdamFlatBuffers buffers = buffers_of(param, grad, exp_avg, exp_avg_sq, model_copy, steps, numel, step_count,
                                             param_kind, grad_kind, moment_kind, copy_kind, unscale_grads);
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction != 0};
  return static_cast<int>(apexlite::cuda::launch_fused_adam_flat(
      buffers, hyper, adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2, grad_scale, found_inf, nullptr));
}

// launch_fused_adam_flat_table on host memory: grads[i] (an address) holds numels[i] elements of grad_kind
// for the buffers' elements from offsets[i] on, chunked by chunk_table() as the torch binding does.
// Returns the cudaError_t value.
int apexlite_emulated_fused_adam_flat_grad_table(void* param, const uint64_t* grads, const int64_t* offsets,
                                                 const int64_t* numels, int64_t count, void* exp_avg,
                                                 void* exp_avg_sq, void* model_copy, float* steps, int param_kind,
                                                 int grad_kind, int moment_kind, int copy_kind, double lr,
                                                 double beta1, double beta2, double eps, double weight_decay,
                                                 int bias_correction, int adam_w_mode, const float* grad_scale,
                                                 const float* found_inf, int unscale_grads) {
  const AdamFlatBuffers buffers = buffers_of(param, nullptr, exp_avg, exp_avg_sq, model_copy, steps, 0, count,
                                             param_kind, grad_kind, moment_kind, copy_kind, unscale_grads);
  const int64_t grad_bytes = buffers.grad_kind == FloatKind::kFloat32 ? 4 : 2;
  const std::vector<apexlite::cuda::ChunkEntry> table = apexlite::cuda::chunk_table(
      grads, offsets, numels, count, apexlite::cuda::kGradChunkElems, grad_bytes);
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction != 0};
  return static_cast<int>(apexlite::cuda::launch_fused_adam_flat_table(
      buffers, table.data(), static_cast<int64_t>(table.size()), hyper,
      adam_w_mode ? AdamMode::kDecoupled : AdamMode::kL2, grad_scale, found_inf, nullptr));
}

// launch_flat_gather on host memory: sources[i] (an address), targets[i] (a byte offset in flat) and
// bytes[i] per source, chunked by gather_table() as the torch binding does. Returns the cudaError_t value.
int apexlite_emulated_flat_gather(void* flat, const uint64_t* sources, const int64_t* targets, const int64_t* bytes,
                                  int64_t count) {
  const std::vector<apexlite::cuda::GatherEntry> table = apexlite::cuda::gather_table(sources, targets, bytes, count);
  return static_cast<int>(apexlite::cuda::launch_flat_gather(flat, table.data(), static_cast<int64_t>(table.size()),
                                                             nullptr));
}

// Copies up to `capacity` recorded launches (blocks, threads) into `out` and clears the record;
// returns how many launches there were.
int64_t apexlite_emulated_take_launches(int32_t* out, int64_t capacity) {
  auto& log = apexlite::host_emulation::launch_log();
  const int64_t total = static_cast<int64_t>(log.size());
  for (int64_t i = 0; i < total && i < capacity; ++i) {
    out[2 * i] = log[i].blocks;
    out[2 * i + 1] = log[i].threads;
  }
  log.clear();
  return total;
}

}  // extern "C"
