// Checks for the two foreign error domains of the CUDA kernels, the CUDA runtime and cuBLAS
// (NCCL's checks.h is the model): a failed call becomes a lockstep Status that names the call,
// the error and where it was made.
//
// The public kernel API returns void, so inside the kernels a failed call is fatal:
// LOCKSTEP_CUDA_CHECK / LOCKSTEP_CUBLAS_CHECK log one ERROR line and abort(). A CUDA error in a
// kernel launch is almost always sticky (an illegal address, a lost device), so the process
// cannot go on using the device anyway; the worker's supervisor restarts it. Code that can
// recover (the communicator, tests, benchmarks) uses CudaStatus / CublasStatus and returns it.
//
//   LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes, stream));
//   Kernel<<<grid, block, 0, stream>>>(...);
//   LOCKSTEP_CUDA_CHECK_LAUNCH();
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/status.h"

namespace lockstep::kernels::cuda {

// OK for cudaSuccess; otherwise "cudaMemcpyAsync(...) at file:line: cudaErrorX: message", with
// kUnavailable for a missing device or driver, kResourceExhausted for out of memory, kInternal
// otherwise.
Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line);
// The same for cuBLAS statuses.
Status CublasStatus(cublasStatus_t status, const char* expression, const char* file, int line);

namespace internal {
// Logs `status` as the failure of a CUDA kernel and aborts.
[[noreturn]] void DieOnDeviceError(const Status& status);
}  // namespace internal

}  // namespace lockstep::kernels::cuda

#define LOCKSTEP_CUDA_CHECK(expression)                                                            \
  do {                                                                                             \
    const cudaError_t lockstep_cuda_error = (expression);                                          \
    if (lockstep_cuda_error != cudaSuccess) {                                                      \
      ::lockstep::kernels::cuda::internal::DieOnDeviceError(::lockstep::kernels::cuda::CudaStatus( \
          lockstep_cuda_error, #expression, __FILE__, __LINE__));                                  \
    }                                                                                              \
  } while (0)

// After a <<<...>>> launch: catches a bad configuration (the launch itself fails) at once;
// faults inside the kernel surface at the next synchronising call.
#define LOCKSTEP_CUDA_CHECK_LAUNCH() LOCKSTEP_CUDA_CHECK(cudaGetLastError())

#define LOCKSTEP_CUBLAS_CHECK(expression)                                                        \
  do {                                                                                           \
    const cublasStatus_t lockstep_cublas_status = (expression);                                  \
    if (lockstep_cublas_status != CUBLAS_STATUS_SUCCESS) {                                       \
      ::lockstep::kernels::cuda::internal::DieOnDeviceError(                                     \
          ::lockstep::kernels::cuda::CublasStatus(lockstep_cublas_status, #expression, __FILE__, \
                                                  __LINE__));                                    \
    }                                                                                            \
  } while (0)

// For code that returns a Status rather than aborting.
#define LOCKSTEP_CUDA_RETURN_IF_ERROR(expression)                                              \
  do {                                                                                         \
    const cudaError_t lockstep_cuda_error = (expression);                                      \
    if (lockstep_cuda_error != cudaSuccess) {                                                  \
      return ::lockstep::kernels::cuda::CudaStatus(lockstep_cuda_error, #expression, __FILE__, \
                                                   __LINE__);                                  \
    }                                                                                          \
  } while (0)
