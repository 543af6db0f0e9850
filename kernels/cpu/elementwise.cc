// Elementwise kernels: Scale, SetZero, CountNonFinite, the half-precision bucket pack/unpack for
// compressed all-reduce, and RoundToBf16 for bf16 mixed precision (conversions in
// kernels/cpu/half_convert.h).
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/half_convert.h"

namespace lockstep::kernels::cpu {
namespace {

[[noreturn]] void DieUnknownHalfType(const char* kernel, HalfType type) {
  LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": unknown half type " << static_cast<int>(type);
  std::abort();
}

}  // namespace

void Scale(int64_t n, float scale, float* __restrict x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void SetZero(int64_t n, float* x) {
  if (n > 0) std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}

int64_t CountNonFinite(int64_t n, const float* __restrict x) {
  // Finite means the exponent bits are not all ones: integer work that vectorises.
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    count += (bits & 0x7f800000u) == 0x7f800000u ? 1 : 0;
  }
  return count;
}

void PackHalf(HalfType type, int64_t n, float scale, const float* __restrict in,
              uint16_t* __restrict out) {
  switch (type) {
    case HalfType::kBf16:
      for (int64_t i = 0; i < n; ++i) out[i] = internal::FloatToBf16Inline(in[i] * scale);
      return;
    case HalfType::kFp16:
      for (int64_t i = 0; i < n; ++i) out[i] = internal::FloatToFp16Inline(in[i] * scale);
      return;
  }
  DieUnknownHalfType("PackHalf", type);
}

void UnpackHalf(HalfType type, int64_t n, float scale, const uint16_t* __restrict in,
                float* __restrict out) {
  switch (type) {
    case HalfType::kBf16:
      for (int64_t i = 0; i < n; ++i) out[i] = internal::Bf16ToFloatInline(in[i]) * scale;
      return;
    case HalfType::kFp16:
      for (int64_t i = 0; i < n; ++i) out[i] = internal::Fp16ToFloatInline(in[i]) * scale;
      return;
  }
  DieUnknownHalfType("UnpackHalf", type);
}

// No __restrict: in and out may be the same buffer, and each element is read before it is written.
void RoundToBf16(int64_t n, const float* in, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = internal::Bf16ToFloatInline(internal::FloatToBf16Inline(in[i]));
  }
}

}  // namespace lockstep::kernels::cpu
