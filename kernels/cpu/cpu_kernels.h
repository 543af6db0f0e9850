// The CPU implementations behind kernels/kernels.h. Internal to the kernels library: callers use
// the public functions, which dispatch on ExecutionContext::device.
//
// Contracts are those of the public functions of the same name; these run synchronously on the
// calling thread (Gemm may use OpenBLAS's own threads, see SetBlasThreads). Sizes <= 0 are no-ops.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/kernels.h"

namespace lockstep::kernels {
class Device;
}  // namespace lockstep::kernels

namespace lockstep::kernels::cpu {

// The CPU implementation of kernels/device.h.
std::unique_ptr<Device> CreateCpuDevice();

void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);
void SetBlasThreads(int threads);

void BiasActivationForward(ActivationType act, int64_t rows, int64_t cols, const float* bias,
                           float* x, float* pre_activation);
void BiasActivationBackward(ActivationType act, int64_t rows, int64_t cols, const float* y,
                            const float* pre_activation, float* dy, float* dbias, bool accumulate);

void SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
                         float grad_scale, float* dlogits, double* loss_sum, int64_t* correct);
int64_t CountCorrect(int64_t rows, int64_t classes, const float* logits, const int32_t* labels);

void SgdMomentumUpdate(int64_t n, float lr, float momentum, float weight_decay, bool first_step,
                       float* param, const float* grad, float* momentum_buffer);
void AdamWUpdate(int64_t n, float lr, float beta1, float beta2, float epsilon, float weight_decay,
                 int64_t step, float* param, const float* grad, float* exp_avg, float* exp_avg_sq);

void Scale(int64_t n, float scale, float* x);
void SetZero(int64_t n, float* x);
int64_t CountNonFinite(int64_t n, const float* x);
void PackHalf(HalfType type, int64_t n, float scale, const float* in, uint16_t* out);
void UnpackHalf(HalfType type, int64_t n, float scale, const uint16_t* in, float* out);
void RoundToBf16(int64_t n, const float* in, float* out);

}  // namespace lockstep::kernels::cpu
