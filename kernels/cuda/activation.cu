// Fused bias + activation on the GPU, forward and backward, with cpu/activation.cc's formulas
// (gelu the exact erf form; relu's and tanh's gradients from the output).
//
// Forward: one flat pass over x[rows, cols], 16-byte accesses when cols % 4 == 0 and the arrays
// are 16-byte aligned (every float4 then lies within one row), one element at a time otherwise.
//
// Backward: dx is written into dy in place and dbias[c] = sum over rows of dx[., c] is summed in
// double, deterministically (no atomics): the rows are cut into chunks whose size depends only on
// `rows`; each block sums one chunk of 32 columns in a fixed order and writes a partial per chunk
// and column to scratch memory, and a second kernel adds each column's partials in chunk order.
// The result is the same on every run and every GPU, and equals the CPU path's up to the order
// of the double additions (invisible after rounding to float but for rare ties).
//
// identity, relu and tanh use only IEEE-rounded operations written as *_rn intrinsics (no FMA
// contraction), so their outputs are bit-identical to the CPU path's given the same inputs; gelu
// and tanh forward call CUDA's erff/expf/tanhf (at most 2 ulp from the correctly rounded value),
// so they differ from glibc's by a few ulp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common/logging.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace lockstep::kernels::cuda {
namespace {

constexpr int kForwardThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

template <ActivationType kAct>
__device__ __forceinline__ float Activate(float v) {
  if constexpr (kAct == ActivationType::kRelu) {
    return v < 0.0f ? 0.0f : v;  // NaN kept, as torch.relu
  } else if constexpr (kAct == ActivationType::kGelu) {
    return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, erff(__fmul_rn(v, kInvSqrt2))));
  } else if constexpr (kAct == ActivationType::kTanh) {
    return tanhf(v);
  } else {
    return v;
  }
}

// dL/d(pre-activation) from dL/d(output) `d` and the saved value `s` (the output y for relu and
// tanh, the pre-activation for gelu, unused for identity).
template <ActivationType kAct>
__device__ __forceinline__ float InputGradient(float d, float s) {
  if constexpr (kAct == ActivationType::kRelu) {
    return s > 0.0f ? d : 0.0f;  // a select: a non-finite d is dropped where the unit is off
  } else if constexpr (kAct == ActivationType::kGelu) {
    const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(s, kInvSqrt2))));
    const float pdf = __fmul_rn(kInvSqrt2Pi, expf(__fmul_rn(__fmul_rn(-0.5f, s), s)));
    return __fmul_rn(d, __fadd_rn(cdf, __fmul_rn(s, pdf)));
  } else if constexpr (kAct == ActivationType::kTanh) {
    return __fmul_rn(d, __fsub_rn(1.0f, __fmul_rn(s, s)));
  } else {
    return d;
  }
}

template <ActivationType kAct>
__device__ __forceinline__ float BiasActivate(float x, float b, float* pre, int64_t i) {
  const float v = __fadd_rn(x, b);
  if (pre != nullptr) pre[i] = v;
  return Activate<kAct>(v);
}

// One element per iteration.
template <ActivationType kAct>
__global__ void __launch_bounds__(kForwardThreads)
    ForwardScalarKernel(int64_t n, int64_t cols, const float* __restrict__ bias,
                        float* __restrict__ x, float* __restrict__ pre) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = BiasActivate<kAct>(x[i], bias[i % cols], pre, i);
  }
}

// Four elements of one row per iteration; requires cols % 4 == 0 and 16-byte aligned arrays.
template <ActivationType kAct>
__global__ void __launch_bounds__(kForwardThreads)
    ForwardVectorKernel(int64_t vectors, int64_t cols, const float* __restrict__ bias,
                        float* __restrict__ x, float* __restrict__ pre) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += stride) {
    const int64_t i = 4 * v;
    float4 value = *reinterpret_cast<const float4*>(x + i);
    const float4 b = *reinterpret_cast<const float4*>(bias + i % cols);
    float4 v_pre;
    v_pre.x = __fadd_rn(value.x, b.x);
    v_pre.y = __fadd_rn(value.y, b.y);
    v_pre.z = __fadd_rn(value.z, b.z);
    v_pre.w = __fadd_rn(value.w, b.w);
    if (pre != nullptr) *reinterpret_cast<float4*>(pre + i) = v_pre;
    value.x = Activate<kAct>(v_pre.x);
    value.y = Activate<kAct>(v_pre.y);
    value.z = Activate<kAct>(v_pre.z);
    value.w = Activate<kAct>(v_pre.w);
    *reinterpret_cast<float4*>(x + i) = value;
  }
}

