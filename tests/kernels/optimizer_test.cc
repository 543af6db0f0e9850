#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::Poisoned;
using testing::RandomFloats;
using testing::ToDouble;

constexpr int64_t kN = 1001;  // odd, so vector loops have a remainder

struct SgdCase {
  float momentum;
  float weight_decay;
};

class SgdMomentumTest : public ::testing::TestWithParam<SgdCase> {};

// Runs 5 steps with fresh gradients each step and checks every step against the formula
// iterated in double.
TEST_P(SgdMomentumTest, StepsMatchPyTorchFormulaIteratedInDouble) {
  const auto [momentum, weight_decay] = GetParam();
  const float lr = 0.05f;
  std::vector<float> param = RandomFloats(kN, 31);
  std::vector<float> buffer = Poisoned(kN);  // the first step must not read it
  std::vector<double> ref_param = ToDouble(param);
  std::vector<double> ref_buffer(kN);
  for (int step = 1; step <= 5; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> grad = RandomFloats(kN, 100 + step);
    SgdMomentumUpdate(CpuContext(), kN, lr, momentum, weight_decay, step == 1, param.data(),
                      grad.data(), buffer.data());
    for (int64_t i = 0; i < kN; ++i) {
      const double g = grad[i] + static_cast<double>(weight_decay) * ref_param[i];
      ref_buffer[i] = step == 1 ? g : momentum * ref_buffer[i] + g;
      ref_param[i] -= lr * ref_buffer[i];
      ASSERT_NEAR(buffer[i], ref_buffer[i], 1e-5) << i;
      ASSERT_NEAR(param[i], ref_param[i], 1e-5) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configurations, SgdMomentumTest,
                         ::testing::Values(SgdCase{0.9f, 0.0f}, SgdCase{0.9f, 1e-2f},
                                           SgdCase{0.0f, 5e-4f}),
                         [](const auto& info) {
                           return std::string(info.param.momentum > 0 ? "Momentum" : "Plain") +
                                  (info.param.weight_decay > 0 ? "WithWeightDecay" : "");
                         });

TEST(SgdMomentumUpdateTest, FirstStepIsPlainGradientStep) {
  float param[] = {1.0f, -2.0f};
  const float grad[] = {0.5f, 0.25f};
  float buffer[] = {NAN, NAN};
  SgdMomentumUpdate(CpuContext(), 2, 0.1f, 0.9f, 0.0f, true, param, grad, buffer);
  EXPECT_FLOAT_EQ(param[0], 0.95f);
  EXPECT_FLOAT_EQ(param[1], -2.025f);
  EXPECT_EQ(buffer[0], 0.5f);
  EXPECT_EQ(buffer[1], 0.25f);
}

// Iterates AdamW in double through `steps` steps and checks the last one; the bias corrections
// dominate at step 1 (m_hat = g, so the update is ~lr * sign(g)) and still matter at step 10.
void CheckAdamWAgainstDouble(int steps, float weight_decay) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  std::vector<float> param = RandomFloats(kN, 41);
  std::vector<float> exp_avg(kN, 0.0f), exp_avg_sq(kN, 0.0f);
  std::vector<double> p = ToDouble(param), m(kN, 0.0), v(kN, 0.0);
  for (int step = 1; step <= steps; ++step) {
    const std::vector<float> grad = RandomFloats(kN, 200 + step, -2.0f, 2.0f);
    AdamWUpdate(CpuContext(), kN, lr, beta1, beta2, epsilon, weight_decay, step, param.data(),
                grad.data(), exp_avg.data(), exp_avg_sq.data());
    for (int64_t i = 0; i < kN; ++i) {
      p[i] *= 1.0 - static_cast<double>(lr) * weight_decay;
      m[i] = beta1 * m[i] + (1.0 - beta1) * grad[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1.0 - std::pow(static_cast<double>(beta1), step));
      const double v_hat = v[i] / (1.0 - std::pow(static_cast<double>(beta2), step));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + epsilon);
    }
  }
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(exp_avg[i], m[i], 1e-6) << i;
    ASSERT_NEAR(exp_avg_sq[i], v[i], 1e-6) << i;
    // The update itself is ~1e-3 per step; 1e-6 absolute checks it to ~0.1%.
    ASSERT_NEAR(param[i], p[i], 1e-6) << i;
  }
}

TEST(AdamWUpdateTest, FirstStepAppliesBiasCorrection) {
  CheckAdamWAgainstDouble(1, 0.0f);
  // At step 1 the bias-corrected update is lr * g / (|g| + eps): a step of lr against the sign.
  float param = 1.0f, exp_avg = 0.0f, exp_avg_sq = 0.0f;
  const float grad = 0.3f;
  AdamWUpdate(CpuContext(), 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, &param, &grad, &exp_avg,
              &exp_avg_sq);
  EXPECT_NEAR(param, 1.0f - 1e-3f, 1e-7);
}

TEST(AdamWUpdateTest, TenthStepMatchesDoubleReference) { CheckAdamWAgainstDouble(10, 0.0f); }

TEST(AdamWUpdateTest, DecoupledWeightDecayMatchesDoubleReference) {
  CheckAdamWAgainstDouble(10, 0.1f);
  // Zero gradient: only the decay acts, param *= 1 - lr * wd.
  float param = 2.0f, exp_avg = 0.0f, exp_avg_sq = 0.0f;
  const float grad = 0.0f;
  AdamWUpdate(CpuContext(), 1, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.5f, 3, &param, &grad, &exp_avg,
              &exp_avg_sq);
  EXPECT_FLOAT_EQ(param, 2.0f * (1.0f - 1e-2f * 0.5f));
}

}  // namespace
}  // namespace lockstep::kernels
