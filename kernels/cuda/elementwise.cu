// The flat elementwise kernels on the GPU: Scale, SetZero, CountNonFinite, half-precision
// pack/unpack, RoundToBf16, and the fused
// SGD-momentum and AdamW updates. Each is one pass over its arrays, reading every element once
// and writing it once, with 16-byte accesses (float4; 8-byte ushort4 for halves) wherever the
// arrays share their alignment (VectorPrologue), which is what reaches the memory bandwidth.
//
// Bit parity with the CPU path: every floating-point operation is written as an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), in the CPU code's order, so nvcc cannot
// fuse a multiply and an add into an FMA (the CPU build, at baseline x86-64, has no FMA), and
// sqrt and division are the IEEE ones. The per-call scalars (bias corrections) are computed on
// the host exactly as the CPU path computes them. The results are then identical to the CPU
// path's, bit for bit, for every non-NaN value (NaN stays NaN; its payload is not kept, because
// the GPU's arithmetic returns the canonical NaN).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>

#include "common/logging.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace lockstep::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Runs op.Vector(i) on each 4-element group [i, i + 4) of the split and op.Scalar(i) on the head
// and tail elements, in a grid-stride loop.
template <typename Op>
__global__ void __launch_bounds__(kThreads) ElementwiseKernel(Op op, VectorSplit split) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = thread; v < split.vectors; v += stride) op.Vector(split.head + 4 * v);
  for (int64_t i = thread; i < split.head; i += stride) op.Scalar(i);
  for (int64_t i = split.head + 4 * split.vectors + thread; i < split.n; i += stride) {
    op.Scalar(i);
  }
}

template <typename Op>
void LaunchElementwise(const ExecutionContext& ctx, int64_t n, const Op& op,
                       std::initializer_list<ArrayAddress> arrays) {
  if (n <= 0) return;
  const VectorSplit split = SplitForVectors(n, VectorPrologue(arrays));
  const int64_t items = split.vectors > 0 ? split.vectors : n;
  ElementwiseKernel<<<GridSizeFor(items, kThreads), kThreads, 0, StreamOf(ctx)>>>(op, split);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void Store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Counts the non-finite values: one integer atomic per block (integer sums are exact in any order).
__global__ void __launch_bounds__(kThreads)
    CountNonFiniteKernel(int64_t n, const float* __restrict__ x, unsigned long long* count) {
  __shared__ unsigned int block_count;
  if (threadIdx.x == 0) block_count = 0;
  __syncthreads();
  unsigned int mine = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    mine += isfinite(x[i]) ? 0u : 1u;
  }
  if (mine != 0) atomicAdd(&block_count, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_count != 0) atomicAdd(count, block_count);
}

struct ScaleOp {
  float* x;
  float scale;
  __device__ void Scalar(int64_t i) const { x[i] = __fmul_rn(x[i], scale); }
  __device__ void Vector(int64_t i) const {
    float4 v = Load4(x + i);
    v.x = __fmul_rn(v.x, scale);
    v.y = __fmul_rn(v.y, scale);
    v.z = __fmul_rn(v.z, scale);
    v.w = __fmul_rn(v.w, scale);
    Store4(x + i, v);
  }
};

