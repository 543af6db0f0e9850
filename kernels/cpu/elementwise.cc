// Elementwise kernels: Scale, and the half-precision bucket pack/unpack for compressed
// all-reduce (conversions in kernels/cpu/half_convert.h).
#include <cstdlib>

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

}  // namespace lockstep::kernels::cpu
