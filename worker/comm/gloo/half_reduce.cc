#include "worker/comm/gloo/half_reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace lockstep::comm {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return std::min(a, b); }
};

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float), typename Op>
void ReduceHalves(void* out, const void* a, const void* b, size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  Op op;
  for (size_t i = 0; i < count; ++i) o[i] = kFromFloat(op(kToFloat(x[i]), kToFloat(y[i])));
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBFloat16(float value) {
  uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToFloat16(float value) {
  uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits >= 0x7f800000u) return sign | (bits > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (bits >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: infinity
  if (bits < 0x38800000u) {                       // below 2^-14: subnormal half (or zero)
    return sign | static_cast<uint16_t>(std::nearbyint(BitsFloat(bits) * 16777216.0f));
  }
  const uint32_t mantissa_odd = (bits >> 13) & 1u;
  bits += 0xc8000fffu + mantissa_odd;  // rebias the exponent (127 -> 15) and round half to even
  return sign | static_cast<uint16_t>(bits >> 13);
}

ReduceFunction HalfReduceFunction(DataType type, ReduceOp op) {
  if (type == DataType::kBFloat16) {
    switch (op) {
      case ReduceOp::kSum:
        return &ReduceHalves<BFloat16ToFloat, FloatToBFloat16, Sum>;
      case ReduceOp::kMax:
        return &ReduceHalves<BFloat16ToFloat, FloatToBFloat16, Max>;
      case ReduceOp::kMin:
        return &ReduceHalves<BFloat16ToFloat, FloatToBFloat16, Min>;
    }
  }
  if (type == DataType::kFloat16) {
    switch (op) {
      case ReduceOp::kSum:
        return &ReduceHalves<Float16ToFloat, FloatToFloat16, Sum>;
      case ReduceOp::kMax:
        return &ReduceHalves<Float16ToFloat, FloatToFloat16, Max>;
      case ReduceOp::kMin:
        return &ReduceHalves<Float16ToFloat, FloatToFloat16, Min>;
    }
  }
  return nullptr;
}

}  // namespace lockstep::comm
