// The CUDA implementations behind kernels/kernels.h, compiled when nvcc is found
// (kernels/CMakeLists.txt lists them in LOCKSTEP_KERNELS_CUDA_SOURCES and defines
// LOCKSTEP_KERNELS_WITH_CUDA, which makes kernels/dispatch.cc route DeviceType::kCuda here).
//
// Each function queues its work on ctx.cuda_stream (Gemm through the cublasHandle_t in
// ctx.blas_handle, whose pointer mode must be the default CUBLAS_POINTER_MODE_HOST) and returns
// without synchronising, except where a host output (loss_sum, correct, CountCorrect's result)
// forces a copy back on that stream. Contracts are those of the public functions of the same
// name; precision and reproducibility notes are in each .cu file.
//
// Errors: a failed CUDA or cuBLAS call (a fault in an earlier kernel included, which CUDA reports
// at the next call) is logged as one ERROR line naming the call and the error, then abort()
// (kernels/cuda/cuda_check.h): the API returns void, and such errors leave the device unusable.
//
// Scratch memory: BiasActivationBackward and SoftmaxCrossEntropy/CountCorrect take small
// temporary buffers (a few MiB at most) from a lockstep-owned stream-ordered memory pool per
// device, which keeps them between calls (kernels/cuda/launch.h).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/device.h"
#include "kernels/kernels.h"

namespace lockstep::kernels::cuda {

// cudaGetDeviceCount() > 0, read once; false (never an abort) without a driver or device.
bool DeviceAvailable();
// OK, or why no device can be used (the driver's error, or no device visible).
Status Usable();
// cudaGetDeviceCount(), 0 on any error.
int DeviceCount();
// The CUDA implementation of kernels/device.h (kernels/cuda/cuda_device.cc).
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, bool allow_tf32);

void Gemm(const ExecutionContext& ctx, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c);
void BiasActivationForward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                           int64_t cols, const float* bias, float* x, float* pre_activation);
void BiasActivationBackward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                            int64_t cols, const float* y, const float* pre_activation, float* dy,
                            float* dbias, bool accumulate);
void SoftmaxCrossEntropy(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                         const float* logits, const int32_t* labels, float grad_scale,
                         float* dlogits, double* loss_sum, int64_t* correct);
int64_t CountCorrect(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                     const float* logits, const int32_t* labels);
void SgdMomentumUpdate(const ExecutionContext& ctx, int64_t n, float lr, float momentum,
                       float weight_decay, bool first_step, float* param, const float* grad,
                       float* momentum_buffer);
void AdamWUpdate(const ExecutionContext& ctx, int64_t n, float lr, float beta1, float beta2,
                 float epsilon, float weight_decay, int64_t step, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq);
void SoftmaxCrossEntropyAccumulate(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                                   const float* logits, const int32_t* labels, float grad_scale,
                                   float* dlogits, double* loss_accumulator);
void Scale(const ExecutionContext& ctx, int64_t n, float scale, float* x);
void SetZero(const ExecutionContext& ctx, int64_t n, float* x);
int64_t CountNonFinite(const ExecutionContext& ctx, int64_t n, const float* x);
void PackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale, const float* in,
              uint16_t* out);
void UnpackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale,
                const uint16_t* in, float* out);
void RoundToBf16(const ExecutionContext& ctx, int64_t n, const float* in, float* out);

}  // namespace lockstep::kernels::cuda
