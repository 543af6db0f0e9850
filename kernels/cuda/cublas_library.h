// cuBLAS, opened with dlopen when the first CUDA device is created rather than linked.
//
// libcublas.so needs libcublasLt.so (540 MB), whose static initializers cost about 0.3 s of CPU
// in every process that links it, GPU or not: every `lockstep` command, every worker and exec
// agent start, every restart. Linked this way, only a process that trains on a GPU pays it.
// The CUDA runtime (libcudart) stays linked: it is small and cheap to start.
#pragma once

#include <cublas_v2.h>

#include "common/status.h"

namespace lockstep::kernels::cuda {

// cublasGemmEx as the library exports it (C++ also sees an inline overload taking a
// cudaDataType compute type).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void*, const void*, cudaDataType, int,
                                        const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

// The cuBLAS functions the kernels call, by their ABI names (cublas_v2.h maps cublasCreate to
// cublasCreate_v2 and so on).
struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  CublasGemmEx gemm_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The file dlopen looks for: libcublas.so.<major> of the cuBLAS the kernels were compiled with,
// found the way the dynamic loader finds a linked library (LD_LIBRARY_PATH, the program's
// RUNPATH, the ld.so cache).
const char* CublasFileName();

// Opens cuBLAS once per process (later calls return the first call's result). UNAVAILABLE,
// naming the file and the loader's reason, when it cannot be opened; FAILED_PRECONDITION, naming
// them, when it lacks one of the functions.
StatusOr<const CublasLibrary*> LoadCublas();

// The library LoadCublas opened. Only for code that runs on a device, which LoadCublas made
// (CreateCudaDevice calls it first); aborts naming the reason otherwise.
const CublasLibrary& Cublas();

}  // namespace lockstep::kernels::cuda
