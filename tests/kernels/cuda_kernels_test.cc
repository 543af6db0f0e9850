// The CUDA kernels against the CPU path and float64 references (label "gpu").
//
// Every test that needs a device skips when CudaAvailable() is false. Inputs are fresh random
// values each run (seed from std::random_device, printed on failure; set LOCKSTEP_TEST_SEED to
// replay one), outputs are poisoned with NaN bytes before each run so an element a kernel skips
// fails, and each comparison uses the precision's tolerance: bit-exact where the CUDA kernel
// performs the CPU path's IEEE operations in the same order (Scale, pack/unpack, the optimizers,
// identity/relu/tanh backward), a few ulp where CUDA's erff/expf/tanhf stand in for glibc's, and
// fp32-GEMM rounding for cuBLAS.
//
// The tests at the end run without a device too: CudaAvailable() agrees with the runtime, a
// kernel without a device aborts with a message naming the CUDA error, and the CUDA conversion
// intrinsics (their host emulation) round exactly as the CPU path does.
#include "kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::ReferenceActivation;
using testing::ReferenceDerivative;
using testing::RandomFloats;
using testing::RandomLabels;

// Test infrastructure failures (allocation, copies) are not what is tested: fatal, with the call.
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::cerr << what << ": " << cudaGetErrorName(error) << ": " << cudaGetErrorString(error)
              << std::endl;
    std::abort();
  }
}
#define TEST_CUDA(call) CheckCuda((call), #call)

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Device memory for `size` elements of T starting `offset` elements into the allocation, so a
// test can hand a kernel a pointer that is not 16-byte aligned (a bucket slice).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t size, size_t offset = 0) : size_(size), offset_(offset) {
    TEST_CUDA(cudaMalloc(&base_, (size + offset + 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(base_) + offset_; }
  size_t size() const { return size_; }

  // Both wait for the device before returning: the kernels under test run on a non-blocking
  // stream, which does not wait for the legacy default stream these calls use, and a pageable
  // cudaMemcpy (or any cudaMemset) may return before the device has written the memory. (Without
  // the waits, an H100 run saw a poisoned element survive a kernel's write and a kernel read an
  // input before its upload landed.)
  void Upload(const std::vector<T>& values) {
    TEST_CUDA(cudaMemcpy(get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
    TEST_CUDA(cudaDeviceSynchronize());
  }
  // All bytes 0xff: a NaN for float and for both half formats.
  void Poison() {
    TEST_CUDA(cudaMemset(get(), 0xff, size_ * sizeof(T)));
    TEST_CUDA(cudaDeviceSynchronize());
  }
  // Waits for all device work, then copies back.
  std::vector<T> Download() const {
    TEST_CUDA(cudaDeviceSynchronize());
    std::vector<T> values(size_);
    TEST_CUDA(cudaMemcpy(values.data(), get(), size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return values;
  }

 private:
  void* base_ = nullptr;
  size_t size_;
  size_t offset_;
};

template <typename T>
std::unique_ptr<DeviceArray<T>> OnDevice(const std::vector<T>& values, size_t offset = 0) {
  auto array = std::make_unique<DeviceArray<T>>(values.size(), offset);
  array->Upload(values);
  return array;
}

// |a - b| in units of float's relative precision at max(|a|, |b|), plus an absolute floor.
::testing::AssertionResult Near(double actual, double expected, double relative, double absolute) {
  const double error = std::fabs(actual - expected);
  const double bound = relative * std::max(std::fabs(actual), std::fabs(expected)) + absolute;
  if (std::isfinite(actual) && error <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "actual " << actual << " expected " << expected
                                       << " error " << error << " > bound " << bound;
}

// ||actual - reference|| / ||reference||.
double RelativeNormError(const std::vector<float>& actual, const std::vector<double>& reference) {
  double error = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    error += (actual[i] - reference[i]) * (actual[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  return std::sqrt(error / norm);
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
    const char* fixed = std::getenv("LOCKSTEP_TEST_SEED");
    seed_ = fixed != nullptr ? static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10))
                             : std::random_device{}();
    TEST_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
    ctx_.device = DeviceType::kCuda;
    ctx_.cuda_stream = stream_;
    ctx_.blas_handle = blas_;
  }

  void TearDown() override {
    if (HasFailure()) std::cerr << "replay with LOCKSTEP_TEST_SEED=" << seed_ << std::endl;
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A new seed for each input of a test, derived from the test's seed.
  uint32_t NextSeed() { return seed_ + 7919 * ++draws_; }

  ExecutionContext ctx_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  uint32_t seed_ = 0;
  uint32_t draws_ = 0;
};

// ---- Gemm ----

std::vector<double> ReferenceGemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                                  int64_t k, double alpha, const std::vector<float>& a,
                                  const std::vector<float>& b, double beta,
                                  const std::vector<float>& c) {
  std::vector<double> result(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        sum += static_cast<double>(transpose_a ? a[p * m + i] : a[i * k + p]) *
               (transpose_b ? b[j * k + p] : b[p * n + j]);
      }
      result[i * n + j] = alpha * sum + (beta == 0.0 ? 0.0 : beta * c[i * n + j]);
    }
  }
  return result;
}

TEST_F(CudaKernelsTest, GemmMatchesCpuAndDoubleReferenceForAllTransposes) {
  const int64_t sizes[][3] = {{1, 1, 1},     {7, 13, 5},  {33, 17, 65},
                              {64, 10, 784}, {3, 129, 2}, {256, 384, 512}};
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      for (const auto& size : sizes) {
        const int64_t m = size[0], n = size[1], k = size[2];
        SCOPED_TRACE(::testing::Message() << "ta=" << transpose_a << " tb=" << transpose_b
                                          << " m=" << m << " n=" << n << " k=" << k);
        const std::vector<float> a = RandomFloats(m * k, NextSeed());
        const std::vector<float> b = RandomFloats(k * n, NextSeed());
        const std::vector<float> c0 = RandomFloats(m * n, NextSeed());
        auto da = OnDevice(a), db = OnDevice(b);
        for (float beta : {0.0f, 0.25f}) {
          DeviceArray<float> dc(m * n);
          if (beta == 0.0f) {
            dc.Poison();  // C must not be read when beta == 0
          } else {
            dc.Upload(c0);
          }
          Gemm(ctx_, transpose_a, transpose_b, m, n, k, -1.5f, da->get(), db->get(), beta,
               dc.get());
          const std::vector<float> gpu = dc.Download();
          std::vector<float> cpu = c0;
          Gemm(CpuContext(), transpose_a, transpose_b, m, n, k, -1.5f, a.data(), b.data(), beta,
               cpu.data());
          const std::vector<double> reference =
              ReferenceGemm(transpose_a, transpose_b, m, n, k, -1.5, a, b, beta, c0);
          // fp32 products of k terms in [-1, 1]: rounding grows at most like k * eps.
          const double tolerance = 1e-6 * k + 1e-6;
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_TRUE(Near(gpu[i], reference[i], 0, tolerance)) << "element " << i;
            ASSERT_TRUE(Near(gpu[i], cpu[i], 0, 2 * tolerance)) << "element " << i;
          }
          EXPECT_LT(RelativeNormError(gpu, reference), 1e-5);
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmWithTf32AllowedStaysWithinTf32Precision) {
  const int64_t m = 192, n = 160, k = 1024;
  const std::vector<float> a = RandomFloats(m * k, NextSeed());
  const std::vector<float> b = RandomFloats(k * n, NextSeed());
  auto da = OnDevice(a), db = OnDevice(b);
  DeviceArray<float> dc(m * n);
  dc.Poison();
  ctx_.allow_tf32 = true;
  Gemm(ctx_, false, true, m, n, k, 1.0f, da->get(), db->get(), 0.0f, dc.get());
  const std::vector<double> reference =
      ReferenceGemm(false, true, m, n, k, 1.0, a, b, 0.0, std::vector<float>());
  EXPECT_LT(RelativeNormError(dc.Download(), reference), 5e-3);
}

// precision bf16's GEMMs: operands that are bf16 values held in floats (RoundToBf16) run on
// bf16 tensor cores and give the fp32 GEMM of those values up to summation order; operands that
// are not bf16 values are rounded by the tensor cores, which shows the path is taken.
TEST_F(CudaKernelsTest, GemmOfBf16OperandsIsTheFp32GemmOfThoseValues) {
  const int64_t m = 96, n = 80, k = 512;
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << transpose_a << " tb=" << transpose_b);
      std::vector<float> a = RandomFloats(m * k, NextSeed());
      std::vector<float> b = RandomFloats(k * n, NextSeed());
      const std::vector<float> unrounded_a = a;
      RoundToBf16(CpuContext(), m * k, a.data(), a.data());
      RoundToBf16(CpuContext(), k * n, b.data(), b.data());
      ExecutionContext bf16 = ctx_;
      bf16.bf16_operands = true;
      auto da = OnDevice(a), db = OnDevice(b);
      DeviceArray<float> dc(m * n);
      dc.Poison();
      Gemm(bf16, transpose_a, transpose_b, m, n, k, 1.0f, da->get(), db->get(), 0.0f, dc.get());
      const std::vector<double> reference =
          ReferenceGemm(transpose_a, transpose_b, m, n, k, 1.0, a, b, 0.0, std::vector<float>());
      // Exact products, fp32 sums: fp32 rounding only.
      EXPECT_LT(RelativeNormError(dc.Download(), reference), 1e-5);

      // The same call on operands that are not bf16 values: they are rounded on the way in.
      auto dunrounded = OnDevice(unrounded_a);
      Gemm(bf16, transpose_a, transpose_b, m, n, k, 1.0f, dunrounded->get(), db->get(), 0.0f,
           dc.get());
      const std::vector<double> exact = ReferenceGemm(transpose_a, transpose_b, m, n, k, 1.0,
                                                      unrounded_a, b, 0.0, std::vector<float>());
      EXPECT_GT(RelativeNormError(dc.Download(), exact), 1e-4);
    }
  }
}

TEST_F(CudaKernelsTest, GemmWithEmptyInnerDimensionScalesC) {
  DeviceArray<float> c(6);
  c.Poison();
  Gemm(ctx_, false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, c.get());
  for (float v : c.Download()) EXPECT_EQ(v, 0.0f);
  c.Upload(std::vector<float>(6, 2.0f));
  Gemm(ctx_, false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.5f, c.get());
  for (float v : c.Download()) EXPECT_EQ(v, 1.0f);
}

// ---- Bias + activation ----

// Shapes: cols % 4 == 0 (vector path), odd cols (scalar path), many rows (several row chunks in
// the bias-gradient reduction), and a misaligned slice (scalar path despite cols % 4 == 0).
struct ActivationShape {
  int64_t rows;
  int64_t cols;
  size_t offset;  // elements into the allocations
};
constexpr ActivationShape kActivationShapes[] = {{37, 24, 0},    {37, 23, 0}, {4099, 67, 0},
                                                 {1000, 256, 0}, {65, 12, 1}, {1, 1, 0}};

class CudaActivationTest : public CudaKernelsTest,
                           public ::testing::WithParamInterface<ActivationType> {};

TEST_P(CudaActivationTest, ForwardMatchesCpuAndDoubleReference) {
  const ActivationType act = GetParam();
  // identity and relu add and select only: bit-exact. gelu and tanh: CUDA's erff/tanhf.
  const bool exact = act == ActivationType::kIdentity || act == ActivationType::kRelu;
  for (const ActivationShape& shape : kActivationShapes) {
    SCOPED_TRACE(::testing::Message()
                 << "rows=" << shape.rows << " cols=" << shape.cols << " offset=" << shape.offset);
    const int64_t n = shape.rows * shape.cols;
    const std::vector<float> input = RandomFloats(n, NextSeed(), -4.0f, 4.0f);
    const std::vector<float> bias = RandomFloats(shape.cols, NextSeed(), -0.5f, 0.5f);
    std::vector<float> cpu_y = input, cpu_pre(n);
    BiasActivationForward(CpuContext(), act, shape.rows, shape.cols, bias.data(), cpu_y.data(),
                          cpu_pre.data());

    auto x = OnDevice(input, shape.offset);
    auto dbias = OnDevice(bias, shape.offset);
    DeviceArray<float> pre(n, shape.offset);
    pre.Poison();
    BiasActivationForward(ctx_, act, shape.rows, shape.cols, dbias->get(), x->get(), pre.get());
    const std::vector<float> y = x->Download();
    const std::vector<float> pre_values = pre.Download();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(pre_values[i]), Bits(cpu_pre[i])) << i;
      const double v = static_cast<double>(input[i]) + bias[i % shape.cols];
      // gelu's 1 + erf(v / sqrt 2) cancels for negative v: a few ulp of erf become ~1e-7
      // absolute in the output, as in the CPU path.
      ASSERT_TRUE(Near(y[i], ReferenceActivation(act, v), 1e-6, 1e-6)) << i;
      if (exact) {
        ASSERT_EQ(Bits(y[i]), Bits(cpu_y[i])) << i;
      } else {
        ASSERT_TRUE(Near(y[i], cpu_y[i], 5e-7, 1e-6)) << i;
      }
    }
    // Without a pre-activation buffer: the same output.
    x->Upload(input);
    BiasActivationForward(ctx_, act, shape.rows, shape.cols, dbias->get(), x->get(), nullptr);
    EXPECT_EQ(x->Download(), y);
  }
}

