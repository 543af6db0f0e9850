// The public kernel API: each function checks its device and forwards to cpu/ or cuda/.
//
// Asking for DeviceType::kCuda from a library built without the CUDA kernels, or in a process
// that has no usable CUDA device, is a programming error (the trainer must check CudaAvailable()
// when it reads `device: cuda`), and these functions return void, so it is reported loudly: one
// ERROR log line naming the kernel, then abort().
#include <cstdlib>

#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/kernels.h"

#ifdef LOCKSTEP_KERNELS_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace lockstep::kernels {
namespace {

[[noreturn]] void DieUnsupportedDevice(const char* kernel, DeviceType device) {
  if (device == DeviceType::kCuda) {
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
    const char* reason = "no CUDA device is usable in this process (no driver or no device)";
#else
    const char* reason = "this build has no CUDA kernels";
#endif
    LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": device cuda requested, but " << reason
                        << " (check CudaAvailable() before choosing the device)";
  } else {
    LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": unknown device type "
                        << static_cast<int>(device);
  }
  std::abort();
}

}  // namespace

// Each public function: the CPU path, else the CUDA path when it is compiled in and a device is
// usable (a cached flag), else abort.
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
#define LOCKSTEP_KERNELS_DISPATCH(name, cpu_call, cuda_call)                       \
  switch (ctx.device) {                                                            \
    case DeviceType::kCpu:                                                         \
      return cpu_call;                                                             \
    case DeviceType::kCuda:                                                        \
      if (!cuda::DeviceAvailable()) DieUnsupportedDevice(name, DeviceType::kCuda); \
      return cuda_call;                                                            \
  }                                                                                \
  DieUnsupportedDevice(name, ctx.device)
#else
#define LOCKSTEP_KERNELS_DISPATCH(name, cpu_call, cuda_call) \
  if (ctx.device == DeviceType::kCpu) return cpu_call;       \
  DieUnsupportedDevice(name, ctx.device)
#endif

void Gemm(const ExecutionContext& ctx, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  LOCKSTEP_KERNELS_DISPATCH(
      "Gemm", cpu::Gemm(transpose_a, transpose_b, m, n, k, alpha, a, b, beta, c),
      cuda::Gemm(ctx, transpose_a, transpose_b, m, n, k, alpha, a, b, beta, c));
}

void BiasActivationForward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                           int64_t cols, const float* bias, float* x, float* pre_activation) {
  LOCKSTEP_KERNELS_DISPATCH(
      "BiasActivationForward", cpu::BiasActivationForward(act, rows, cols, bias, x, pre_activation),
      cuda::BiasActivationForward(ctx, act, rows, cols, bias, x, pre_activation));
}

void BiasActivationBackward(const ExecutionContext& ctx, ActivationType act, int64_t rows,
                            int64_t cols, const float* y, const float* pre_activation, float* dy,
                            float* dbias, bool accumulate) {
  LOCKSTEP_KERNELS_DISPATCH(
      "BiasActivationBackward",
      cpu::BiasActivationBackward(act, rows, cols, y, pre_activation, dy, dbias, accumulate),
      cuda::BiasActivationBackward(ctx, act, rows, cols, y, pre_activation, dy, dbias, accumulate));
}

void SoftmaxCrossEntropy(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                         const float* logits, const int32_t* labels, float grad_scale,
                         float* dlogits, double* loss_sum, int64_t* correct) {
  LOCKSTEP_KERNELS_DISPATCH("SoftmaxCrossEntropy",
                            cpu::SoftmaxCrossEntropy(rows, classes, logits, labels, grad_scale,
                                                     dlogits, loss_sum, correct),
                            cuda::SoftmaxCrossEntropy(ctx, rows, classes, logits, labels,
                                                      grad_scale, dlogits, loss_sum, correct));
}

void SoftmaxCrossEntropyAccumulate(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                                   const float* logits, const int32_t* labels, float grad_scale,
                                   float* dlogits, double* loss_accumulator) {
  LOCKSTEP_KERNELS_DISPATCH(
      "SoftmaxCrossEntropyAccumulate",
      [&] {
        double loss_sum = 0;
        cpu::SoftmaxCrossEntropy(rows, classes, logits, labels, grad_scale, dlogits, &loss_sum,
                                 nullptr);
        *loss_accumulator += loss_sum;
      }(),
      cuda::SoftmaxCrossEntropyAccumulate(ctx, rows, classes, logits, labels, grad_scale, dlogits,
                                          loss_accumulator));
}

