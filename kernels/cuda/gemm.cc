// Gemm through cuBLAS. Host code only (no device code of our own), so g++ compiles it.
//
// Row-major through a column-major BLAS: a row-major [r, c] matrix is the column-major [c, r]
// matrix of its transpose, so C = op(A) op(B) (row-major) is computed as the column-major
// C^T = op(B)^T op(A)^T: cuBLAS gets B first, then A, with n and m swapped and the same
// leading dimensions the row-major layout has.
//
// Precision: CUBLAS_COMPUTE_32F, full fp32 products, unless ctx.bf16_operands (operands that are
// bf16 values already: CUBLAS_COMPUTE_32F_FAST_16BF, bf16 tensor cores with fp32 sums, exact
// because converting such a float to bf16 changes nothing) or ctx.allow_tf32 (TF32 tensor cores,
// CUBLAS_COMPUTE_32F_FAST_TF32: ~10-bit mantissa inputs, several times faster on large layers),
// so that by default the GPU path matches the CPU path and PyTorch's default
// (torch.backends.cuda.matmul.allow_tf32 = False) within fp32 rounding. The handle's math mode is
// the caller's: left at CUBLAS_DEFAULT_MATH (as cublasCreate makes it), it cannot turn TF32 on.
#include <cublas_v2.h>

#include <cstdlib>
#include <limits>

#include "common/logging.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace lockstep::kernels::cuda {
namespace {

int CheckedBlasInt(int64_t value, const char* what) {
  if (value > std::numeric_limits<int>::max()) {
    LOCKSTEP_LOG(ERROR) << "kernels::Gemm: " << what << " = " << value
                        << " exceeds the BLAS 32-bit index range";
    std::abort();
  }
  return static_cast<int>(value);
}

cublasHandle_t BlasHandleOf(const ExecutionContext& ctx) {
  if (ctx.blas_handle == nullptr) {
    LOCKSTEP_LOG(ERROR) << "kernels::Gemm: device cuda needs a cuBLAS handle in "
                           "ExecutionContext::blas_handle, which is null";
    std::abort();
  }
  return static_cast<cublasHandle_t>(ctx.blas_handle);
}

}  // namespace

void Gemm(const ExecutionContext& ctx, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // BLAS's contract for an empty product, C = beta * C with C not read when beta == 0.
    if (beta == 0.0f) {
      LOCKSTEP_CUDA_CHECK(
          cudaMemsetAsync(c, 0, static_cast<size_t>(m * n) * sizeof(float), StreamOf(ctx)));
    } else {
      cuda::Scale(ctx, m * n, beta, c);
    }
    return;
  }
  const int blas_m = CheckedBlasInt(m, "m");
  const int blas_n = CheckedBlasInt(n, "n");
  const int blas_k = CheckedBlasInt(k, "k");
  const int lda = transpose_a ? blas_m : blas_k;
  const int ldb = transpose_b ? blas_k : blas_n;
  const cublasHandle_t handle = BlasHandleOf(ctx);
  const CublasLibrary& cublas = Cublas();
  LOCKSTEP_CUBLAS_CHECK(cublas.set_stream(handle, StreamOf(ctx)));
  const cublasComputeType_t compute = ctx.bf16_operands ? CUBLAS_COMPUTE_32F_FAST_16BF
                                      : ctx.allow_tf32  ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                        : CUBLAS_COMPUTE_32F;
  LOCKSTEP_CUBLAS_CHECK(cublas.gemm_ex(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, blas_n, blas_m,
                                       blas_k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                                       &beta, c, CUDA_R_32F, blas_n, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace lockstep::kernels::cuda
