// The CUDA implementations behind kernels/kernels.h: the slot for the CUDA issue.
//
// Not compiled yet: kernels/CMakeLists.txt builds the .cu files listed in
// LOCKSTEP_KERNELS_CUDA_SOURCES (empty today) and then defines LOCKSTEP_KERNELS_WITH_CUDA, which
// makes kernels/dispatch.cc route DeviceType::kCuda here. Each function queues its work on
// ctx.cuda_stream (Gemm through the cublasHandle_t in ctx.blas_handle) and returns without
// synchronising, except where a host output (loss_sum, correct, CountCorrect's result) forces a
// copy back on that stream. Contracts are those of the public functions of the same name.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace lockstep::kernels::cuda {

bool DeviceAvailable();

void Gemm(const ExecutionContext& ctx, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c);
void BiasActivationForward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                           int64_t cols, const float* bias, float* x, float* pre_activation);
void BiasActivationBackward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                            int64_t cols, const float* y, const float* pre_activation, float* dy,
                            float* dbias);
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
void Scale(const ExecutionContext& ctx, int64_t n, float scale, float* x);
void PackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale, const float* in,
              uint16_t* out);
void UnpackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale,
                const uint16_t* in, float* out);

}  // namespace lockstep::kernels::cuda
