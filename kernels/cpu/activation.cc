// Fused bias + activation, forward and backward, with PyTorch's formulas: gelu is the exact erf
// form (approximate='none'), relu's gradient is taken from the output (dy * (y > 0)), tanh's from
// the output (dy * (1 - y^2)).
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"

namespace lockstep::kernels::cpu {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// NaN propagates (as in torch.relu): a NaN compares false and is kept.
inline float Relu(float v) { return v < 0.0f ? 0.0f : v; }
inline float Gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); }
// d/dv [v * Phi(v)] = Phi(v) + v * phi(v).
inline float GeluDerivative(float v) {
  const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
  return cdf + v * pdf;
}

// One row of the forward pass; `Act` is applied after adding the bias. A template so each
// activation gets its own loop that GCC can vectorise where the activation allows.
template <typename Act>
void ForwardRows(int64_t rows, int64_t cols, const float* __restrict bias, float* x,
                 float* pre_activation, Act act) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict row = x + r * cols;
    if (pre_activation != nullptr) {
      float* __restrict pre = pre_activation + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = row[c] + bias[c];
        pre[c] = v;
        row[c] = act(v);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) row[c] = act(row[c] + bias[c]);
    }
  }
}

// dx = input_grad(dy, source, c), written into dy, summed per column into `column_sums` (double:
// a batch of thousands of rows would otherwise lose low bits of the bias gradient).
template <typename InputGrad>
void BackwardRows(int64_t rows, int64_t cols, const float* source, float* dy,
                  double* __restrict column_sums, InputGrad input_grad) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict d = dy + r * cols;
    const float* __restrict s = source == nullptr ? nullptr : source + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float dx = input_grad(d[c], s, c);
      d[c] = dx;
      column_sums[c] += dx;
    }
  }
}

[[noreturn]] void DieMissingInput(const char* what, ActivationType act) {
  LOCKSTEP_LOG(ERROR) << "kernels::BiasActivationBackward: activation " << static_cast<int>(act)
                      << " needs " << what << ", which is null";
  std::abort();
}

}  // namespace

void BiasActivationForward(ActivationType act, int64_t rows, int64_t cols, const float* bias,
                           float* x, float* pre_activation) {
  if (rows <= 0 || cols <= 0) return;
  switch (act) {
    case ActivationType::kIdentity:
      return ForwardRows(rows, cols, bias, x, pre_activation, [](float v) { return v; });
    case ActivationType::kRelu:
      return ForwardRows(rows, cols, bias, x, pre_activation, Relu);
    case ActivationType::kGelu:
      return ForwardRows(rows, cols, bias, x, pre_activation, Gelu);
    case ActivationType::kTanh:
      return ForwardRows(rows, cols, bias, x, pre_activation, [](float v) { return std::tanh(v); });
  }
  LOCKSTEP_LOG(ERROR) << "kernels::BiasActivationForward: unknown activation "
                      << static_cast<int>(act);
  std::abort();
}

void BiasActivationBackward(ActivationType act, int64_t rows, int64_t cols, const float* y,
                            const float* pre_activation, float* dy, float* dbias, bool accumulate) {
  if (cols <= 0) return;
  std::vector<double> column_sums(static_cast<size_t>(cols), 0.0);
  if (rows > 0) {
    switch (act) {
      case ActivationType::kIdentity:
        BackwardRows(rows, cols, nullptr, dy, column_sums.data(),
                     [](float d, const float*, int64_t) { return d; });
        break;
      case ActivationType::kRelu:
        if (y == nullptr) DieMissingInput("the output y", act);
        BackwardRows(rows, cols, y, dy, column_sums.data(),
                     // A select, not a product, so a non-finite dy is dropped where the unit is off
                     // (as PyTorch's threshold_backward does).
                     [](float d, const float* s, int64_t c) { return s[c] > 0.0f ? d : 0.0f; });
        break;
      case ActivationType::kGelu:
        if (pre_activation == nullptr) DieMissingInput("the pre-activation", act);
        BackwardRows(rows, cols, pre_activation, dy, column_sums.data(),
                     [](float d, const float* s, int64_t c) { return d * GeluDerivative(s[c]); });
        break;
      case ActivationType::kTanh:
        if (y == nullptr) DieMissingInput("the output y", act);
        BackwardRows(rows, cols, y, dy, column_sums.data(),
                     [](float d, const float* s, int64_t c) { return d * (1.0f - s[c] * s[c]); });
        break;
      default:
        LOCKSTEP_LOG(ERROR) << "kernels::BiasActivationBackward: unknown activation "
                            << static_cast<int>(act);
        std::abort();
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    const float sum = static_cast<float>(column_sums[c]);
    dbias[c] = accumulate ? dbias[c] + sum : sum;
  }
}

}  // namespace lockstep::kernels::cpu