TEST_P(CudaActivationTest, BackwardMatchesCpuAndDoubleReferenceWithDeterministicBiasGradient) {
  const ActivationType act = GetParam();
  const bool exact = act != ActivationType::kGelu;
  for (const ActivationShape& shape : kActivationShapes) {
    SCOPED_TRACE(::testing::Message()
                 << "rows=" << shape.rows << " cols=" << shape.cols << " offset=" << shape.offset);
    const int64_t n = shape.rows * shape.cols;
    const std::vector<float> input = RandomFloats(n, NextSeed(), -4.0f, 4.0f);
    const std::vector<float> bias = RandomFloats(shape.cols, NextSeed(), -0.5f, 0.5f);
    const std::vector<float> upstream = RandomFloats(n, NextSeed());
    // The saved tensors come from the CPU forward pass, so both backward passes see the same.
    std::vector<float> y = input, pre(n);
    BiasActivationForward(CpuContext(), act, shape.rows, shape.cols, bias.data(), y.data(),
                          pre.data());
    std::vector<float> cpu_dx = upstream, cpu_dbias(shape.cols);
    BiasActivationBackward(CpuContext(), act, shape.rows, shape.cols, y.data(), pre.data(),
                           cpu_dx.data(), cpu_dbias.data());

    auto dy = OnDevice(y, shape.offset), dpre = OnDevice(pre, shape.offset);
    auto dx = OnDevice(upstream, shape.offset);
    DeviceArray<float> dbias(shape.cols);
    dbias.Poison();  // overwritten, never accumulated into
    BiasActivationBackward(ctx_, act, shape.rows, shape.cols, dy->get(), dpre->get(), dx->get(),
                           dbias.get());
    const std::vector<float> gpu_dx = dx->Download();
    const std::vector<float> gpu_dbias = dbias.Download();

    std::vector<double> reference_dbias(shape.cols, 0.0), magnitude(shape.cols, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(input[i]) + bias[i % shape.cols];
      const double reference = upstream[i] * ReferenceDerivative(act, v);
      reference_dbias[i % shape.cols] += reference;
      magnitude[i % shape.cols] += std::fabs(reference);
      ASSERT_TRUE(Near(gpu_dx[i], reference, 1e-6, 2e-6)) << i;
      if (exact) {
        ASSERT_EQ(Bits(gpu_dx[i]), Bits(cpu_dx[i])) << i;
      } else {
        ASSERT_TRUE(Near(gpu_dx[i], cpu_dx[i], 1e-6, 1e-6)) << i;
      }
    }
    // dbias sums a column's dx, so it may be off by the sum of what each dx may be off by
    // (the bounds above, once per row), plus its own rounding to float (within the relative
    // term). A bound without the per-row absolute part fails where a column's dx nearly cancel
    // or, with one row, where that one dx is small (seed 16114015, rows = 1, cols = 1).
    const double rows = static_cast<double>(shape.rows);
    for (int64_t c = 0; c < shape.cols; ++c) {
      // Against the CPU: the same float dx summed in double in another order, then rounded to
      // float: one float ulp, plus far less than a float-accumulated sum would be off by.
      if (exact) {
        ASSERT_TRUE(Near(gpu_dbias[c], cpu_dbias[c], 0x1p-23, 1e-10 * magnitude[c])) << c;
      } else {
        ASSERT_TRUE(Near(gpu_dbias[c], cpu_dbias[c], 0, 2e-6 * magnitude[c] + 1e-6 * rows)) << c;
      }
      ASSERT_TRUE(Near(gpu_dbias[c], reference_dbias[c], 0, 2e-6 * magnitude[c] + 2e-6 * rows))
          << "dbias " << c;
    }
    // Deterministic: a second run gives the same bits.
    dx->Upload(upstream);
    dbias.Poison();
    BiasActivationBackward(ctx_, act, shape.rows, shape.cols, dy->get(), dpre->get(), dx->get(),
                           dbias.get());
    const std::vector<float> again = dbias.Download();
    EXPECT_EQ(std::memcmp(again.data(), gpu_dbias.data(), again.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllActivations, CudaActivationTest,
                         ::testing::Values(ActivationType::kIdentity, ActivationType::kRelu,
                                           ActivationType::kGelu, ActivationType::kTanh),
                         [](const auto& info) { return testing::ActivationName(info.param); });

TEST_F(CudaKernelsTest, BiasGradientOfZeroRowsIsZero) {
  DeviceArray<float> dbias(5);
  dbias.Poison();
  BiasActivationBackward(ctx_, ActivationType::kRelu, 0, 5, nullptr, nullptr, nullptr, dbias.get());
  for (float v : dbias.Download()) EXPECT_EQ(v, 0.0f);
}

TEST_F(CudaKernelsTest, AccumulatingBiasGradientAddsToWhatIsThere) {
  DeviceArray<float> dy(4), dbias(2);
  dy.Upload({1.0f, 2.0f, 3.0f, 4.0f});
  dbias.Upload({10.0f, 20.0f});
  BiasActivationBackward(ctx_, ActivationType::kIdentity, 2, 2, nullptr, nullptr, dy.get(),
                         dbias.get(), /*accumulate=*/true);
  EXPECT_EQ(dbias.Download(), (std::vector<float>{14.0f, 26.0f}));
  BiasActivationBackward(ctx_, ActivationType::kIdentity, 0, 2, nullptr, nullptr, nullptr,
                         dbias.get(), /*accumulate=*/true);
  EXPECT_EQ(dbias.Download(), (std::vector<float>{14.0f, 26.0f}));
}

// ---- Softmax cross-entropy ----

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyMatchesCpuAndIsReproducible) {
  const int64_t shapes[][2] = {{1000, 10}, {333, 37}, {64, 1000}, {5, 3}, {1, 1}, {2048, 65}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], classes = shape[1];
    SCOPED_TRACE(::testing::Message() << "rows=" << rows << " classes=" << classes);
    const std::vector<float> logits = RandomFloats(rows * classes, NextSeed(), -6.0f, 6.0f);
    const std::vector<int32_t> labels =
        RandomLabels(rows, static_cast<int32_t>(classes), NextSeed());
    const float grad_scale = 1.0f / 256;
    std::vector<float> cpu_dlogits(rows * classes);
    double cpu_loss = 0.0;
    int64_t cpu_correct = 0;
    SoftmaxCrossEntropy(CpuContext(), rows, classes, logits.data(), labels.data(), grad_scale,
                        cpu_dlogits.data(), &cpu_loss, &cpu_correct);

    auto dlogits_in = OnDevice(logits);
    auto dlabels = OnDevice(labels);
    DeviceArray<float> dlogits(rows * classes);
    dlogits.Poison();
    double loss = NAN;
    int64_t correct = -1;
    SoftmaxCrossEntropy(ctx_, rows, classes, dlogits_in->get(), dlabels->get(), grad_scale,
                        dlogits.get(), &loss, &correct);
    const std::vector<float> gpu_dlogits = dlogits.Download();

    double reference_loss = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = &logits[r * classes];
      double max_logit = row[0];
      for (int64_t c = 1; c < classes; ++c) max_logit = std::max<double>(max_logit, row[c]);
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(row[c] - max_logit);
      reference_loss += std::log(sum) + max_logit - row[labels[r]];
      for (int64_t c = 0; c < classes; ++c) {
        const double expected =
            (std::exp(row[c] - max_logit) / sum - (c == labels[r])) * grad_scale;
        const int64_t i = r * classes + c;
        ASSERT_TRUE(Near(gpu_dlogits[i], expected, 0, 1e-6 * grad_scale)) << r << "," << c;
        ASSERT_TRUE(Near(gpu_dlogits[i], cpu_dlogits[i], 0, 1e-6 * grad_scale)) << r << "," << c;
      }
    }
    EXPECT_TRUE(Near(loss, reference_loss, 1e-6, 1e-9));
    EXPECT_TRUE(Near(loss, cpu_loss, 1e-6, 1e-9));
    EXPECT_EQ(correct, cpu_correct);
    EXPECT_EQ(CountCorrect(ctx_, rows, classes, dlogits_in->get(), dlabels->get()), cpu_correct);

    // Same inputs, same bits: no atomics in the loss.
    double loss_again = NAN;
    SoftmaxCrossEntropy(ctx_, rows, classes, dlogits_in->get(), dlabels->get(), grad_scale,
                        dlogits.get(), &loss_again, nullptr);
    EXPECT_EQ(std::memcmp(&loss, &loss_again, sizeof(loss)), 0);

    // Without host outputs the call is asynchronous and the gradient is the same.
    dlogits.Poison();
    SoftmaxCrossEntropy(ctx_, rows, classes, dlogits_in->get(), dlabels->get(), grad_scale,
                        dlogits.get(), nullptr, nullptr);
    EXPECT_EQ(std::memcmp(dlogits.Download().data(), gpu_dlogits.data(),
                          gpu_dlogits.size() * sizeof(float)),
              0);
  }
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyLargeLogitsStayFiniteAndArgmaxTakesFirstMaximum) {
  const std::vector<float> logits = {1e4f,  -1e4f,    0.0f,    // confident and right
                                     1e4f,  1e4f - 5, -1e4f,   // label 1: loss 5 + log(1 + e^-5)
                                     -1e4f, -1e4f,    -1e4f};  // tie: argmax 0, label 2
  auto dlogits_in = OnDevice(logits);
  auto dlabels = OnDevice(std::vector<int32_t>{0, 1, 2});
  DeviceArray<float> dlogits(9);
  dlogits.Poison();
  double loss = NAN;
  int64_t correct = -1;
  SoftmaxCrossEntropy(ctx_, 3, 3, dlogits_in->get(), dlabels->get(), 1.0f, dlogits.get(), &loss,
                      &correct);
  for (float d : dlogits.Download()) ASSERT_TRUE(std::isfinite(d));
  EXPECT_NEAR(loss, 0.0 + (5.0 + std::log1p(std::exp(-5.0))) + std::log(3.0), 1e-4);
  EXPECT_EQ(correct, 1);

  const std::vector<float> ties = {1, 3, 3, 0,  //
                                   5, 1, 2, 5,  //
                                   0, 0, 0, 9};
  auto dties = OnDevice(ties);
  EXPECT_EQ(CountCorrect(ctx_, 3, 4, dties->get(), OnDevice(std::vector<int32_t>{1, 0, 3})->get()),
            3);
  EXPECT_EQ(CountCorrect(ctx_, 3, 4, dties->get(), OnDevice(std::vector<int32_t>{2, 3, 0})->get()),
            0);
}

