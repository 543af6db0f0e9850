#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::Poisoned;
using testing::RandomFloats;

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

bool IsFp16Nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool IsBf16Nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0; }

// Independent reference: the value of every non-negative finite fp16 / bf16 bit pattern from the
// format's definition, plus the infinity pattern standing for the next value up (2^16 for fp16,
// 2^128 for bf16), which is where IEEE rounding sends overflow.
struct HalfFormat {
  std::vector<double> values;  // indexed by bit pattern, 0 .. inf pattern
};

HalfFormat MakeFormat(int mantissa_bits, int exponent_bias, uint16_t inf_pattern) {
  HalfFormat format;
  for (uint32_t bits = 0; bits <= inf_pattern; ++bits) {
    const int exponent = static_cast<int>(bits >> mantissa_bits);
    const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
    const double value = exponent == 0 ? std::ldexp(mantissa, 1 - exponent_bias - mantissa_bits)
                                       : std::ldexp((1u << mantissa_bits) + mantissa,
                                                    exponent - exponent_bias - mantissa_bits);
    format.values.push_back(value);
  }
  return format;
}

const HalfFormat& Fp16Format() {
  static const HalfFormat format = MakeFormat(10, 15, 0x7c00);
  return format;
}
const HalfFormat& Bf16Format() {
  static const HalfFormat format = MakeFormat(7, 127, 0x7f80);
  return format;
}

// Round to nearest, ties to the even bit pattern, saturating to the infinity pattern.
uint16_t ReferenceRound(const HalfFormat& format, float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  const std::vector<double>& v = format.values;
  if (magnitude >= v.back()) return sign | static_cast<uint16_t>(v.size() - 1);
  const size_t upper = std::upper_bound(v.begin(), v.end(), magnitude) - v.begin();
  const size_t lower = upper - 1;
  const double below = magnitude - v[lower], above = v[upper] - magnitude;
  size_t chosen = below < above ? lower : above < below ? upper : (lower % 2 == 0 ? lower : upper);
  return sign | static_cast<uint16_t>(chosen);
}

TEST(HalfConversionTest, Fp16RoundTripIsIdentityOnAllBitPatterns) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = Fp16ToFloat(h);
    if (IsFp16Nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_TRUE(IsFp16Nan(FloatToFp16(f))) << std::hex << bits;
      continue;
    }
    const double expected = (h & 0x8000 ? -1.0 : 1.0) *
                            ((h & 0x7fff) == 0x7c00 ? INFINITY : Fp16Format().values[h & 0x7fff]);
    ASSERT_EQ(static_cast<double>(f), expected) << std::hex << bits;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << bits;
    ASSERT_EQ(FloatToFp16(f), h) << std::hex << bits;
  }
}

TEST(HalfConversionTest, Bf16RoundTripIsIdentityOnAllBitPatterns) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = Bf16ToFloat(h);
    ASSERT_EQ(Bits(f), bits << 16) << std::hex << bits;
    if (IsBf16Nan(h)) {
      ASSERT_TRUE(IsBf16Nan(FloatToBf16(f))) << std::hex << bits;
    } else {
      ASSERT_EQ(FloatToBf16(f), h) << std::hex << bits;
    }
  }
}

// Every midpoint between adjacent halves (the ties) and its float neighbours on both sides,
// which must round to the nearer half.
void CheckTiesAndNeighbours(const HalfFormat& format, uint16_t (*convert)(float)) {
  for (size_t i = 0; i + 1 < format.values.size(); ++i) {
    const float midpoint = static_cast<float>((format.values[i] + format.values[i + 1]) / 2);
    ASSERT_EQ(static_cast<double>(midpoint), (format.values[i] + format.values[i + 1]) / 2);
    for (float value : {midpoint, std::nextafter(midpoint, 0.0f),
                        std::nextafter(midpoint, INFINITY), -midpoint}) {
      ASSERT_EQ(convert(value), ReferenceRound(format, value))
          << "value " << value << " bits " << std::hex << Bits(value);
    }
  }
}

TEST(HalfConversionTest, Fp16RoundsEveryTieToEvenAndNeighboursToNearest) {
  CheckTiesAndNeighbours(Fp16Format(), FloatToFp16);
}

TEST(HalfConversionTest, Bf16RoundsEveryTieToEvenAndNeighboursToNearest) {
  CheckTiesAndNeighbours(Bf16Format(), FloatToBf16);
}

TEST(HalfConversionTest, SampledFloatsRoundToNearestLikeReference) {
  // A stride coprime to 2^32 visits floats of every exponent, sign and mantissa pattern.
  for (uint64_t bits = 12345; bits <= 0xffffffffu; bits += 1999) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFp16(value), ReferenceRound(Fp16Format(), value)) << std::hex << bits;
    ASSERT_EQ(FloatToBf16(value), ReferenceRound(Bf16Format(), value)) << std::hex << bits;
  }
}

