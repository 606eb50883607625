// The Adam/AdamW update for one element, written once and compiled for both the CPU kernel (g++)
// and the CUDA kernel (nvcc). Math is float; the per-step scalars are derived in double by
// make_adam_scalars() so that every backend feeds the element update identical float inputs.
//
// The operation order follows torch.optim.Adam / AdamW (single-tensor form) so that results agree
// with torch to float rounding:
//   g  = grad * inv_scale                      (unscale in-register; inv_scale == 1 when unscaled)
//   L2 mode:        g = g + weight_decay * p
//   decoupled mode: p = p * (1 - lr * weight_decay)
//   m  = m + (1 - beta1) * (g - m)             (torch's lerp for weights below 0.5)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - step_size * m / (sqrt(v) / sqrt(bias_correction2) + eps)
#pragma once

#include <math.h>

#include "apexlite/host_device.h"

namespace apexlite {

// How weight decay enters the update. Values match apex's `adam_w_mode` flag (0 or 1).
enum class AdamMode : int {
  kL2 = 0,         // classic Adam: decay is added to the gradient before the moments
  kDecoupled = 1,  // AdamW: decay shrinks the weight directly, outside the moments
};

// Hyper-parameters of one update call, as the user gave them (double, like Python floats).
struct AdamHyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool bias_correction;
};

// Everything the element update needs, already reduced to float for the current step.
struct AdamScalars {
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float step_size;     // lr / bias_correction1
  float bc2_sqrt;      // sqrt(bias_correction2)
  float weight_decay;  // used by kL2
  float decay_factor;  // 1 - lr * weight_decay, used by kDecoupled
  float inv_scale;     // 1 / grad_scale, or 1 when the gradients are not scaled
};

// step: the 1-based step count this update produces. grad_scale: the loss scale the gradients
// carry (1 when they are not scaled). Computed in double, then rounded once to float.
APEXLITE_HD inline AdamScalars make_adam_scalars(const AdamHyper& h, double step, double grad_scale) {
  const double bc1 = h.bias_correction ? 1.0 - pow(h.beta1, step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - pow(h.beta2, step) : 1.0;
  AdamScalars s;
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.eps = static_cast<float>(h.eps);
  s.step_size = static_cast<float>(h.lr / bc1);
  s.bc2_sqrt = static_cast<float>(sqrt(bc2));
  s.weight_decay = static_cast<float>(h.weight_decay);
  s.decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.inv_scale = static_cast<float>(1.0 / grad_scale);
  return s;
}

// Updates one element in place: p (fp32 weight or master weight), m and v (moments).
template <AdamMode kMode>
APEXLITE_HD inline void adam_update(float& p, float g, float& m, float& v, const AdamScalars& s) {
  g = g * s.inv_scale;
  if (kMode == AdamMode::kL2) {
    g = g + s.weight_decay * p;
  } else {
    p = p * s.decay_factor;
  }
  m = m + s.one_minus_beta1 * (g - m);
  v = v * s.beta2 + s.one_minus_beta2 * (g * g);
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p = p - s.step_size * (m / denom);
}

// Applies adam_update to n contiguous float elements; the plain loop the CPU kernel vectorises.
template <AdamMode kMode>
inline void adam_update_span(float* APEXLITE_RESTRICT p, const float* APEXLITE_RESTRICT g,
                             float* APEXLITE_RESTRICT m, float* APEXLITE_RESTRICT v, long long n,
                             const AdamScalars& s) {
  for (long long i = 0; i < n; ++i) {
    adam_update<kMode>(p[i], g[i], m[i], v[i], s);
  }
}

}  // namespace apexlite
