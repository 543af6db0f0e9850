// Softmax cross-entropy and argmax accuracy on the GPU: one warp per row (classes are tens to a
// few thousand), the formulas of cpu/softmax_cross_entropy.cc.
//
// Reproducibility: nothing is summed with atomics. A row's max, exp-sum (in double) and argmax
// are combined across the warp with a fixed butterfly; each row's loss (double) and hit go to
// scratch memory, and one block then adds them in a fixed order. The loss sum is therefore the
// same on every run; it differs from the CPU path's only through expf (CUDA's is within 2 ulp)
// and the order of the double additions.
//
// Host results: loss_sum and correct (and CountCorrect's result) are host values, so asking for
// them copies 32 bytes back and synchronises the stream; with both null, SoftmaxCrossEntropy
// stays asynchronous. A label outside [0, classes) cannot abort from the device: its row's
// gradient and loss become NaN, and the next synchronising call (this one when loss_sum or
// correct is asked for, as the trainer does) logs the row and label and aborts, as the CPU path
// does.
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/logging.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace lockstep::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowThreads = 256;  // 8 rows per block
constexpr int kReduceThreads = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

// What the host reads back. bad_row starts at all ones (no bad label).
struct RowTotals {
  double loss;
  long long correct;
  unsigned long long bad_row;
};

// A candidate for argmax: the first index of the maximum, NaN never chosen (the CPU scan's
// semantics, made associative so lanes can be combined in any order).
struct ArgMax {
  float value;
  int64_t index;  // -1: no candidate yet
};

__device__ __forceinline__ ArgMax Better(ArgMax a, ArgMax b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

enum class RowMode { kLossAndGradient, kArgMaxOnly };

template <RowMode kMode>
__global__ void __launch_bounds__(kRowThreads)
    RowKernel(int64_t rows, int64_t classes, const float* __restrict__ logits,
              const int32_t* __restrict__ labels, float grad_scale, float* __restrict__ dlogits,
              double* __restrict__ row_loss, int32_t* __restrict__ row_correct, RowTotals* totals) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (kRowThreads / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warps leave together
  const float* x = logits + row * classes;
  const int32_t label = labels[row];
  if (label < 0 || label >= classes) {
    if (lane == 0) {
      atomicMin(&totals->bad_row, static_cast<unsigned long long>(row));
      row_correct[row] = 0;
      if constexpr (kMode == RowMode::kLossAndGradient) row_loss[row] = CUDART_NAN;
    }
    if constexpr (kMode == RowMode::kLossAndGradient) {
      for (int64_t c = lane; c < classes; c += kWarp) dlogits[row * classes + c] = CUDART_NAN_F;
    }
    return;
  }

  ArgMax best{0.0f, -1};
  float max_logit = -CUDART_INF_F;
  for (int64_t c = lane; c < classes; c += kWarp) {
    const float v = x[c];
    if (!isnan(v)) best = Better(best, ArgMax{v, c});
    max_logit = fmaxf(max_logit, v);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const ArgMax other{__shfl_xor_sync(kFullMask, best.value, offset),
                       static_cast<int64_t>(
                           __shfl_xor_sync(kFullMask, static_cast<long long>(best.index), offset))};
    best = Better(best, other);
    max_logit = fmaxf(max_logit, __shfl_xor_sync(kFullMask, max_logit, offset));
  }
  // As the CPU scan: a NaN at index 0 is never beaten; no candidate at all means index 0.
  const int64_t predicted = (isnan(x[0]) || best.index < 0) ? 0 : best.index;
  if (lane == 0) row_correct[row] = predicted == label ? 1 : 0;

  if constexpr (kMode == RowMode::kLossAndGradient) {
    // exp(x - max) <= 1: nothing overflows however large the logits.
    double sum = 0.0;
    for (int64_t c = lane; c < classes; c += kWarp) sum += expf(__fsub_rn(x[c], max_logit));
    // A butterfly: every lane adds the same two values in the same order, so all lanes (and all
    // runs) end with the same sum.
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(kFullMask, sum, offset);
    }
    if (lane == 0) {
      row_loss[row] = log(sum) - (static_cast<double>(x[label]) - max_logit);
    }
    const double scale_over_sum = grad_scale / sum;
    float* d = dlogits + row * classes;
    for (int64_t c = lane; c < classes; c += kWarp) {
      const float e = expf(__fsub_rn(x[c], max_logit));
      const float g = static_cast<float>(e * scale_over_sum);
      d[c] = c == label ? __fsub_rn(g, grad_scale) : g;
    }
  }
}

