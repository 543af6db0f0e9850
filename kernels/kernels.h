// Lockstep's compute kernels: every operation the built-in trainer needs, behind plain host
// functions (Horovod's ops are the model). Each function takes an ExecutionContext that names the
// device and, for CUDA, the stream the work is queued on; CPU calls run synchronously on the
// calling thread.
//
// Layout conventions: matrices are row-major; a batch of activations is [rows = batch, cols =
// features]. All pointers refer to memory of the context's device. Parameters, gradients and
// optimizer state each live in one flat buffer, so a gradient bucket is a contiguous slice and the
// optimizer is one fused pass over the whole model.
//
// Thread safety: functions keep no state; callers serialise use of a context.
//
// Errors: these functions return void, so misuse is a programming error reported by one ERROR log
// line and abort(): DeviceType::kCuda in a build without the CUDA kernels (check CudaAvailable()
// first), a label outside [0, classes), a null input the activation needs, a Gemm dimension
// beyond 32-bit BLAS indices. Empty sizes do no work beyond the empty result (Gemm with k = 0
// computes C = beta * C; zero rows give dbias = 0). On the CUDA path a failed CUDA or cuBLAS call
// aborts the same way, naming the call and the error (kernels/cuda/cuda_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace lockstep::kernels {

enum class DeviceType { kCpu, kCuda };
enum class ActivationType { kIdentity, kRelu, kGelu, kTanh };
enum class HalfType { kBf16, kFp16 };

struct ExecutionContext {
  DeviceType device = DeviceType::kCpu;
  void* cuda_stream = nullptr;  // cudaStream_t when device == kCuda
  void* blas_handle = nullptr;  // cublasHandle_t when device == kCuda
  // CUDA Gemm only: let cuBLAS use TF32 tensor cores (inputs rounded to a 10-bit mantissa;
  // several times faster on large layers, ~1e-3 relative error). Off by default, so the GPU
  // matches the CPU path and PyTorch's default within fp32 rounding. The CPU path ignores it.
  bool allow_tf32 = false;
  // CUDA Gemm only: the caller promises that every value of both operands is a bf16 held in a
  // float (trainer::Precision::kBf16 rounds them with RoundToBf16), so cuBLAS may run bf16
  // tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF): the down-conversion is then exact and the result
  // is the fp32 sum of exact products, what the CPU's fp32 GEMM of the same values computes up to
  // summation order. The CPU path ignores it. Takes precedence over allow_tf32.
  bool bf16_operands = false;
};

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) is X or X^T.
// A is [M,K] (or [K,M] when transpose_a), B is [K,N] (or [N,K] when transpose_b).
void Gemm(const ExecutionContext& ctx, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c);

// In place on x[rows, cols]: x = act(x + bias) with bias[cols]. Also writes the pre-activation
// (x + bias) to `pre_activation` when it is not null (needed by gelu backward; relu and tanh
// backward need only the output). gelu is the exact erf form, PyTorch's default.
void BiasActivationForward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                           int64_t cols, const float* bias, float* x, float* pre_activation);

// Given dy = dL/d(output) [rows, cols], the layer's output y and pre-activation (may be null
// for relu/identity/tanh, which use y; y may be null for identity and gelu): writes
// dx = dL/d(pre-activation) into dy in place, and dbias[cols] = sum over rows of dx, summed in
// double: overwriting dbias, or, with `accumulate`, adding the sum to it (gradient accumulation
// over micro-batches; zero rows then leave dbias as it was). A null input the activation needs
// is a programming error: logged, then abort().
void BiasActivationBackward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                            int64_t cols, const float* y, const float* pre_activation, float* dy,
                            float* dbias, bool accumulate = false);

// Softmax cross-entropy over logits[rows, classes] with integer labels[rows] in [0, classes).
// Writes dlogits[rows, classes] = (softmax - onehot) * grad_scale, and returns through
// loss_sum the sum (not mean) of the per-row losses, computed in double. Numerically stable
// (max-subtracted). `grad_scale` is 1/global_batch so per-rank gradients sum to the global mean.
// Also counts correct argmax predictions into *correct when not null.
void SoftmaxCrossEntropy(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                         const float* logits, const int32_t* labels, float grad_scale,
                         float* dlogits, double* loss_sum, int64_t* correct);

// The training step's form: the same gradients, and the loss sum (double) ADDED to
// *loss_accumulator, which is memory of the context's device, without any host synchronisation;
// the trainer reads the accumulator once per log interval. A label outside [0, classes) makes
// the accumulated loss NaN on CUDA (the device cannot abort) and aborts on the CPU.
void SoftmaxCrossEntropyAccumulate(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                                   const float* logits, const int32_t* labels, float grad_scale,
                                   float* dlogits, double* loss_accumulator);

// Counts rows whose argmax equals the label (evaluation).
int64_t CountCorrect(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                     const float* logits, const int32_t* labels);

// SGD with momentum and decoupled-from-nothing (L2) weight decay, PyTorch's convention:
//   g = grad + weight_decay * param; buf = momentum * buf + g (buf = g on the first step);
//   param -= lr * buf
void SgdMomentumUpdate(const ExecutionContext& ctx, int64_t n, float lr, float momentum,
                       float weight_decay, bool first_step, float* param, const float* grad,
                       float* momentum_buffer);

// AdamW (Loshchilov & Hutter), PyTorch's convention; `step` counts from 1:
//   param *= (1 - lr * weight_decay); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   param -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
void AdamWUpdate(const ExecutionContext& ctx, int64_t n, float lr, float beta1, float beta2,
                 float epsilon, float weight_decay, int64_t step, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq);

// x[i] *= scale.
void Scale(const ExecutionContext& ctx, int64_t n, float scale, float* x);

// x[i] = 0 (asynchronous on CUDA).
void SetZero(const ExecutionContext& ctx, int64_t n, float* x);

// How many of x[0..n) are infinite or NaN (the fp16 overflow check). The result is a host value:
// on CUDA this waits for the context's stream.
int64_t CountNonFinite(const ExecutionContext& ctx, int64_t n, const float* x);

// Bucket packing for compressed all-reduce: out[i] = half(in[i] * scale) (round to nearest even)
// and its inverse out[i] = float(in[i]) * scale. Half values are raw uint16_t bits.
void PackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale, const float* in,
              uint16_t* out);
void UnpackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale,
                const uint16_t* in, float* out);

// out[i] = in[i] rounded to the nearest bf16 (ties to even), kept as a float: the value a bf16
// tensor would hold. `out` may be `in`. The bf16 mixed-precision path (spec.trainer.precision)
// rounds with it wherever autocast would cast to bf16; a GEMM whose inputs are such values and
// whose sums are fp32 computes what a bf16 tensor-core GEMM computes, up to summation order.
void RoundToBf16(const ExecutionContext& ctx, int64_t n, const float* in, float* out);

// Scalar conversions, shared by the CPU kernels and tests.
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToFp16(float value);
float Fp16ToFloat(uint16_t bits);

// Sets the number of threads the CPU BLAS may use (1: one thread per worker process, the right
// choice when several workers share a machine).
void SetCpuBlasThreads(int threads);

// Whether a CUDA device is usable in this process: the CUDA kernels are built in and
// cudaGetDeviceCount() reports at least one device. False (never an abort) when built without
// CUDA or without a driver or device. Cheap after the first call.
bool CudaAvailable();

}  // namespace lockstep::kernels
