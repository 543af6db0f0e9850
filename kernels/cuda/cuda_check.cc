#include "kernels/cuda/cuda_check.h"

#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "kernels/cuda/cublas_library.h"

namespace lockstep::kernels::cuda {
namespace {

std::string Where(const char* expression, const char* file, int line) {
  return std::string(expression) + " at " + file + ":" + std::to_string(line);
}

}  // namespace

Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line) {
  if (error == cudaSuccess) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      code = StatusCode::kUnavailable;
      break;
    case cudaErrorMemoryAllocation:
      code = StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return Status(code, Where(expression, file, line) + ": " + cudaGetErrorName(error) + ": " +
                          cudaGetErrorString(error));
}

Status CublasStatus(cublasStatus_t status, const char* expression, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      code = StatusCode::kFailedPrecondition;
      break;
    case CUBLAS_STATUS_ALLOC_FAILED:
      code = StatusCode::kResourceExhausted;
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      code = StatusCode::kInvalidArgument;
      break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      code = StatusCode::kUnimplemented;
      break;
    default:
      break;
  }
  return Status(code, Where(expression, file, line) + ": " + Cublas().status_name(status) + ": " +
                          Cublas().status_string(status));
}

namespace internal {

void DieOnDeviceError(const Status& status) {
  LOCKSTEP_LOG(ERROR) << "kernels (cuda): " << status.ToString()
                      << "; the CUDA kernels cannot continue, aborting";
  std::abort();
}

}  // namespace internal
}  // namespace lockstep::kernels::cuda
