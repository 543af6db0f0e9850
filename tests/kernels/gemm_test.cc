#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::Poisoned;
using testing::RandomFloats;

// C = alpha * op(A) op(B) + beta * C in double, on the same row-major layouts as Gemm.
std::vector<double> ReferenceGemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                                  int64_t k, double alpha, const std::vector<float>& a,
                                  const std::vector<float>& b, double beta,
                                  const std::vector<float>& c) {
  std::vector<double> result(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double a_ip = transpose_a ? a[p * m + i] : a[i * k + p];
        const double b_pj = transpose_b ? b[j * k + p] : b[p * n + j];
        sum += a_ip * b_pj;
      }
      result[i * n + j] = alpha * sum + (beta == 0.0 ? 0.0 : beta * c[i * n + j]);
    }
  }
  return result;
}

class GemmTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmTest, MatchesDoubleReferenceOnOddSizesWithPoisonedOutput) {
  const auto [transpose_a, transpose_b] = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {64, 10, 784}, {3, 129, 2}};
  uint32_t seed = 100;
  for (const auto& size : sizes) {
    const int64_t m = size[0], n = size[1], k = size[2];
    SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k);
    const std::vector<float> a = RandomFloats(m * k, ++seed);
    const std::vector<float> b = RandomFloats(k * n, ++seed);

    // beta = 0: C must be written without being read, so NaN poison must vanish.
    std::vector<float> c = Poisoned(m * n);
    Gemm(CpuContext(), transpose_a, transpose_b, m, n, k, 1.5f, a.data(), b.data(), 0.0f, c.data());
    std::vector<double> expected =
        ReferenceGemm(transpose_a, transpose_b, m, n, k, 1.5, a, b, 0.0, c);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(c[i], expected[i], 1e-5 * k + 1e-6) << "element " << i;
    }

    // beta != 0 accumulates into the existing C.
    c = RandomFloats(m * n, ++seed);
    expected = ReferenceGemm(transpose_a, transpose_b, m, n, k, -0.5, a, b, 0.25, c);
    Gemm(CpuContext(), transpose_a, transpose_b, m, n, k, -0.5f, a.data(), b.data(), 0.25f,
         c.data());
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(c[i], expected[i], 1e-5 * k + 1e-6) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

TEST(GemmEmptyTest, ZeroInnerDimensionScalesCByBeta) {
  std::vector<float> c = Poisoned(6);
  Gemm(CpuContext(), false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, c.data());
  for (float v : c) EXPECT_EQ(v, 0.0f);
  c.assign(6, 2.0f);
  Gemm(CpuContext(), false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.5f, c.data());
  for (float v : c) EXPECT_EQ(v, 1.0f);
}

TEST(GemmThreadsTest, SingleThreadedBlasGivesSameResult) {
  const int64_t m = 40, n = 30, k = 50;
  const std::vector<float> a = RandomFloats(m * k, 1);
  const std::vector<float> b = RandomFloats(k * n, 2);
  SetCpuBlasThreads(1);
  std::vector<float> c = Poisoned(m * n);
  Gemm(CpuContext(), false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data());
  const std::vector<double> expected = ReferenceGemm(false, false, m, n, k, 1.0, a, b, 0.0, c);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(c[i], expected[i], 1e-4);
}

TEST(DeviceDispatchTest, CudaIsUnavailableWithoutCudaKernels) {
#ifdef LOCKSTEP_KERNELS_TEST_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA kernels (cuda_kernels_test checks CudaAvailable)";
#else
  EXPECT_FALSE(CudaAvailable());
#endif
}

TEST(DeviceDispatchDeathTest, CudaContextAbortsWithMessageWhenUnavailable) {
  if (CudaAvailable()) GTEST_SKIP() << "this build has the CUDA kernels";
  ExecutionContext ctx;
  ctx.device = DeviceType::kCuda;
  float x = 1.0f;
  EXPECT_DEATH(Scale(ctx, 1, 2.0f, &x), "Scale: device cuda requested");
}

}  // namespace
}  // namespace lockstep::kernels