TEST_F(CudaKernelsTest, CountCorrectMatchesCpuOnWideRowsWithNaNs) {
  const int64_t rows = 300, classes = 777;
  std::vector<float> logits = RandomFloats(rows * classes, NextSeed());
  std::vector<int32_t> labels = RandomLabels(rows, classes, NextSeed());
  // Put each row's maximum on its label for half the rows, and sprinkle NaNs (never chosen,
  // except at index 0, where the CPU scan keeps it).
  std::mt19937 engine(NextSeed());
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 2 == 0) logits[r * classes + labels[r]] = 2.0f;
    logits[r * classes + engine() % classes] = NAN;
    if (r % 17 == 0) logits[r * classes] = NAN;
  }
  auto dlogits = OnDevice(logits);
  auto dlabels = OnDevice(labels);
  const int64_t expected = CountCorrect(CpuContext(), rows, classes, logits.data(), labels.data());
  EXPECT_GT(expected, 0);
  EXPECT_EQ(CountCorrect(ctx_, rows, classes, dlogits->get(), dlabels->get()), expected);
}

TEST_F(CudaKernelsTest, OutOfRangeLabelAbortsNamingRowAndLabel) {
  // A re-executed child, not a fork: the parent already holds a CUDA context.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto logits = OnDevice(RandomFloats(4 * 3, NextSeed()));
  auto labels = OnDevice(std::vector<int32_t>{0, 1, 3, 2});
  DeviceArray<float> dlogits(12);
  double loss = 0.0;
  EXPECT_DEATH(SoftmaxCrossEntropy(ctx_, 4, 3, logits->get(), labels->get(), 1.0f, dlogits.get(),
                                   &loss, nullptr),
               "SoftmaxCrossEntropy: label 3 of row 2 is outside \\[0, 3\\)");
}

