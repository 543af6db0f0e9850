// Element-wise reductions for the 16-bit float types that Gloo's new-style collectives take as a
// plain function (gloo::AllreduceOptions::Func). Each element is widened to float, reduced and
// rounded back to nearest-even, which is what the trainer's bf16/fp16 gradient compression
// expects (the sum is as exact as one rounding per hop allows).
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/comm/communicator.h"

namespace lockstep::comm {

using ReduceFunction = void (*)(void* out, const void* a, const void* b, size_t count);

// The reduction for `type` and `op`; nullptr when there is none.
ReduceFunction HalfReduceFunction(DataType type, ReduceOp op);

// Conversions, exposed for tests: round to nearest even, NaN stays NaN, overflow becomes inf.
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float Float16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float value);

}  // namespace lockstep::comm