template <ActivationType kAct>
void LaunchForward(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias, float* x,
                   float* pre) {
  const int64_t n = rows * cols;
  const bool vector = cols % 4 == 0 && VectorPrologue({{x, 4}, {bias, 4}}) == 0 &&
                      (pre == nullptr || VectorPrologue({{pre, 4}}) == 0);
  if (vector) {
    ForwardVectorKernel<kAct><<<GridSizeFor(n / 4, kForwardThreads), kForwardThreads, 0, stream>>>(
        n / 4, cols, bias, x, pre);
  } else {
    ForwardScalarKernel<kAct>
        <<<GridSizeFor(n, kForwardThreads), kForwardThreads, 0, stream>>>(n, cols, bias, x, pre);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// Backward: a block is kColumnTile columns (one warp's width, so each row's loads coalesce)
// by kRowLanes rows at a time.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
// Chunks: at least kMinChunkRows rows each (the partials stay small next to dy), at most
// kMaxChunks of them (bounded scratch); a function of `rows` alone, for reproducibility.
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxChunks = 512;

int64_t ChunkRows(int64_t rows) {
  const int64_t spread = (rows + kMaxChunks - 1) / kMaxChunks;
  const int64_t chunk = std::max(kMinChunkRows, spread);
  return (chunk + kRowLanes - 1) / kRowLanes * kRowLanes;
}

// kVec columns per thread: 4 (16-byte accesses, a warp covers 128 columns) when the rows are a
// multiple of 4 floats long and both arrays are 16-byte aligned, else 1. Measured on an H100:
// 73-78% of a device-to-device copy with 1, the 4-byte loads leaving too few bytes in flight.
template <ActivationType kAct, int kVec>
__global__ void __launch_bounds__(kColumnTile* kRowLanes)
    BackwardPartialKernel(int64_t rows, int64_t cols, int64_t chunk_rows,
                          const float* __restrict__ saved, float* __restrict__ dy,
                          double* __restrict__ partials) {
  // +1: no bank conflicts on the sum
  __shared__ double lane_sums[kRowLanes][kColumnTile * kVec + 1];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x) * kVec;
  const int64_t chunk = blockIdx.y;
  const int64_t row_end = min(rows, (chunk + 1) * chunk_rows);
  double sum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) sum[j] = 0.0;
  if (col < cols) {
#pragma unroll 4
    for (int64_t row = chunk * chunk_rows + threadIdx.y; row < row_end; row += kRowLanes) {
      const int64_t i = row * cols + col;
      if constexpr (kVec == 4) {
        const float4 s = kAct == ActivationType::kIdentity
                             ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                             : *reinterpret_cast<const float4*>(saved + i);
        float4 d = *reinterpret_cast<const float4*>(dy + i);
        d.x = InputGradient<kAct>(d.x, s.x);
        d.y = InputGradient<kAct>(d.y, s.y);
        d.z = InputGradient<kAct>(d.z, s.z);
        d.w = InputGradient<kAct>(d.w, s.w);
        *reinterpret_cast<float4*>(dy + i) = d;
        sum[0] += d.x;
        sum[1] += d.y;
        sum[2] += d.z;
        sum[3] += d.w;
      } else {
        const float s = kAct == ActivationType::kIdentity ? 0.0f : saved[i];
        const float dx = InputGradient<kAct>(dy[i], s);
        dy[i] = dx;
        sum[0] += dx;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) lane_sums[threadIdx.y][threadIdx.x * kVec + j] = sum[j];
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      double total = lane_sums[0][threadIdx.x * kVec + j];
      for (int lane = 1; lane < kRowLanes; ++lane) total += lane_sums[lane][threadIdx.x * kVec + j];
      partials[chunk * cols + col + j] = total;
    }
  }
}

__global__ void FinishColumnSumsKernel(int64_t cols, int64_t chunks,
                                       const double* __restrict__ partials, bool accumulate,
                                       float* __restrict__ dbias) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  double total = 0.0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) total += partials[chunk * cols + col];
  const float sum = static_cast<float>(total);
  dbias[col] = accumulate ? dbias[col] + sum : sum;
}