// ---- Optimizers, Scale, half packing: bit-exact against the CPU path ----

// Element counts and offsets: aligned with a remainder, a common misalignment (vector path after
// a scalar head), relative misalignment (all scalar), and more elements than one wave of threads.
struct FlatShape {
  int64_t n;
  size_t offset_a;
  size_t offset_b;
};
constexpr FlatShape kFlatShapes[] = {
    {1001, 0, 0}, {1001, 1, 1}, {1001, 1, 2}, {3, 0, 0}, {(3 << 20) + 5, 0, 0}};

void ExpectBitEqual(const std::vector<float>& actual, const std::vector<float>& expected,
                    const char* what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(Bits(actual[i]), Bits(expected[i]))
        << what << " " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

TEST_F(CudaKernelsTest, SgdMomentumIsBitIdenticalToCpuOverSeveralSteps) {
  for (const FlatShape& shape : kFlatShapes) {
    for (float weight_decay : {0.0f, 1e-2f}) {
      SCOPED_TRACE(::testing::Message() << "n=" << shape.n << " offsets=" << shape.offset_a << ","
                                        << shape.offset_b << " wd=" << weight_decay);
      std::vector<float> cpu_param = RandomFloats(shape.n, NextSeed());
      std::vector<float> cpu_buffer(shape.n);
      auto param = OnDevice(cpu_param, shape.offset_a);
      DeviceArray<float> buffer(shape.n, shape.offset_a);
      buffer.Poison();  // the first step must not read it
      std::vector<double> ref_param(cpu_param.begin(), cpu_param.end()), ref_buffer(shape.n);
      for (int step = 1; step <= 3; ++step) {
        const std::vector<float> grad = RandomFloats(shape.n, NextSeed());
        auto dgrad = OnDevice(grad, shape.offset_b);
        SgdMomentumUpdate(ctx_, shape.n, 0.05f, 0.9f, weight_decay, step == 1, param->get(),
                          dgrad->get(), buffer.get());
        SgdMomentumUpdate(CpuContext(), shape.n, 0.05f, 0.9f, weight_decay, step == 1,
                          cpu_param.data(), grad.data(), cpu_buffer.data());
        for (int64_t i = 0; i < shape.n; ++i) {
          const double g = grad[i] + static_cast<double>(weight_decay) * ref_param[i];
          ref_buffer[i] = step == 1 ? g : 0.9 * ref_buffer[i] + g;
          ref_param[i] -= 0.05 * ref_buffer[i];
        }
      }
      const std::vector<float> gpu_param = param->Download();
      ExpectBitEqual(gpu_param, cpu_param, "param");
      ExpectBitEqual(buffer.Download(), cpu_buffer, "buffer");
      for (int64_t i = 0; i < shape.n; i += 97) ASSERT_NEAR(gpu_param[i], ref_param[i], 1e-5) << i;
    }
  }
}

TEST_F(CudaKernelsTest, AdamWIsBitIdenticalToCpuOverSeveralSteps) {
  for (const FlatShape& shape : kFlatShapes) {
    for (float weight_decay : {0.0f, 0.1f}) {
      SCOPED_TRACE(::testing::Message() << "n=" << shape.n << " offsets=" << shape.offset_a << ","
                                        << shape.offset_b << " wd=" << weight_decay);
      const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
      std::vector<float> cpu_param = RandomFloats(shape.n, NextSeed());
      std::vector<float> cpu_m(shape.n, 0.0f), cpu_v(shape.n, 0.0f);
      auto param = OnDevice(cpu_param, shape.offset_a);
      auto m = OnDevice(cpu_m, shape.offset_a), v = OnDevice(cpu_v, shape.offset_a);
      std::vector<double> p(cpu_param.begin(), cpu_param.end()), rm(shape.n), rv(shape.n);
      for (int step = 1; step <= 4; ++step) {
        const double correction1 = 1.0 - std::pow(double{beta1}, step);
        const double correction2 = 1.0 - std::pow(double{beta2}, step);
        const std::vector<float> grad = RandomFloats(shape.n, NextSeed(), -2.0f, 2.0f);
        auto dgrad = OnDevice(grad, shape.offset_b);
        AdamWUpdate(ctx_, shape.n, lr, beta1, beta2, epsilon, weight_decay, step, param->get(),
                    dgrad->get(), m->get(), v->get());
        AdamWUpdate(CpuContext(), shape.n, lr, beta1, beta2, epsilon, weight_decay, step,
                    cpu_param.data(), grad.data(), cpu_m.data(), cpu_v.data());
        for (int64_t i = 0; i < shape.n; ++i) {
          p[i] *= 1.0 - static_cast<double>(lr) * weight_decay;
          rm[i] = beta1 * rm[i] + (1.0 - beta1) * grad[i];
          rv[i] = beta2 * rv[i] + (1.0 - beta2) * grad[i] * grad[i];
          p[i] -= lr * (rm[i] / correction1) / (std::sqrt(rv[i] / correction2) + epsilon);
        }
      }
      const std::vector<float> gpu_param = param->Download();
      ExpectBitEqual(gpu_param, cpu_param, "param");
      ExpectBitEqual(m->Download(), cpu_m, "exp_avg");
      ExpectBitEqual(v->Download(), cpu_v, "exp_avg_sq");
      for (int64_t i = 0; i < shape.n; i += 97) ASSERT_NEAR(gpu_param[i], p[i], 1e-6) << i;
    }
  }
}

TEST_F(CudaKernelsTest, ScaleIsBitIdenticalToCpu) {
  for (const FlatShape& shape : kFlatShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << shape.n << " offset=" << shape.offset_a);
    std::vector<float> x = RandomFloats(shape.n, NextSeed(), -1e3f, 1e3f);
    auto dx = OnDevice(x, shape.offset_a);
    Scale(ctx_, shape.n, -0.3f, dx->get());
    Scale(CpuContext(), shape.n, -0.3f, x.data());
    ExpectBitEqual(dx->Download(), x, "x");
  }
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyAccumulateAddsTheLossOnTheDeviceWithoutAHostRead) {
  const int64_t rows = 777, classes = 37;
  const std::vector<float> logits = RandomFloats(rows * classes, NextSeed(), -6.0f, 6.0f);
  const std::vector<int32_t> labels = RandomLabels(rows, static_cast<int32_t>(classes), NextSeed());
  std::vector<float> cpu_dlogits(rows * classes);
  double cpu_loss = 0.0;
  SoftmaxCrossEntropy(CpuContext(), rows, classes, logits.data(), labels.data(), 0.5f,
                      cpu_dlogits.data(), &cpu_loss, nullptr);
  auto dlogits_in = OnDevice(logits);
  auto dlabels = OnDevice(labels);
  DeviceArray<float> dlogits(rows * classes);
  dlogits.Poison();
  // The accumulator starts at a value of its own, and three calls add three losses.
  auto accumulator = OnDevice(std::vector<double>{1.25});
  for (int call = 0; call < 3; ++call) {
    SoftmaxCrossEntropyAccumulate(ctx_, rows, classes, dlogits_in->get(), dlabels->get(), 0.5f,
                                  dlogits.get(), accumulator->get());
  }
  EXPECT_TRUE(Near(accumulator->Download()[0], 1.25 + 3 * cpu_loss, 1e-6, 1e-9));
  const std::vector<float> gpu_dlogits = dlogits.Download();
  for (size_t i = 0; i < gpu_dlogits.size(); ++i) {
    ASSERT_TRUE(Near(gpu_dlogits[i], cpu_dlogits[i], 0, 1e-6 * 0.5)) << i;
  }
}

