// Bit-exact float <-> bf16/fp16 conversions, inline so the CPU pack/unpack loops can vectorise
// them. Written with integer and float operations only (no branches on data other than selects),
// and independent of the F16C/AVX512-BF16 instructions, so results are identical on every x86-64
// and match what the CUDA intrinsics (__float2half_rn, __float2bfloat16_rn) produce.
//
// Rounding is to nearest, ties to even. Values beyond the largest finite half round to +-inf;
// NaN stays NaN (a quiet NaN with the input's sign); fp16 denormals are produced and consumed
// exactly. Requires the default floating-point environment (round-to-nearest, no FTZ/DAZ), which
// Lockstep never changes.
#pragma once

#include <cstdint>
#include <cstring>

namespace lockstep::kernels::internal {

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint16_t FloatToBf16Inline(float value) {
  const uint32_t bits = FloatBits(value);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; a carry into the
  // exponent is the correct result, including the overflow of the largest floats to inf.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

inline float Bf16ToFloatInline(uint16_t bits) { return BitsToFloat(uint32_t{bits} << 16); }

inline uint16_t FloatToFp16Inline(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;

  // |value| >= 2^16 (or inf/NaN): always inf, or a quiet NaN. (Values in [65520, 2^16) reach
  // inf through the carry of the normal path.)
  const uint32_t special = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;

  // |value| < 2^-14, the fp16 denormal range: adding 0.5f aligns the value's bits so that the
  // FPU's own round-to-nearest-even leaves the fp16 denormal in the low mantissa bits.
  constexpr uint32_t kDenormMagicBits = ((127 - 15) + (23 - 10) + 1) << 23;  // 0.5f
  const uint32_t denormal =
      FloatBits(BitsToFloat(magnitude) + BitsToFloat(kDenormMagicBits)) - kDenormMagicBits;

  // Normal range: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  const uint32_t mantissa_odd = (magnitude >> 13) & 1u;
  const uint32_t normal = (magnitude + ((15u - 127u) << 23) + 0xfffu + mantissa_odd) >> 13;

  const uint32_t result = magnitude >= 0x47800000u  ? special
                          : magnitude < 0x38800000u ? denormal
                                                    : normal;
  return static_cast<uint16_t>(result | sign);
}

inline float Fp16ToFloatInline(uint16_t half) {
  const uint32_t sign = uint32_t{half & 0x8000u} << 16;
  const uint32_t shifted = uint32_t{half & 0x7fffu} << 13;  // exponent and mantissa in place
  const uint32_t exponent = shifted & 0x0f800000u;
  constexpr uint32_t kRebias = (127u - 15u) << 23;
  // Inf/NaN: the exponent becomes all ones; the mantissa (NaN payload) is kept.
  const uint32_t inf_nan = shifted + kRebias + ((128u - 16u) << 23);
  // Denormal or zero: mantissa * 2^-24, computed exactly as (2^-14 + m) - 2^-14 in float.
  constexpr uint32_t kMagicBits = 113u << 23;  // 2^-14
  const uint32_t denormal = FloatBits(BitsToFloat(shifted + kMagicBits) - BitsToFloat(kMagicBits));
  const uint32_t normal = shifted + kRebias;
  const uint32_t result = exponent == 0x0f800000u ? inf_nan : exponent == 0 ? denormal : normal;
  return BitsToFloat(result | sign);
}

}  // namespace lockstep::kernels::internal
