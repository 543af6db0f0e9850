// Gemm through OpenBLAS's row-major cblas_sgemm.
#include <cblas.h>

#include <cstdlib>
#include <limits>

#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"

// Declared here as well because /usr/include/.../cblas.h is a Debian alternative that may point
// at the reference (netlib) header, which lacks it; we always link OpenBLAS itself.
extern "C" void openblas_set_num_threads(int num_threads);

namespace lockstep::kernels::cpu {
namespace {

// OpenBLAS's default interface takes 32-bit ints; larger sizes are a caller bug, not a case to
// handle (a single layer of that size would not fit the trainer anyway).
int CheckedBlasInt(int64_t value, const char* what) {
  if (value > std::numeric_limits<int>::max()) {
    LOCKSTEP_LOG(ERROR) << "kernels::Gemm: " << what << " = " << value
                        << " exceeds the BLAS 32-bit index range";
    std::abort();
  }
  return static_cast<int>(value);
}

}  // namespace

void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // BLAS's contract for an empty product (C = beta * C, C not read when beta == 0), done here
    // because some BLAS builds reject lda = 0.
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  const int blas_m = CheckedBlasInt(m, "m");
  const int blas_n = CheckedBlasInt(n, "n");
  const int blas_k = CheckedBlasInt(k, "k");
  const int lda = transpose_a ? blas_m : blas_k;
  const int ldb = transpose_b ? blas_k : blas_n;
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, blas_m, blas_n, blas_k, alpha, a, lda, b,
              ldb, beta, c, blas_n);
}

void SetBlasThreads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace lockstep::kernels::cpu
