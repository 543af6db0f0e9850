// A tiny deterministic PRNG for parameter initialisation. std::uniform_real_distribution is not
// used: its output is implementation-defined, and every rank on every platform must start from
// the same parameters.
#pragma once

#include <cstdint>

namespace lockstep::trainer {

inline constexpr uint64_t kSplitMixIncrement = 0x9e3779b97f4a7c15ULL;

// SplitMix64's output function: a bijection of 64-bit values that spreads neighbouring inputs.
inline uint64_t SplitMixFinalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Combines a seed and a stream index into an independent seed.
inline uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  return SplitMixFinalize(seed ^ (kSplitMixIncrement * (stream + 1)));
}

// A 64-bit hash of x: what SplitMix64(x).Next() returns.
inline uint64_t Mix64(uint64_t x) { return SplitMixFinalize(x + kSplitMixIncrement); }

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() { return SplitMixFinalize(state_ += kSplitMixIncrement); }

  // Uniform in [0, 1) with 24 bits of precision: exactly representable as a float.
  float UniformUnit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  float UniformFloat(float low, float high) { return low + (high - low) * UniformUnit(); }

 private:
  uint64_t state_;
};

}  // namespace lockstep::trainer
