// CPU kernels of apexlite::fused_adam_, fused_adam_flat_ and fused_adam_flat_grad_list_: all tensors of
// the call are cut into fixed-size tasks that at::parallel_for spreads over the threads. Each task walks its range in small
// tiles: float lists are updated in place, fp16/bf16 lists are widened into a stack buffer, updated,
// and rounded back, so the one float loop of adam_math.h serves every dtype combination.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "apexlite/adam_math.h"
#include "checks.h"
#include "grad_runs.h"

namespace apexlite {
namespace {

constexpr int64_t kTaskElems = 32 * 1024;  // work unit handed to one thread
constexpr int64_t kTile = 1024;            // floats per stack buffer; 4 buffers stay inside L1

// One list entry of one tensor: a base pointer and its element type.
struct Slot {
  void* data = nullptr;
  at::ScalarType dtype = at::kFloat;
};

struct TensorSlots {
  Slot param, grad, exp_avg, exp_avg_sq, copy;
  AdamScalars scalars;
  bool store_unscaled_grads = false;
};

struct Task {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

template <typename T>
inline __attribute__((always_inline)) void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline __attribute__((always_inline)) void narrow(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

// bfloat16 is the top half of a float: widening is a shift, narrowing rounds to nearest even and
// keeps NaN a NaN. Written on the raw bits so that the loops vectorise.
template <>
inline __attribute__((always_inline)) void widen(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* APEXLITE_RESTRICT bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* APEXLITE_RESTRICT out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}

template <>
inline __attribute__((always_inline)) void narrow(const float* src, c10::BFloat16* dst, int64_t n) {
  const uint32_t* APEXLITE_RESTRICT in = reinterpret_cast<const uint32_t*>(src);
  uint16_t* APEXLITE_RESTRICT bits = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = in[i];
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    bits[i] = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
  }
}

// Float view of elements [off, off + n): the tensor itself for float32, else `buffer` filled by widening.
inline __attribute__((always_inline)) float* load(const Slot& s, int64_t off, int64_t n, float* buffer) {
  switch (s.dtype) {
    case at::kHalf:
      widen(static_cast<const c10::Half*>(s.data) + off, buffer, n);
      return buffer;
    case at::kBFloat16:
      widen(static_cast<const c10::BFloat16*>(s.data) + off, buffer, n);
      return buffer;
    default:
      return static_cast<float*>(s.data) + off;
  }
}

// Writes float values back into elements [off, off + n) of a slot (rounding to nearest even).
inline __attribute__((always_inline)) void store(const Slot& s, int64_t off, int64_t n, const float* values) {
  switch (s.dtype) {
    case at::kHalf:
      narrow(values, static_cast<c10::Half*>(s.data) + off, n);
      break;
    case at::kBFloat16:
      narrow(values, static_cast<c10::BFloat16*>(s.data) + off, n);
      break;
    default:
      if (static_cast<float*>(s.data) + off != values) std::copy(values, values + n, static_cast<float*>(s.data) + off);
  }
}

template <AdamMode kMode>
inline __attribute__((always_inline)) void run_task(const TensorSlots& t, const Task& task) {
  alignas(64) float p_buf[kTile], g_buf[kTile], m_buf[kTile], v_buf[kTile];
  for (int64_t off = task.begin; off < task.end; off += kTile) {
    const int64_t n = std::min(kTile, task.end - off);
    float* p = load(t.param, off, n, p_buf);
    const float* g = load(t.grad, off, n, g_buf);
    float* m = load(t.exp_avg, off, n, m_buf);
    float* v = load(t.exp_avg_sq, off, n, v_buf);
    adam_update_span<kMode>(p, g, m, v, n, t.scalars);
    store(t.param, off, n, p);
    store(t.exp_avg, off, n, m);
    store(t.exp_avg_sq, off, n, v);
    if (t.copy.data != nullptr) store(t.copy, off, n, p);
    if (t.store_unscaled_grads) {  // the value adam_update used, as the CUDA kernel stores it
      for (int64_t i = 0; i < n; ++i) g_buf[i] = g[i] * t.scalars.inv_scale;
      store(t.grad, off, n, g_buf);
    }
  }
}

// The update is bound by memory bandwidth only once it runs in wide vectors. Each entry point below
// is compiled once per instruction set and picked at load time by the CPU it runs on; run_task and
// everything it calls is inlined into each copy.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define APEXLITE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define APEXLITE_CPU_CLONES
#endif

APEXLITE_CPU_CLONES void run_task_l2(const TensorSlots& t, const Task& task) {
  run_task<AdamMode::kL2>(t, task);
}

APEXLITE_CPU_CLONES void run_task_decoupled(const TensorSlots& t, const Task& task) {
  run_task<AdamMode::kDecoupled>(t, task);
}

Slot slot_of(const at::Tensor& t) { return Slot{t.data_ptr(), t.scalar_type()}; }

void fused_adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList state_steps, at::TensorList model_copies,
                    double lr, double beta1, double beta2, double eps, double weight_decay,
                    bool bias_correction, bool adam_w_mode, const c10::optional<at::Tensor>& grad_scale,
                    const c10::optional<at::Tensor>& found_inf, bool unscale_grads) {
  check_fused_adam_args(params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies, grad_scale,
                        found_inf, at::kCPU);
  // On the CPU the flags are host memory, so a skipped step costs nothing and touches nothing.
  if (found_inf.has_value() && found_inf->item<float>() != 0.0f) return;
  const double scale = grad_scale.has_value() ? static_cast<double>(grad_scale->item<float>()) : 1.0;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, bias_correction};