// float -> half bits, round to nearest even (cvt.rn); overflow goes to inf, NaN to NaN.
struct ToBf16 {
  __device__ static uint16_t Convert(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
struct ToFp16 {
  __device__ static uint16_t Convert(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
// half bits -> float, exact.
struct FromBf16 {
  __device__ static float Convert(uint16_t h) { return __uint_as_float(uint32_t{h} << 16); }
};
struct FromFp16 {
  __device__ static float Convert(uint16_t h) { return __half2float(__ushort_as_half(h)); }
};

template <typename Format>
struct PackOp {
  const float* in;
  uint16_t* out;
  float scale;
  __device__ void Scalar(int64_t i) const { out[i] = Format::Convert(__fmul_rn(in[i], scale)); }
  __device__ void Vector(int64_t i) const {
    const float4 v = Load4(in + i);
    ushort4 h;
    h.x = Format::Convert(__fmul_rn(v.x, scale));
    h.y = Format::Convert(__fmul_rn(v.y, scale));
    h.z = Format::Convert(__fmul_rn(v.z, scale));
    h.w = Format::Convert(__fmul_rn(v.w, scale));
    *reinterpret_cast<ushort4*>(out + i) = h;
  }
};

template <typename Format>
struct UnpackOp {
  const uint16_t* in;
  float* out;
  float scale;
  __device__ void Scalar(int64_t i) const { out[i] = __fmul_rn(Format::Convert(in[i]), scale); }
  __device__ void Vector(int64_t i) const {
    const ushort4 h = *reinterpret_cast<const ushort4*>(in + i);
    float4 v;
    v.x = __fmul_rn(Format::Convert(h.x), scale);
    v.y = __fmul_rn(Format::Convert(h.y), scale);
    v.z = __fmul_rn(Format::Convert(h.z), scale);
    v.w = __fmul_rn(Format::Convert(h.w), scale);
    Store4(out + i, v);
  }
};

// out = float(bf16(in)); out may be in (each element is read before it is written).
struct RoundToBf16Op {
  const float* in;
  float* out;
  __device__ static float Round(float v) { return FromBf16::Convert(ToBf16::Convert(v)); }
  __device__ void Scalar(int64_t i) const { out[i] = Round(in[i]); }
  __device__ void Vector(int64_t i) const {
    float4 v = Load4(in + i);
    v.x = Round(v.x);
    v.y = Round(v.y);
    v.z = Round(v.z);
    v.w = Round(v.w);
    Store4(out + i, v);
  }
};

// torch.optim.SGD (dampening 0, no Nesterov); on the first step the buffer is only written.
template <bool kFirstStep>
struct SgdOp {
  float* param;
  const float* grad;
  float* buffer;
  float lr, momentum, weight_decay;

  __device__ void Update(float& p, float g, float& buf) const {
    const float decayed = __fadd_rn(g, __fmul_rn(weight_decay, p));
    buf = kFirstStep ? decayed : __fadd_rn(__fmul_rn(momentum, buf), decayed);
    p = __fsub_rn(p, __fmul_rn(lr, buf));
  }
  __device__ void Scalar(int64_t i) const {
    float p = param[i], buf = kFirstStep ? 0.0f : buffer[i];
    Update(p, grad[i], buf);
    param[i] = p;
    buffer[i] = buf;
  }
  __device__ void Vector(int64_t i) const {
    float4 p = Load4(param + i);
    const float4 g = Load4(grad + i);
    float4 buf = kFirstStep ? float4{} : Load4(buffer + i);
    Update(p.x, g.x, buf.x);
    Update(p.y, g.y, buf.y);
    Update(p.z, g.z, buf.z);
    Update(p.w, g.w, buf.w);
    Store4(param + i, p);
    Store4(buffer + i, buf);
  }
};

// The scalars of one AdamW call, computed on the host as cpu::AdamWUpdate computes them.
struct AdamWScalars {
  float decay;                  // 1 - lr * weight_decay
  float step_size;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float avg_weight;             // 1 - beta1
  float avg_weight_complement;  // 1 - (1 - beta1)
  bool lerp_from_start;         // torch.lerp's form: avg_weight < 0.5
  float beta2;
  float sq_weight;  // 1 - beta2
  float epsilon;
};

struct AdamWOp {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWScalars s;

  __device__ void Update(float& param_value, float g, float& m, float& v) const {
    const float p = __fmul_rn(param_value, s.decay);
    m = s.lerp_from_start ? __fadd_rn(m, __fmul_rn(s.avg_weight, __fsub_rn(g, m)))
                          : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), s.avg_weight_complement));
    v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(s.sq_weight, __fmul_rn(g, g)));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.epsilon);
    param_value = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
  }
  __device__ void Scalar(int64_t i) const {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    Update(p, grad[i], m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
  __device__ void Vector(int64_t i) const {
    float4 p = Load4(param + i);
    const float4 g = Load4(grad + i);
    float4 m = Load4(exp_avg + i);
    float4 v = Load4(exp_avg_sq + i);
    Update(p.x, g.x, m.x, v.x);
    Update(p.y, g.y, m.y, v.y);
    Update(p.z, g.z, m.z, v.z);
    Update(p.w, g.w, m.w, v.w);
    Store4(param + i, p);
    Store4(exp_avg + i, m);
    Store4(exp_avg_sq + i, v);
  }
};

ArrayAddress Floats(const float* p) { return {p, sizeof(float)}; }
ArrayAddress Halves(const uint16_t* p) { return {p, sizeof(uint16_t)}; }

[[noreturn]] void DieUnknownHalfType(const char* kernel, HalfType type) {
  LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": unknown half type " << static_cast<int>(type);
  std::abort();
}

}  // namespace

