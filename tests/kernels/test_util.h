// Shared helpers for the kernels tests (and the model's, which compute with them): seeded random
// inputs and NaN-poisoned outputs, so a kernel that skips an element or reads an output it should
// only write fails loudly; the activations' exact forms; the activations' names for test names.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::kernels::testing {

inline ExecutionContext CpuContext() { return ExecutionContext{}; }

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float low = -1.0f,
                                       float high = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = distribution(engine);
  return values;
}

inline std::vector<int32_t> RandomLabels(size_t n, int32_t classes, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_int_distribution<int32_t> distribution(0, classes - 1);
  std::vector<int32_t> labels(n);
  for (int32_t& label : labels) label = distribution(engine);
  return labels;
}

inline std::vector<float> Poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

inline std::vector<double> ToDouble(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// The activation in double, as PyTorch defines it (gelu: the exact erf form).
inline double ReferenceActivation(ActivationType act, double v) {
  switch (act) {
    case ActivationType::kIdentity:
      return v;
    case ActivationType::kRelu:
      return v > 0 ? v : 0;
    case ActivationType::kGelu:
      return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case ActivationType::kTanh:
      return std::tanh(v);
  }
  return NAN;
}

// Its derivative at the pre-activation v, in double.
inline double ReferenceDerivative(ActivationType act, double v) {
  switch (act) {
    case ActivationType::kIdentity:
      return 1;
    case ActivationType::kRelu:
      return v > 0 ? 1 : 0;
    case ActivationType::kGelu:
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
             v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    case ActivationType::kTanh:
      return 1.0 - std::tanh(v) * std::tanh(v);
  }
  return NAN;
}

// "Identity", "Relu", "Gelu", "Tanh": a parameterised test's name suffix.
inline std::string ActivationName(ActivationType act) {
  switch (act) {
    case ActivationType::kIdentity:
      return "Identity";
    case ActivationType::kRelu:
      return "Relu";
    case ActivationType::kGelu:
      return "Gelu";
    case ActivationType::kTanh:
      return "Tanh";
  }
  return "Unknown";
}

}  // namespace lockstep::kernels::testing