TEST_F(CudaKernelsTest, CountNonFiniteMatchesCpuAndSetZeroClearsEveryElement) {
  for (const FlatShape& shape : kFlatShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << shape.n << " offset=" << shape.offset_a);
    std::vector<float> x = RandomFloats(shape.n, NextSeed(), -1e3f, 1e3f);
    std::mt19937 pick(NextSeed());
    const float specials[] = {INFINITY, -INFINITY, NAN, FromBits(0x7fc00001u)};
    for (int64_t k = 0; k < shape.n / 97; ++k) x[pick() % shape.n] = specials[pick() % 4];
    auto dx = OnDevice(x, shape.offset_a);
    EXPECT_EQ(CountNonFinite(ctx_, shape.n, dx->get()),
              CountNonFinite(CpuContext(), shape.n, x.data()));
    dx->Poison();  // all NaN
    EXPECT_EQ(CountNonFinite(ctx_, shape.n, dx->get()), shape.n);
    SetZero(ctx_, shape.n, dx->get());
    for (float value : dx->Download()) ASSERT_EQ(Bits(value), 0u);
  }
}

// ---- The device layer ----

TEST_F(CudaKernelsTest, DeviceCopiesOnBothStreamsAreOrderedByEvents) {
  auto device = CreateDevice(DeviceType::kCuda);
  ASSERT_TRUE(device.ok()) << device.status();
  Device& gpu = **device;
  const int64_t n = 1 << 22;  // 16 MiB: long enough for a missing order to show
  const std::vector<float> values = RandomFloats(n, NextSeed(), -1.0f, 1.0f);
  lockstep::kernels::DeviceArray<float> a, b;
  ASSERT_TRUE(a.Allocate(gpu, n).ok());
  ASSERT_TRUE(b.Allocate(gpu, n).ok());
  EXPECT_EQ(*a.ToHost(), std::vector<float>(n, 0.0f)) << "allocation is zero-filled";
  lockstep::kernels::HostArray<float> pinned;
  ASSERT_TRUE(pinned.Allocate(gpu, n).ok());
  std::memcpy(pinned.data(), values.data(), n * sizeof(float));
  // compute: upload, then scale; side: waits for that, then copies a to b and back to the host.
  gpu.CopyToDevice(gpu.compute(), a.device_data(), pinned.data(), n * sizeof(float));
  Scale(gpu.compute(), n, 2.0f, a.device_data());
  auto scaled = gpu.CreateEvent();
  gpu.Record(*scaled, gpu.compute());
  gpu.Wait(gpu.side(), *scaled);
  gpu.CopyOnDevice(gpu.side(), b.device_data(), a.device_data(), n * sizeof(float));
  std::vector<float> back(n, NAN);
  gpu.CopyToHost(gpu.side(), back.data(), b.device_data(), n * sizeof(float));
  gpu.Synchronize(gpu.side());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 2.0f * values[i]) << i;
  // A synchronous range copy and its bounds.
  std::vector<float> middle(10);
  ASSERT_TRUE(b.CopyToHost(middle.data(), 10, n / 2).ok());
  EXPECT_EQ(middle[3], 2.0f * values[n / 2 + 3]);
  EXPECT_EQ(b.CopyToHost(middle.data(), 10, n - 5).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, DeviceAllocationBeyondTheCardIsAnErrorNotACrash) {
  auto device = CreateDevice(DeviceType::kCuda);
  ASSERT_TRUE(device.ok()) << device.status();
  lockstep::kernels::DeviceArray<float> huge;
  const Status status = huge.Allocate(**device, int64_t{1} << 40);  // 4 TiB
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("cuda:0"), std::string::npos) << status;
  // The device is still usable afterwards.
  lockstep::kernels::DeviceArray<float> small;
  ASSERT_TRUE(small.Allocate(**device, 16).ok());
  EXPECT_EQ(small.ToHost()->size(), 16u);
}

