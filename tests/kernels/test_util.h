// Shared helpers for the kernels tests: seeded random inputs and NaN-poisoned outputs, so a
// kernel that skips an element or reads an output it should only write fails loudly.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
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

}  // namespace lockstep::kernels::testing
