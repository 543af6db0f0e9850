// Fused optimizer updates: one pass over the flat parameter buffer, reading each element of
// param, grad and state once and writing param and state once. The per-step scalars (bias
// corrections) are computed in double once per call, as PyTorch computes them in Python floats.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace lockstep::kernels::cpu {

// PyTorch's torch.optim.SGD with dampening = 0 and nesterov = False.
void SgdMomentumUpdate(int64_t n, float lr, float momentum, float weight_decay, bool first_step,
                       float* __restrict param, const float* __restrict grad,
                       float* __restrict momentum_buffer) {
  if (first_step) {
    // The buffer starts as a copy of the first gradient (torch.clone), not momentum * 0 + g.
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      momentum_buffer[i] = g;
      param[i] -= lr * g;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    const float buf = momentum * momentum_buffer[i] + g;
    momentum_buffer[i] = buf;
    param[i] -= lr * buf;
  }
}

// PyTorch's torch.optim.AdamW (amsgrad = False, maximize = False), single-tensor path, with
// its order of float operations; `step` < 1 is treated as 1:
//   param *= 1 - lr * wd
//   exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2
//   denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
//   param -= (lr / (1 - beta1^step)) * exp_avg / denom
void AdamWUpdate(int64_t n, float lr, float beta1, float beta2, float epsilon, float weight_decay,
                 int64_t step, float* __restrict param, const float* __restrict grad,
                 float* __restrict exp_avg, float* __restrict exp_avg_sq) {
  const double steps = static_cast<double>(step < 1 ? 1 : step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), steps);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), steps);
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  // torch.lerp's two forms (the second keeps precision for weights near 1); the choice is per
  // call, so GCC unswitches it out of the loop.
  const float avg_weight = 1.0f - beta1;
  const bool lerp_from_start = avg_weight < 0.5f;
  const float sq_weight = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m_old = exp_avg[i];
    const float m =
        lerp_from_start ? m_old + avg_weight * (g - m_old) : g - (g - m_old) * (1.0f - avg_weight);
    const float v = exp_avg_sq[i] * beta2 + sq_weight * (g * g);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + epsilon;
    param[i] = p - step_size * (m / denom);
  }
}

}  // namespace lockstep::kernels::cpu