void Scale(const ExecutionContext& ctx, int64_t n, float scale, float* x) {
  LaunchElementwise(ctx, n, ScaleOp{x, scale}, {Floats(x)});
}

void SetZero(const ExecutionContext& ctx, int64_t n, float* x) {
  if (n <= 0) return;
  LOCKSTEP_CUDA_CHECK(
      cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), StreamOf(ctx)));
}

int64_t CountNonFinite(const ExecutionContext& ctx, int64_t n, const float* x) {
  if (n <= 0) return 0;
  const cudaStream_t stream = StreamOf(ctx);
  DeviceScratch scratch(AlignScratch(sizeof(unsigned long long)), stream);
  unsigned long long* count = scratch.At<unsigned long long>(0);
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned long long), stream));
  CountNonFiniteKernel<<<GridSizeFor(n, kThreads), kThreads, 0, stream>>>(n, x, count);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  unsigned long long host_count = 0;
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(&host_count, count, sizeof(host_count), cudaMemcpyDeviceToHost, stream));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<int64_t>(host_count);
}

void PackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale, const float* in,
              uint16_t* out) {
  switch (type) {
    case HalfType::kBf16:
      return LaunchElementwise(ctx, n, PackOp<ToBf16>{in, out, scale}, {Floats(in), Halves(out)});
    case HalfType::kFp16:
      return LaunchElementwise(ctx, n, PackOp<ToFp16>{in, out, scale}, {Floats(in), Halves(out)});
  }
  DieUnknownHalfType("PackHalf", type);
}

void UnpackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale,
                const uint16_t* in, float* out) {
  switch (type) {
    case HalfType::kBf16:
      return LaunchElementwise(ctx, n, UnpackOp<FromBf16>{in, out, scale},
                               {Halves(in), Floats(out)});
    case HalfType::kFp16:
      return LaunchElementwise(ctx, n, UnpackOp<FromFp16>{in, out, scale},
                               {Halves(in), Floats(out)});
  }
  DieUnknownHalfType("UnpackHalf", type);
}

void RoundToBf16(const ExecutionContext& ctx, int64_t n, const float* in, float* out) {
  LaunchElementwise(ctx, n, RoundToBf16Op{in, out}, {Floats(in), Floats(out)});
}

void SgdMomentumUpdate(const ExecutionContext& ctx, int64_t n, float lr, float momentum,
                       float weight_decay, bool first_step, float* param, const float* grad,
                       float* momentum_buffer) {
  const std::initializer_list<ArrayAddress> arrays = {Floats(param), Floats(grad),
                                                      Floats(momentum_buffer)};
  if (first_step) {
    LaunchElementwise(ctx, n, SgdOp<true>{param, grad, momentum_buffer, lr, momentum, weight_decay},
                      arrays);
  } else {
    LaunchElementwise(
        ctx, n, SgdOp<false>{param, grad, momentum_buffer, lr, momentum, weight_decay}, arrays);
  }
}

void AdamWUpdate(const ExecutionContext& ctx, int64_t n, float lr, float beta1, float beta2,
                 float epsilon, float weight_decay, int64_t step, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq) {
  // The same expressions, in the same precisions, as cpu::AdamWUpdate.
  const double steps = static_cast<double>(step < 1 ? 1 : step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), steps);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), steps);
  AdamWScalars s;
  s.step_size = static_cast<float>(lr / bias_correction1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  s.avg_weight = 1.0f - beta1;
  s.avg_weight_complement = 1.0f - s.avg_weight;
  s.lerp_from_start = s.avg_weight < 0.5f;
  s.beta2 = beta2;
  s.sq_weight = 1.0f - beta2;
  s.epsilon = epsilon;
  LaunchElementwise(ctx, n, AdamWOp{param, grad, exp_avg, exp_avg_sq, s},
                    {Floats(param), Floats(grad), Floats(exp_avg), Floats(exp_avg_sq)});
}

}  // namespace lockstep::kernels::cuda
