#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/logging.h"

namespace lockstep::kernels::cuda {
namespace {

#define LOCKSTEP_STRINGIFY_VALUE(x) #x
#define LOCKSTEP_STRINGIFY(x) LOCKSTEP_STRINGIFY_VALUE(x)
constexpr char kCublasFile[] = "libcublas.so." LOCKSTEP_STRINGIFY(CUBLAS_VER_MAJOR);

// The exported cublasGemmEx, not the inline overload: a header that changes it fails here.
static_assert(std::is_same_v<decltype(static_cast<CublasGemmEx>(&::cublasGemmEx)), CublasGemmEx>);

template <typename Function>
bool Resolve(void* handle, const char* symbol, Function* function, std::string* missing) {
  *function = reinterpret_cast<Function>(dlsym(handle, symbol));
  if (*function == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + symbol;
  return *function != nullptr;
}

StatusOr<const CublasLibrary*> Open() {
  // RTLD_LOCAL: cuBLAS's symbols stay out of the global scope (nothing else looks them up).
  // Never closed: its handles live as long as the process's devices.
  void* handle = dlopen(kCublasFile, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    return UnavailableError(std::string("cannot load cuBLAS (") + kCublasFile +
                            "): " + (reason != nullptr ? reason : "unknown reason") +
                            "; the CUDA device needs it (docs/gpu.md)");
  }
  auto* library = new CublasLibrary;
  std::string missing;
  Resolve(handle, "cublasCreate_v2", &library->create, &missing);
  Resolve(handle, "cublasDestroy_v2", &library->destroy, &missing);
  Resolve(handle, "cublasSetStream_v2", &library->set_stream, &missing);
  Resolve(handle, "cublasGemmEx", &library->gemm_ex, &missing);
  Resolve(handle, "cublasGetStatusName", &library->status_name, &missing);
  Resolve(handle, "cublasGetStatusString", &library->status_string, &missing);
  if (!missing.empty()) {
    delete library;
    return FailedPreconditionError(std::string(kCublasFile) + " has no " + missing +
                                   ": not the cuBLAS the kernels were built with");
  }
  return static_cast<const CublasLibrary*>(library);
}

}  // namespace

const char* CublasFileName() { return kCublasFile; }

StatusOr<const CublasLibrary*> LoadCublas() {
  // Never destroyed: a device freed during static destruction may still ask for it.
  static const auto* loaded = new StatusOr<const CublasLibrary*>(Open());
  return *loaded;
}

const CublasLibrary& Cublas() {
  StatusOr<const CublasLibrary*> loaded = LoadCublas();
  if (!loaded.ok()) {
    LOCKSTEP_LOG(ERROR) << "kernels (cuda): " << loaded.status().ToString() << "; aborting";
    std::abort();
  }
  return **loaded;
}

}  // namespace lockstep::kernels::cuda