int64_t CountCorrect(const ExecutionContext& ctx, int64_t rows, int64_t classes,
                     const float* logits, const int32_t* labels) {
  LOCKSTEP_KERNELS_DISPATCH("CountCorrect", cpu::CountCorrect(rows, classes, logits, labels),
                            cuda::CountCorrect(ctx, rows, classes, logits, labels));
}

void SgdMomentumUpdate(const ExecutionContext& ctx, int64_t n, float lr, float momentum,
                       float weight_decay, bool first_step, float* param, const float* grad,
                       float* momentum_buffer) {
  LOCKSTEP_KERNELS_DISPATCH("SgdMomentumUpdate",
                            cpu::SgdMomentumUpdate(n, lr, momentum, weight_decay, first_step, param,
                                                   grad, momentum_buffer),
                            cuda::SgdMomentumUpdate(ctx, n, lr, momentum, weight_decay, first_step,
                                                    param, grad, momentum_buffer));
}

void AdamWUpdate(const ExecutionContext& ctx, int64_t n, float lr, float beta1, float beta2,
                 float epsilon, float weight_decay, int64_t step, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq) {
  LOCKSTEP_KERNELS_DISPATCH("AdamWUpdate",
                            cpu::AdamWUpdate(n, lr, beta1, beta2, epsilon, weight_decay, step,
                                             param, grad, exp_avg, exp_avg_sq),
                            cuda::AdamWUpdate(ctx, n, lr, beta1, beta2, epsilon, weight_decay, step,
                                              param, grad, exp_avg, exp_avg_sq));
}

void Scale(const ExecutionContext& ctx, int64_t n, float scale, float* x) {
  LOCKSTEP_KERNELS_DISPATCH("Scale", cpu::Scale(n, scale, x), cuda::Scale(ctx, n, scale, x));
}

void SetZero(const ExecutionContext& ctx, int64_t n, float* x) {
  LOCKSTEP_KERNELS_DISPATCH("SetZero", cpu::SetZero(n, x), cuda::SetZero(ctx, n, x));
}

int64_t CountNonFinite(const ExecutionContext& ctx, int64_t n, const float* x) {
  LOCKSTEP_KERNELS_DISPATCH("CountNonFinite", cpu::CountNonFinite(n, x),
                            cuda::CountNonFinite(ctx, n, x));
}

void PackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale, const float* in,
              uint16_t* out) {
  LOCKSTEP_KERNELS_DISPATCH("PackHalf", cpu::PackHalf(type, n, scale, in, out),
                            cuda::PackHalf(ctx, type, n, scale, in, out));
}

void UnpackHalf(const ExecutionContext& ctx, HalfType type, int64_t n, float scale,
                const uint16_t* in, float* out) {
  LOCKSTEP_KERNELS_DISPATCH("UnpackHalf", cpu::UnpackHalf(type, n, scale, in, out),
                            cuda::UnpackHalf(ctx, type, n, scale, in, out));
}

void RoundToBf16(const ExecutionContext& ctx, int64_t n, const float* in, float* out) {
  LOCKSTEP_KERNELS_DISPATCH("RoundToBf16", cpu::RoundToBf16(n, in, out),
                            cuda::RoundToBf16(ctx, n, in, out));
}

#undef LOCKSTEP_KERNELS_DISPATCH

uint16_t FloatToBf16(float value) { return internal::FloatToBf16Inline(value); }
float Bf16ToFloat(uint16_t bits) { return internal::Bf16ToFloatInline(bits); }
uint16_t FloatToFp16(float value) { return internal::FloatToFp16Inline(value); }
float Fp16ToFloat(uint16_t bits) { return internal::Fp16ToFloatInline(bits); }

void SetCpuBlasThreads(int threads) { cpu::SetBlasThreads(threads); }

bool CudaAvailable() {
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
  return cuda::DeviceAvailable();
#else
  return false;
#endif
}

}  // namespace lockstep::kernels