  std::vector<TensorSlots> tensors(params.size());
  std::vector<Task> tasks;
  for (size_t i = 0; i < params.size(); ++i) {
    float* step = state_steps[i].data_ptr<float>();
    *step += 1.0f;
    TensorSlots& t = tensors[i];
    t.scalars = make_adam_scalars(hyper, static_cast<double>(*step), scale);
    t.store_unscaled_grads = unscale_grads && grad_scale.has_value();
    if (params[i].numel() == 0) continue;
    t.param = slot_of(params[i]);
    t.grad = slot_of(grads[i]);
    t.exp_avg = slot_of(exp_avgs[i]);
    t.exp_avg_sq = slot_of(exp_avg_sqs[i]);
    if (!model_copies.empty()) t.copy = slot_of(model_copies[i]);
    for (int64_t b = 0; b < params[i].numel(); b += kTaskElems) {
      tasks.push_back(Task{static_cast<int64_t>(i), b, std::min(b + kTaskElems, params[i].numel())});
    }
  }
  const auto run = adam_w_mode ? &run_task_decoupled : &run_task_l2;
  // Params that share memory (weights tied with `b.data = a.data`, views that overlap) step one after the
  // other, in list order, as torch's for-loop Adam steps them; in parallel their updates would race.
  const int64_t count = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, count, memory_overlaps(params) ? count : 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) run(tensors[tasks[k].tensor], tasks[k]);
  });
}

// apexlite::fused_adam_flat_: the same tiles over one flat buffer per role (a whole set of params),
// so the per-call work is independent of how many params the buffers hold. The counters advance
// as the list op's do (a float += 1), and the update takes steps[0]'s new value.
void fused_adam_flat_cpu(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                         const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                         const c10::optional<at::Tensor>& model_copy, double lr, double beta1, double beta2,
                         double eps, double weight_decay, bool bias_correction, bool adam_w_mode,
                         const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                         bool unscale_grads) {
  check_fused_adam_flat_args(param, grad, exp_avg, exp_avg_sq, steps, model_copy, grad_scale, found_inf, at::kCPU);
  if (found_inf.has_value() && found_inf->item<float>() != 0.0f) return;
  const double scale = grad_scale.has_value() ? static_cast<double>(grad_scale->item<float>()) : 1.0;
  float* counters = steps.data_ptr<float>();
  const int64_t count = steps.numel();
  for (int64_t i = 0; i < count; ++i) counters[i] += 1.0f;
  TensorSlots t;
  t.scalars = make_adam_scalars(AdamHyper{lr, beta1, beta2, eps, weight_decay, bias_correction},
                                static_cast<double>(counters[0]), scale);
  t.store_unscaled_grads = unscale_grads && grad_scale.has_value();
  const int64_t numel = param.numel();
  if (numel == 0) return;
  t.param = slot_of(param);
  t.grad = slot_of(grad);
  t.exp_avg = slot_of(exp_avg);
  t.exp_avg_sq = slot_of(exp_avg_sq);
  if (model_copy.has_value()) t.copy = slot_of(*model_copy);
  const auto run = adam_w_mode ? &run_task_decoupled : &run_task_l2;
  const int64_t tasks = (numel + kTaskElems - 1) / kTaskElems;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) run(t, Task{0, k * kTaskElems, std::min((k + 1) * kTaskElems, numel)});
  });
}