template <ActivationType kAct>
void LaunchBackward(cudaStream_t stream, int64_t rows, int64_t cols, const float* saved, float* dy,
                    float* dbias, bool accumulate) {
  const int64_t chunk_rows = ChunkRows(rows);
  const int64_t chunks = rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 0;
  DeviceScratch partials(static_cast<size_t>(chunks * cols) * sizeof(double), stream);
  if (chunks > 0) {
    const bool vectors = cols % 4 == 0 && reinterpret_cast<uintptr_t>(dy) % 16 == 0 &&
                         (saved == nullptr || reinterpret_cast<uintptr_t>(saved) % 16 == 0);
    const int64_t tile = vectors ? kColumnTile * 4 : kColumnTile;
    const dim3 grid(static_cast<unsigned>((cols + tile - 1) / tile),
                    static_cast<unsigned>(chunks));
    if (vectors) {
      BackwardPartialKernel<kAct, 4><<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
          rows, cols, chunk_rows, saved, dy, partials.At<double>(0));
    } else {
      BackwardPartialKernel<kAct, 1><<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
          rows, cols, chunk_rows, saved, dy, partials.At<double>(0));
    }
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  constexpr int kFinishThreads = 256;
  FinishColumnSumsKernel<<<static_cast<unsigned>((cols + kFinishThreads - 1) / kFinishThreads),
                           kFinishThreads, 0, stream>>>(cols, chunks, partials.At<double>(0),
                                                        accumulate, dbias);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

[[noreturn]] void DieUnknownActivation(const char* kernel, ActivationType act) {
  LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": unknown activation " << static_cast<int>(act);
  std::abort();
}

[[noreturn]] void DieMissingInput(const char* what, ActivationType act) {
  LOCKSTEP_LOG(ERROR) << "kernels::BiasActivationBackward: activation " << static_cast<int>(act)
                      << " needs " << what << ", which is null";
  std::abort();
}

}  // namespace

void BiasActivationForward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                           int64_t cols, const float* bias, float* x, float* pre_activation) {
  if (rows <= 0 || cols <= 0) return;
  const cudaStream_t stream = StreamOf(ctx);
  switch (act) {
    case ActivationType::kIdentity:
      return LaunchForward<ActivationType::kIdentity>(stream, rows, cols, bias, x, pre_activation);
    case ActivationType::kRelu:
      return LaunchForward<ActivationType::kRelu>(stream, rows, cols, bias, x, pre_activation);
    case ActivationType::kGelu:
      return LaunchForward<ActivationType::kGelu>(stream, rows, cols, bias, x, pre_activation);
    case ActivationType::kTanh:
      return LaunchForward<ActivationType::kTanh>(stream, rows, cols, bias, x, pre_activation);
  }
  DieUnknownActivation("BiasActivationForward", act);
}

void BiasActivationBackward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                            int64_t cols, const float* y, const float* pre_activation, float* dy,
                            float* dbias, bool accumulate) {
  if (cols <= 0) return;
  if (rows < 0) rows = 0;
  const cudaStream_t stream = StreamOf(ctx);
  switch (act) {
    case ActivationType::kIdentity:
      return LaunchBackward<ActivationType::kIdentity>(stream, rows, cols, nullptr, dy, dbias,
                                                       accumulate);
    case ActivationType::kRelu:
      if (rows > 0 && y == nullptr) DieMissingInput("the output y", act);
      return LaunchBackward<ActivationType::kRelu>(stream, rows, cols, y, dy, dbias, accumulate);
    case ActivationType::kGelu:
      if (rows > 0 && pre_activation == nullptr) DieMissingInput("the pre-activation", act);
      return LaunchBackward<ActivationType::kGelu>(stream, rows, cols, pre_activation, dy, dbias,
                                                   accumulate);
    case ActivationType::kTanh:
      if (rows > 0 && y == nullptr) DieMissingInput("the output y", act);
      return LaunchBackward<ActivationType::kTanh>(stream, rows, cols, y, dy, dbias, accumulate);
  }
  DieUnknownActivation("BiasActivationBackward", act);
}

}  // namespace lockstep::kernels::cuda
