#include "worker/trainer/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace lockstep::trainer {
namespace {

TEST(OptimizerTest, SgdMomentumMatchesHandComputation) {
  spec::OptimizerSpec spec;
  spec.type = spec::OptimizerType::kSgd;
  spec.momentum = 0.9;
  spec.weight_decay = 0.1;
  Optimizer optimizer(spec, 2);
  ASSERT_TRUE(optimizer.Allocate(kernels::CpuDevice()).ok());
  std::vector<float> params{1.0f, -2.0f};
  const std::vector<float> grads{0.5f, 0.25f};
  // Step 1: g = grad + wd * p = {0.6, 0.05}; buf = g; p -= 0.1 * buf.
  optimizer.Step({}, 0.1f, params.data(), grads.data());
  EXPECT_NEAR(params[0], 1.0f - 0.1f * 0.6f, 1e-6);
  EXPECT_NEAR(params[1], -2.0f - 0.1f * 0.05f, 1e-6);
  // Step 2: g = grad + wd * p; buf = 0.9 * buf + g; p -= 0.1 * buf.
  const float p0 = params[0], p1 = params[1];
  const float buf0 = 0.9f * 0.6f + (0.5f + 0.1f * p0);
  const float buf1 = 0.9f * 0.05f + (0.25f + 0.1f * p1);
  optimizer.Step({}, 0.1f, params.data(), grads.data());
  EXPECT_NEAR(params[0], p0 - 0.1f * buf0, 1e-6);
  EXPECT_NEAR(params[1], p1 - 0.1f * buf1, 1e-6);
  EXPECT_EQ(optimizer.steps_taken(), 2);
}

TEST(OptimizerTest, AdamWMatchesHandComputation) {
  spec::OptimizerSpec spec;
  spec.type = spec::OptimizerType::kAdamW;
  spec.weight_decay = 0.01;
  Optimizer optimizer(spec, 1);
  ASSERT_TRUE(optimizer.Allocate(kernels::CpuDevice()).ok());
  std::vector<float> params{2.0f};
  const std::vector<float> grads{0.5f};
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double p = 2.0, m = 0, v = 0;
  for (int step = 1; step <= 3; ++step) {
    optimizer.Step({}, static_cast<float>(lr), params.data(), grads.data());
    p *= 1 - lr * 0.01;
    m = b1 * m + (1 - b1) * 0.5;
    v = b2 * v + (1 - b2) * 0.25;
    p -= lr * (m / (1 - std::pow(b1, step))) / (std::sqrt(v / (1 - std::pow(b2, step))) + eps);
    EXPECT_NEAR(params[0], p, 1e-5) << "step " << step;
  }
  EXPECT_EQ(optimizer.StateBuffers().size(), 2u);
}

TEST(LearningRateTest, LinearScalingMultipliesByTheBatchesInTheGlobalBatch) {
  spec::OptimizerSpec spec;
  spec.learning_rate = 0.05;
  spec.lr_scaling = spec::LrScaling::kLinear;
  EXPECT_DOUBLE_EQ(LearningRate(spec, 100, 1), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 100, 4), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 101, 2),
                   0.1);  // a global batch that shrank: the rate follows
  spec.lr_scaling = spec::LrScaling::kNone;
  EXPECT_DOUBLE_EQ(LearningRate(spec, 100, 4), 0.05);
}

TEST(LearningRateTest, WarmupRampsLinearlyToTheScaledRate) {
  spec::OptimizerSpec spec;
  spec.learning_rate = 0.1;
  spec.lr_scaling = spec::LrScaling::kLinear;
  spec.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(spec, 0, 2), 0.2 * 1 / 4);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 1, 2), 0.2 * 2 / 4);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 3, 2), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 4, 2), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(spec, 1000, 2), 0.2);
}

}  // namespace
}  // namespace lockstep::trainer