class CudaHalfTest : public CudaKernelsTest, public ::testing::WithParamInterface<HalfType> {};

TEST_P(CudaHalfTest, PackIsBitIdenticalToCpuOnRandomAndSweptFloats) {
  const HalfType type = GetParam();
  // Random gradients, then a sweep over float bit patterns of every exponent (ties, denormals,
  // overflow to inf included); NaNs only need to stay NaN.
  std::vector<float> sweep;
  for (uint64_t bits = NextSeed() % 1999; bits <= 0xffffffffu; bits += 1999) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    if (!std::isnan(value)) sweep.push_back(value);
  }
  for (float special : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f,
                        0x1p-25f, 0x1p-24f, INFINITY, -INFINITY}) {
    sweep.push_back(special);
  }
  const std::vector<float> inputs[] = {RandomFloats(100003, NextSeed(), -8.0f, 8.0f), sweep};
  for (const std::vector<float>& in : inputs) {
    for (float scale : {1.0f, 0.25f}) {
      for (const FlatShape& shape : {FlatShape{0, 0, 0}, FlatShape{0, 1, 1}, FlatShape{0, 1, 2}}) {
        SCOPED_TRACE(::testing::Message() << "n=" << in.size() << " scale=" << scale << " offsets="
                                          << shape.offset_a << "," << shape.offset_b);
        const int64_t n = static_cast<int64_t>(in.size());
        std::vector<uint16_t> cpu(n);
        PackHalf(CpuContext(), type, n, scale, in.data(), cpu.data());
        auto din = OnDevice(in, shape.offset_a);
        DeviceArray<uint16_t> out(n, shape.offset_b);
        out.Poison();
        PackHalf(ctx_, type, n, scale, din->get(), out.get());
        const std::vector<uint16_t> gpu = out.Download();
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(gpu[i], cpu[i])
              << i << " value " << in[i] << " bits " << std::hex << Bits(in[i]);
        }
      }
    }
  }
  // NaN in, NaN out (the payload is not kept).
  auto nan_in = OnDevice(std::vector<float>{NAN, -NAN, FromBits(0x7f800001)});
  DeviceArray<uint16_t> nan_out(3);
  PackHalf(ctx_, type, 3, 1.0f, nan_in->get(), nan_out.get());
  for (uint16_t h : nan_out.Download()) {
    EXPECT_TRUE(std::isnan(type == HalfType::kBf16 ? Bf16ToFloat(h) : Fp16ToFloat(h)))
        << std::hex << h;
  }
}

