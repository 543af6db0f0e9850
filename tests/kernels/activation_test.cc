#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::ReferenceActivation;
using testing::ReferenceDerivative;
using testing::Poisoned;
using testing::RandomFloats;

class BiasActivationTest : public ::testing::TestWithParam<ActivationType> {
 protected:
  static constexpr int64_t kRows = 37;
  static constexpr int64_t kCols = 23;
  // Inputs kept at least kMargin away from relu's kink so finite differences never straddle it.
  static constexpr float kMargin = 0.05f;

  void SetUp() override {
    input_ = RandomFloats(kRows * kCols, 11, -3.0f, 3.0f);
    bias_ = RandomFloats(kCols, 12, -0.5f, 0.5f);
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      const float pre = input_[i] + bias_[i % kCols];
      if (std::fabs(pre) < kMargin) input_[i] += pre < 0 ? -2 * kMargin : 2 * kMargin;
    }
  }

  // Runs the forward pass on a copy of `input`; returns y and fills `pre`.
  std::vector<float> Forward(const std::vector<float>& input, const std::vector<float>& bias,
                             std::vector<float>* pre) const {
    std::vector<float> y = input;
    *pre = Poisoned(input.size());
    BiasActivationForward(CpuContext(), GetParam(), kRows, kCols, bias.data(), y.data(),
                          pre->data());
    return y;
  }

  std::vector<float> input_;
  std::vector<float> bias_;
};

TEST_P(BiasActivationTest, ForwardMatchesDoubleReferenceAndWritesPreActivation) {
  std::vector<float> pre;
  const std::vector<float> y = Forward(input_, bias_, &pre);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    const double v = static_cast<double>(input_[i]) + bias_[i % kCols];
    ASSERT_NEAR(pre[i], v, 1e-6) << i;
    ASSERT_NEAR(y[i], ReferenceActivation(GetParam(), v), 2e-6) << i;
  }
  // Without a pre-activation buffer the output is the same.
  std::vector<float> y_only = input_;
  BiasActivationForward(CpuContext(), GetParam(), kRows, kCols, bias_.data(), y_only.data(),
                        nullptr);
  EXPECT_EQ(y_only, y);
}

TEST_P(BiasActivationTest, BackwardMatchesReferenceAndOverwritesBiasGradient) {
  std::vector<float> pre;
  const std::vector<float> y = Forward(input_, bias_, &pre);
  const std::vector<float> upstream = RandomFloats(kRows * kCols, 13);
  std::vector<float> dy = upstream;
  std::vector<float> dbias = Poisoned(kCols);  // overwritten, never accumulated into
  BiasActivationBackward(CpuContext(), GetParam(), kRows, kCols, y.data(), pre.data(), dy.data(),
                         dbias.data());
  std::vector<double> expected_dbias(kCols, 0.0);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    const double v = static_cast<double>(input_[i]) + bias_[i % kCols];
    const double dx = upstream[i] * ReferenceDerivative(GetParam(), v);
    ASSERT_NEAR(dy[i], dx, 1e-5) << i;
    expected_dbias[i % kCols] += dx;
  }
  for (int64_t c = 0; c < kCols; ++c) ASSERT_NEAR(dbias[c], expected_dbias[c], 1e-4) << c;
}

// L(x, b) = sum(w * act(x + b)): the backward pass with dy = w must give dL/dx and dL/db.
TEST_P(BiasActivationTest, BackwardMatchesFiniteDifferencesOfComposedFunction) {
  const std::vector<float> weights = RandomFloats(kRows * kCols, 14);
  auto loss = [&](const std::vector<float>& input, const std::vector<float>& bias) {
    std::vector<float> pre;
    const std::vector<float> y = Forward(input, bias, &pre);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(weights[i]) * y[i];
    return sum;
  };
  std::vector<float> pre;
  const std::vector<float> y = Forward(input_, bias_, &pre);
  std::vector<float> dx = weights;
  std::vector<float> dbias = Poisoned(kCols);
  BiasActivationBackward(CpuContext(), GetParam(), kRows, kCols, y.data(), pre.data(), dx.data(),
                         dbias.data());

  const float h = 1e-2f;  // < kMargin; float inputs need a wide step to beat rounding
  for (int64_t i = 0; i < kRows * kCols; i += 7) {
    std::vector<float> plus = input_, minus = input_;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (loss(plus, bias_) - loss(minus, bias_)) / (2.0 * h);
    ASSERT_NEAR(dx[i], numeric, 2e-3 + 2e-3 * std::fabs(numeric)) << "dx " << i;
  }
  for (int64_t c = 0; c < kCols; ++c) {
    std::vector<float> plus = bias_, minus = bias_;
    plus[c] += h;
    minus[c] -= h;
    const double numeric = (loss(input_, plus) - loss(input_, minus)) / (2.0 * h);
    ASSERT_NEAR(dbias[c], numeric, 2e-3 + 2e-3 * std::fabs(numeric)) << "dbias " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(AllActivations, BiasActivationTest,
                         ::testing::Values(ActivationType::kIdentity, ActivationType::kRelu,
                                           ActivationType::kGelu, ActivationType::kTanh),
                         [](const auto& info) { return testing::ActivationName(info.param); });

TEST(BiasActivationEdgeTest, ReluBackwardNeedsOnlyOutputAndDropsGradientOfDeadUnits) {
  const float y[] = {0.0f, 2.0f, 0.0f, 3.0f};
  float dy[] = {INFINITY, 1.0f, 5.0f, -2.0f};
  float dbias[2] = {NAN, NAN};
  BiasActivationBackward(CpuContext(), ActivationType::kRelu, 2, 2, y, nullptr, dy, dbias);
  EXPECT_EQ(dy[0], 0.0f);
  EXPECT_EQ(dy[1], 1.0f);
  EXPECT_EQ(dy[2], 0.0f);
  EXPECT_EQ(dy[3], -2.0f);
  EXPECT_EQ(dbias[0], 0.0f);
  EXPECT_EQ(dbias[1], -1.0f);
}

TEST(BiasActivationEdgeTest, BiasGradientOfManyRowsKeepsPrecision) {
  // 2^20 rows of 0.1f: a float running sum drifts by ~1e-2 relative; the double one does not.
  const int64_t rows = 1 << 20;
  std::vector<float> dy(rows, 0.1f);
  float dbias = NAN;
  BiasActivationBackward(CpuContext(), ActivationType::kIdentity, rows, 1, nullptr, nullptr,
                         dy.data(), &dbias);
  EXPECT_NEAR(dbias, rows * static_cast<double>(0.1f), 1e-6 * rows * 0.1);
}

TEST(BiasActivationEdgeTest, AccumulatingBackwardAddsTheBiasGradientToWhatIsThere) {
  float dy[] = {1.0f, 2.0f, 3.0f, 4.0f};
  float dbias[2] = {10.0f, 20.0f};
  BiasActivationBackward(CpuContext(), ActivationType::kIdentity, 2, 2, nullptr, nullptr, dy, dbias,
                         /*accumulate=*/true);
  EXPECT_EQ(dbias[0], 14.0f);
  EXPECT_EQ(dbias[1], 26.0f);
  // Zero rows add nothing.
  BiasActivationBackward(CpuContext(), ActivationType::kIdentity, 0, 2, nullptr, nullptr, nullptr,
                         dbias, /*accumulate=*/true);
  EXPECT_EQ(dbias[0], 14.0f);
  EXPECT_EQ(dbias[1], 26.0f);
}

}  // namespace
}  // namespace lockstep::kernels
