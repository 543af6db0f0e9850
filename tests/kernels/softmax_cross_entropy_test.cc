#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RandomLabels;

constexpr int64_t kRows = 29;
constexpr int64_t kClasses = 10;

// Per-row loss and softmax in double, straight from the definition (with the max subtracted so
// the reference itself survives large logits).
double ReferenceRowLoss(const float* row, int64_t classes, int32_t label, double* softmax) {
  double max_logit = row[0];
  for (int64_t c = 1; c < classes; ++c) max_logit = std::max<double>(max_logit, row[c]);
  double sum = 0.0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(row[c] - max_logit);
  for (int64_t c = 0; c < classes; ++c) softmax[c] = std::exp(row[c] - max_logit) / sum;
  return std::log(sum) + max_logit - row[label];
}

TEST(SoftmaxCrossEntropyTest, LossGradientAndCorrectCountMatchDoubleReference) {
  const std::vector<float> logits = RandomFloats(kRows * kClasses, 21, -4.0f, 4.0f);
  const std::vector<int32_t> labels = RandomLabels(kRows, kClasses, 22);
  const float grad_scale = 1.0f / 64;
  std::vector<float> dlogits = Poisoned(kRows * kClasses);
  double loss_sum = NAN;
  int64_t correct = -1;
  SoftmaxCrossEntropy(CpuContext(), kRows, kClasses, logits.data(), labels.data(), grad_scale,
                      dlogits.data(), &loss_sum, &correct);

  double expected_loss = 0.0;
  int64_t expected_correct = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const float* row = &logits[r * kClasses];
    double softmax[kClasses];
    expected_loss += ReferenceRowLoss(row, kClasses, labels[r], softmax);
    int64_t argmax = 0;
    for (int64_t c = 1; c < kClasses; ++c) argmax = row[c] > row[argmax] ? c : argmax;
    expected_correct += argmax == labels[r];
    for (int64_t c = 0; c < kClasses; ++c) {
      const double expected = (softmax[c] - (c == labels[r])) * grad_scale;
      ASSERT_NEAR(dlogits[r * kClasses + c], expected, 1e-8) << r << "," << c;
    }
  }
  EXPECT_NEAR(loss_sum, expected_loss, 1e-5 * kRows);
  EXPECT_EQ(correct, expected_correct);
  EXPECT_GT(expected_correct, 0);  // the check above is not vacuous
  EXPECT_EQ(CountCorrect(CpuContext(), kRows, kClasses, logits.data(), labels.data()),
            expected_correct);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferencesOfScaledLoss) {
  const std::vector<float> logits = RandomFloats(kRows * kClasses, 23, -2.0f, 2.0f);
  const std::vector<int32_t> labels = RandomLabels(kRows, kClasses, 24);
  const float grad_scale = 0.5f;
  auto scaled_loss = [&](const std::vector<float>& x) {
    std::vector<float> scratch(x.size());
    double loss_sum = 0.0;
    SoftmaxCrossEntropy(CpuContext(), kRows, kClasses, x.data(), labels.data(), grad_scale,
                        scratch.data(), &loss_sum, nullptr);
    return loss_sum * grad_scale;
  };
  std::vector<float> dlogits = Poisoned(kRows * kClasses);
  SoftmaxCrossEntropy(CpuContext(), kRows, kClasses, logits.data(), labels.data(), grad_scale,
                      dlogits.data(), nullptr, nullptr);
  const float h = 1e-2f;
  for (int64_t i = 0; i < kRows * kClasses; i += 3) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (scaled_loss(plus) - scaled_loss(minus)) / (2.0 * h);
    ASSERT_NEAR(dlogits[i], numeric, 1e-4) << i;
  }
}

TEST(SoftmaxCrossEntropyTest, LargeLogitsStayFinite) {
  // Logits of +-1e4 overflow exp() in float and double unless the maximum is subtracted.
  std::vector<float> logits = {1e4f,  -1e4f,    0.0f,    // confident and right
                               1e4f,  1e4f - 5, -1e4f,   // label 1: loss 5 + log(1 + e^-5)
                               -1e4f, -1e4f,    -1e4f};  // uniform: loss log(3)
  const std::vector<int32_t> labels = {0, 1, 2};
  std::vector<float> dlogits = Poisoned(9);
  double loss_sum = NAN;
  int64_t correct = -1;
  SoftmaxCrossEntropy(CpuContext(), 3, 3, logits.data(), labels.data(), 1.0f, dlogits.data(),
                      &loss_sum, &correct);
  for (float d : dlogits) ASSERT_TRUE(std::isfinite(d));
  EXPECT_NEAR(loss_sum, 0.0 + (5.0 + std::log1p(std::exp(-5.0))) + std::log(3.0), 1e-4);
  // Row 0 is right; row 1 predicts 0; row 2 ties, and argmax takes the first index, not label 2.
  EXPECT_EQ(correct, 1);
  EXPECT_NEAR(dlogits[0], 0.0, 1e-6);
  EXPECT_NEAR(dlogits[4], std::exp(-5.0) / (1.0 + std::exp(-5.0)) - 1.0, 1e-6);
  EXPECT_NEAR(dlogits[8], 1.0 / 3.0 - 1.0, 1e-6);
}

TEST(SoftmaxCrossEntropyTest, CountCorrectTakesFirstMaximumLikeArgmax) {
  const std::vector<float> logits = {1, 3, 3, 0,  //
                                     5, 1, 2, 5,  //
                                     0, 0, 0, 9};
  EXPECT_EQ(CountCorrect(CpuContext(), 3, 4, logits.data(), std::vector<int32_t>{1, 0, 3}.data()),
            3);
  EXPECT_EQ(CountCorrect(CpuContext(), 3, 4, logits.data(), std::vector<int32_t>{2, 3, 0}.data()),
            0);
}

}  // namespace
}  // namespace lockstep::kernels