TEST(HalfConversionTest, ChosenValuesRoundTiesToEven) {
  // fp16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to 1 (even). 1 + 3 * 2^-11: up, to even.
  EXPECT_EQ(FloatToFp16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToFp16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);      // largest finite
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7bff);     // just below the tie with 2^16
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);      // the tie overflows to inf (even)
  EXPECT_EQ(FloatToFp16(-1e6f), 0xfc00);         // overflow keeps the sign
  EXPECT_EQ(FloatToFp16(0x1p-25f), 0x0000);      // half the smallest denormal: to zero (even)
  EXPECT_EQ(FloatToFp16(3 * 0x1p-25f), 0x0002);  // 1.5 ulp: to 2 ulp (even)
  EXPECT_EQ(FloatToFp16(0x1p-24f), 0x0001);      // smallest denormal
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(1e-30f), 0x0000);  // float denormal-free underflow
  EXPECT_EQ(FloatToFp16(INFINITY), 0x7c00);
  EXPECT_TRUE(IsFp16Nan(FloatToFp16(NAN)));
  // bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffff)), 0x7f80);  // largest float overflows bf16
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  EXPECT_TRUE(IsBf16Nan(FloatToBf16(FromBits(0x7f800001))));  // a NaN that truncation would
                                                              // turn into inf
}

class PackHalfTest : public ::testing::TestWithParam<HalfType> {};

TEST_P(PackHalfTest, PackAndUnpackApplyScaleAndMatchScalarConversions) {
  const HalfType type = GetParam();
  auto to_half = type == HalfType::kBf16 ? FloatToBf16 : FloatToFp16;
  auto to_float = type == HalfType::kBf16 ? Bf16ToFloat : Fp16ToFloat;
  const int64_t n = 1029;
  const std::vector<float> gradients = RandomFloats(n, 51, -8.0f, 8.0f);
  const float pack_scale = 0.25f;  // 1 / world_size, applied before rounding
  std::vector<uint16_t> packed(n, 0xdead);
  PackHalf(CpuContext(), type, n, pack_scale, gradients.data(), packed.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(packed[i], to_half(gradients[i] * pack_scale)) << i;
  }
  std::vector<float> unpacked = Poisoned(n);
  const float unpack_scale = 3.0f;
  UnpackHalf(CpuContext(), type, n, unpack_scale, packed.data(), unpacked.data());
  const double relative_precision = type == HalfType::kBf16 ? 0x1p-8 : 0x1p-11;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(unpacked[i], to_float(packed[i]) * unpack_scale) << i;
    const double expected = static_cast<double>(gradients[i]) * pack_scale * unpack_scale;
    ASSERT_NEAR(unpacked[i], expected, std::fabs(expected) * relative_precision + 1e-7) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BothFormats, PackHalfTest,
                         ::testing::Values(HalfType::kBf16, HalfType::kFp16), [](const auto& info) {
                           return std::string(info.param == HalfType::kBf16 ? "Bf16" : "Fp16");
                         });

// What a bf16 tensor holds, as a float: every finite value to its nearest bf16 with ties to even
// (the scalar conversion, checked above against the format's definition), overflow to inf, NaN
// kept NaN; out of place and in place alike.
TEST(RoundToBf16Test, GivesTheNearestBf16OfEveryValueInPlaceOrNot) {
  std::vector<float> in = RandomFloats(1003, 71, -300.0f, 300.0f);
  for (float special : {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, FromBits(0x7f7fffff),
                        0x1p-130f, INFINITY, -INFINITY, NAN}) {
    in.push_back(special);
  }
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<float> out = Poisoned(n);
  RoundToBf16(CpuContext(), n, in.data(), out.data());
  std::vector<float> in_place = in;
  RoundToBf16(CpuContext(), n, in_place.data(), in_place.data());
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(in[i])) {
      ASSERT_TRUE(std::isnan(out[i]) && std::isnan(in_place[i])) << i;
      continue;
    }
    const float expected = Bf16ToFloat(FloatToBf16(in[i]));
    ASSERT_EQ(Bits(out[i]), Bits(expected)) << i << " value " << in[i];
    ASSERT_EQ(Bits(in_place[i]), Bits(expected)) << i;
    ASSERT_EQ(Bits(out[i]) & 0xffffu, 0u) << "not a bf16 value: " << out[i];
  }
  EXPECT_EQ(out[n - 7], 1.0f);                // a tie goes to the even neighbour
  EXPECT_EQ(out[n - 6], 1.0f + 4 * 0x1p-8f);  // and the other tie up to it
  EXPECT_EQ(out[n - 5], INFINITY);            // the largest float overflows
  EXPECT_EQ(out[n - 4], 0x1p-130f);           // a subnormal float whose bits are bf16's
}

TEST(ScaleTest, MultipliesEveryElement) {
  std::vector<float> x = RandomFloats(1001, 61);
  const std::vector<float> original = x;
  Scale(CpuContext(), static_cast<int64_t>(x.size()), -0.125f, x.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], original[i] * -0.125f) << i;
}

}  // namespace
}  // namespace lockstep::kernels