TEST_P(CudaHalfTest, UnpackIsBitIdenticalToCpuOnEveryHalfPattern) {
  const HalfType type = GetParam();
  std::vector<uint16_t> patterns(1 << 16);
  for (uint32_t bits = 0; bits < patterns.size(); ++bits) patterns[bits] = bits;
  for (float scale : {1.0f, 3.0f}) {
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "scale=" << scale << " offset=" << offset);
      std::vector<float> cpu(patterns.size());
      UnpackHalf(CpuContext(), type, cpu.size(), scale, patterns.data(), cpu.data());
      auto in = OnDevice(patterns, offset);
      DeviceArray<float> out(patterns.size(), offset);
      out.Poison();
      UnpackHalf(ctx_, type, patterns.size(), scale, in->get(), out.get());
      const std::vector<float> gpu = out.Download();
      for (size_t i = 0; i < gpu.size(); ++i) {
        if (std::isnan(cpu[i])) {
          ASSERT_TRUE(std::isnan(gpu[i])) << std::hex << i;
        } else {
          ASSERT_EQ(Bits(gpu[i]), Bits(cpu[i])) << std::hex << "pattern " << i;
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, RoundToBf16IsBitIdenticalToCpuInPlaceAndNot) {
  std::vector<float> in = RandomFloats(100003, NextSeed(), -8.0f, 8.0f);
  for (uint64_t bits = NextSeed() % 2011; bits <= 0xffffffffu; bits += 2011) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    if (!std::isnan(value)) in.push_back(value);
  }
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<float> cpu(n);
  RoundToBf16(CpuContext(), n, in.data(), cpu.data());
  for (size_t offset : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "offset=" << offset);
    auto din = OnDevice(in, offset);
    DeviceArray<float> out(n, offset);
    out.Poison();
    RoundToBf16(ctx_, n, din->get(), out.get());
    RoundToBf16(ctx_, n, din->get(), din->get());
    const std::vector<float> gpu = out.Download();
    const std::vector<float> gpu_in_place = din->Download();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(gpu[i]), Bits(cpu[i])) << i << " value " << in[i];
      ASSERT_EQ(Bits(gpu_in_place[i]), Bits(cpu[i])) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothFormats, CudaHalfTest,
                         ::testing::Values(HalfType::kBf16, HalfType::kFp16), [](const auto& info) {
                           return std::string(info.param == HalfType::kBf16 ? "Bf16" : "Fp16");
                         });