// One block: each thread adds a strided set of rows in order, then a fixed tree across threads.
template <RowMode kMode>
__global__ void __launch_bounds__(kReduceThreads)
    ReduceRowsKernel(int64_t rows, const double* __restrict__ row_loss,
                     const int32_t* __restrict__ row_correct, RowTotals* totals,
                     double* accumulate_loss) {
  __shared__ double loss[kReduceThreads];
  __shared__ long long correct[kReduceThreads];
  double thread_loss = 0.0;
  long long thread_correct = 0;
  for (int64_t row = threadIdx.x; row < rows; row += kReduceThreads) {
    if constexpr (kMode == RowMode::kLossAndGradient) thread_loss += row_loss[row];
    thread_correct += row_correct[row];
  }
  loss[threadIdx.x] = thread_loss;
  correct[threadIdx.x] = thread_correct;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      correct[threadIdx.x] += correct[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals->loss = loss[0];
    totals->correct = correct[0];
    // One block, one thread: the accumulator is added to in stream order, never concurrently.
    if (accumulate_loss != nullptr) *accumulate_loss += loss[0];
  }
}

// Runs the row and reduction kernels; when `read_back`, copies the totals to the host, waits,
// and aborts on a bad label. A non-null `accumulate_loss` (device memory) gets the loss sum added
// without any host synchronisation.
template <RowMode kMode>
RowTotals RunRows(const ExecutionContext& ctx, const char* kernel, int64_t rows, int64_t classes,
                  const float* logits, const int32_t* labels, float grad_scale, float* dlogits,
                  bool read_back, double* accumulate_loss = nullptr) {
  const cudaStream_t stream = StreamOf(ctx);
  const size_t totals_bytes = AlignScratch(sizeof(RowTotals));
  const size_t loss_bytes =
      kMode == RowMode::kLossAndGradient ? AlignScratch(rows * sizeof(double)) : 0;
  const size_t correct_bytes = AlignScratch(rows * sizeof(int32_t));
  DeviceScratch scratch(totals_bytes + loss_bytes + correct_bytes, stream);
  RowTotals* totals = scratch.At<RowTotals>(0);
  double* row_loss =
      kMode == RowMode::kLossAndGradient ? scratch.At<double>(totals_bytes) : nullptr;
  int32_t* row_correct = scratch.At<int32_t>(totals_bytes + loss_bytes);

  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(totals, 0xff, sizeof(RowTotals), stream));
  constexpr int64_t kRowsPerBlock = kRowThreads / kWarp;
  RowKernel<kMode><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowThreads,
                     0, stream>>>(rows, classes, logits, labels, grad_scale, dlogits, row_loss,
                                  row_correct, totals);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  RowTotals host_totals{0.0, 0, std::numeric_limits<unsigned long long>::max()};
  if (!read_back && accumulate_loss == nullptr) return host_totals;

  ReduceRowsKernel<kMode><<<1, kReduceThreads, 0, stream>>>(rows, row_loss, row_correct, totals,
                                                            accumulate_loss);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (!read_back) return host_totals;
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(&host_totals, totals, sizeof(RowTotals), cudaMemcpyDeviceToHost, stream));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host_totals.bad_row != std::numeric_limits<unsigned long long>::max()) {
    const int64_t bad_row = static_cast<int64_t>(host_totals.bad_row);
    int32_t label = 0;
    LOCKSTEP_CUDA_CHECK(
        cudaMemcpy(&label, labels + bad_row, sizeof(label), cudaMemcpyDeviceToHost));
    LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": label " << label << " of row " << bad_row
                        << " is outside [0, " << classes << ")";
    std::abort();
  }
  return host_totals;
}

}  // namespace

void SoftmaxCrossEntropy(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                         const float* logits, const int32_t* labels, float grad_scale,
                         float* dlogits, double* loss_sum, int64_t* correct) {
  if (rows <= 0 || classes <= 0) {
    if (loss_sum != nullptr) *loss_sum = 0.0;
    if (correct != nullptr) *correct = 0;
    return;
  }
  const RowTotals totals = RunRows<RowMode::kLossAndGradient>(
      ctx, "SoftmaxCrossEntropy", rows, classes, logits, labels, grad_scale, dlogits,
      loss_sum != nullptr || correct != nullptr);
  if (loss_sum != nullptr) *loss_sum = totals.loss;
  if (correct != nullptr) *correct = totals.correct;
}

void SoftmaxCrossEntropyAccumulate(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                                   const float* logits, const int32_t* labels, float grad_scale,
                                   float* dlogits, double* loss_accumulator) {
  if (rows <= 0 || classes <= 0) return;
  RunRows<RowMode::kLossAndGradient>(ctx, "SoftmaxCrossEntropyAccumulate", rows, classes, logits,
                                     labels, grad_scale, dlogits, /*read_back=*/false,
                                     loss_accumulator);
}

int64_t CountCorrect(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                     const float* logits, const int32_t* labels) {
  if (rows <= 0 || classes <= 0) return 0;
  return RunRows<RowMode::kArgMaxOnly>(ctx, "CountCorrect", rows, classes, logits, labels, 0.0f,
                                       nullptr, true)
      .correct;
}

}  // namespace lockstep::kernels::cuda