// apexlite::fused_adam_flat_grad_list_: the flat buffers' elements of each grad's range, read from the
// grad where it is; the counters advance as fused_adam_flat_'s. The grads' runs form the chunk table the
// CUDA binding hands its kernel (csrc/cuda/chunk_table.h), here cut into tasks: one parallel pass over
// all ranges, and per grad only its table entry.
void fused_adam_flat_grad_list_cpu(const at::Tensor& param, at::TensorList grads, const at::Tensor& offsets,
                                   const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& steps,
                                   const c10::optional<at::Tensor>& model_copy, double lr, double beta1, double beta2,
                                   double eps, double weight_decay, bool bias_correction, bool adam_w_mode,
                                   const c10::optional<at::Tensor>& grad_scale,
                                   const c10::optional<at::Tensor>& found_inf, bool unscale_grads) {
  check_fused_adam_flat_args(param, param, exp_avg, exp_avg_sq, steps, model_copy, grad_scale, found_inf, at::kCPU);
  check_flat_grad_list(param, grads, offsets, steps);
  if (found_inf.has_value() && found_inf->item<float>() != 0.0f) return;
  const double scale = grad_scale.has_value() ? static_cast<double>(grad_scale->item<float>()) : 1.0;
  float* counters = steps.data_ptr<float>();
  for (int64_t i = 0; i < steps.numel(); ++i) counters[i] += 1.0f;
  if (grads.empty()) return;
  TensorSlots buffers;
  buffers.scalars = make_adam_scalars(AdamHyper{lr, beta1, beta2, eps, weight_decay, bias_correction},
                                      static_cast<double>(counters[0]), scale);
  buffers.store_unscaled_grads = unscale_grads && grad_scale.has_value();
  buffers.param = slot_of(param);
  buffers.exp_avg = slot_of(exp_avg);
  buffers.exp_avg_sq = slot_of(exp_avg_sq);
  if (model_copy.has_value()) buffers.copy = slot_of(*model_copy);
  const std::vector<cuda::ChunkEntry> table = grad_runs(grads, offsets, kTaskElems);
  const at::ScalarType grad_dtype = grads[0].scalar_type();
  const auto run = adam_w_mode ? &run_task_decoupled : &run_task_l2;
  at::parallel_for(0, static_cast<int64_t>(table.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const cuda::ChunkEntry& entry = table[k];
      TensorSlots run_slots = buffers;  // the buffers from the entry's target on, and its grad
      for (Slot* slot : {&run_slots.param, &run_slots.exp_avg, &run_slots.exp_avg_sq, &run_slots.copy}) {
        if (slot->data != nullptr) slot->data = static_cast<char*>(slot->data) + entry.target * at::elementSize(slot->dtype);
      }
      run_slots.grad = Slot{reinterpret_cast<void*>(entry.source), grad_dtype};
      run(run_slots, Task{0, 0, entry.length});
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(apexlite, CPU, m) {
  m.impl("fused_adam_", &fused_adam_cpu);
  m.impl("fused_adam_flat_", &fused_adam_flat_cpu);
  m.impl("fused_adam_flat_grad_list_", &fused_adam_flat_grad_list_cpu);
}

}  // namespace apexlite