// ---- Without a device (these run on every machine) ----

TEST(CudaAvailabilityTest, CudaAvailableAgreesWithTheRuntime) {
  int count = 0;
  const bool runtime_says = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  EXPECT_EQ(CudaAvailable(), runtime_says);
}

TEST(CudaAvailabilityDeathTest, KernelWithoutDeviceAbortsWithMessage) {
  if (CudaAvailable()) GTEST_SKIP() << "a device is present";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the CUDA runtime has started a thread
  ExecutionContext ctx;
  ctx.device = DeviceType::kCuda;
  float x[4] = {1, 2, 3, 4};
  EXPECT_DEATH(Scale(ctx, 4, 2.0f, x), "Scale: device cuda requested, but no CUDA device");
}

TEST(CudaAvailabilityDeathTest, FailedCudaCallAbortsNamingCallAndError) {
  if (CudaAvailable()) GTEST_SKIP() << "a device is present";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Below the dispatch's device check: the CUDA runtime's own error, in lockstep's words.
  float x[4] = {1, 2, 3, 4};
  ExecutionContext ctx;
  ctx.device = DeviceType::kCuda;
  EXPECT_DEATH(cuda::Scale(ctx, 4, 2.0f, x),
               "kernels \\(cuda\\): UNAVAILABLE: cuda[A-Za-z]+\\(.*\\) at .*: cudaError");
}

// The CUDA intrinsics the pack kernel calls, in their host emulation, against the CPU path: the
// same round-to-nearest-even. (The device executes cvt.rn, IEEE's rounding; the GPU tests above
// compare the two on the device.)
TEST(CudaConversionTest, HostEmulatedIntrinsicsRoundLikeCpuPath) {
  for (uint64_t bits = 12345; bits <= 0xffffffffu; bits += 1999) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(__half_as_ushort(__float2half_rn(value)), FloatToFp16(value)) << std::hex << bits;
    ASSERT_EQ(__bfloat16_as_ushort(__float2bfloat16_rn(value)), FloatToBf16(value))
        << std::hex << bits;
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float cpu = Fp16ToFloat(half);
    const float cuda = __half2float(__ushort_as_half(half));
    if (std::isnan(cpu)) {
      ASSERT_TRUE(std::isnan(cuda)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(cuda), Bits(cpu)) << std::hex << h;
    }
    ASSERT_EQ(Bits(__bfloat162float(__ushort_as_bfloat16(half))), Bits(Bf16ToFloat(half)))
        << std::hex << h;
  }
}

}  // namespace
}  // namespace lockstep::kernels
