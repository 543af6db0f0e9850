#include "worker/trainer/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/test_util.h"
#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

using kernels::ActivationType;

// Loss (scaled as ForwardBackward scales it) at the given parameters, in double.
double ScaledLoss(const MlpModel& model, const std::vector<float>& params,
                  const std::vector<float>& x, const std::vector<int32_t>& y, int64_t rows,
                  float grad_scale) {
  MlpWorkspace workspace = *MlpWorkspace::Create(model, rows, kernels::CpuDevice());
  std::vector<float> grads(params.size());
  double loss_sum = 0;
  model.ForwardBackward({}, params.data(), x.data(), y.data(), rows, grad_scale, grads.data(),
                        workspace, nullptr, &loss_sum);
  return grad_scale * loss_sum;
}

class GradientCheckTest : public ::testing::TestWithParam<ActivationType> {};

TEST_P(GradientCheckTest, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, features = 4, classes = 3;
  auto model = MlpModel::Create(features, {6, 5}, classes, GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params(static_cast<size_t>(model->layout().num_params));
  model->InitializeParameters(7, params.data());
  SplitMix64 rng(3);
  std::vector<float> x(static_cast<size_t>(rows * features));
  for (float& v : x) v = rng.UniformFloat(-1.5f, 1.5f);
  std::vector<int32_t> y{0, 2, 1, 2, 0};
  const float grad_scale = 1.0f / 8;  // as if 8 samples made the global batch

  MlpWorkspace workspace = *MlpWorkspace::Create(*model, rows, kernels::CpuDevice());
  std::vector<float> grads(params.size());
  double loss_sum = 0;
  model->ForwardBackward({}, params.data(), x.data(), y.data(), rows, grad_scale, grads.data(),
                         workspace, nullptr, &loss_sum);

  const float eps = 2e-3f;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (ScaledLoss(*model, plus, x, y, rows, grad_scale) -
                            ScaledLoss(*model, minus, x, y, rows, grad_scale)) /
                           (2.0 * eps);
    EXPECT_NEAR(grads[i], numeric, 3e-4 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, GradientCheckTest,
                         ::testing::Values(ActivationType::kRelu, ActivationType::kGelu,
                                           ActivationType::kTanh),
                         [](const auto& info) {
                           return kernels::testing::ActivationName(info.param);
                         });

TEST(MlpModelTest, ParametersAreLaidOutLastLayerFirst) {
  auto model = MlpModel::Create(784, {256, 128}, 10, ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  const ParameterLayout& layout = model->layout();
  ASSERT_EQ(layout.num_layers(), 3);
  EXPECT_EQ(layout.layers[2].weight_offset, 0);
  EXPECT_EQ(layout.layers[2].bias_offset, 128 * 10);
  EXPECT_EQ(layout.layers[1].weight_offset, 128 * 10 + 10);
  EXPECT_EQ(layout.layers[0].weight_offset, 128 * 10 + 10 + 256 * 128 + 128);
  EXPECT_EQ(layout.num_params, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(MlpModelTest, LayersBecomeReadyInBackwardOrderAsContiguousPrefixes) {
  auto model = MlpModel::Create(3, {4, 4}, 2, ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  std::vector<float> params(static_cast<size_t>(model->layout().num_params));
  model->InitializeParameters(1, params.data());
  std::vector<float> x(6, 0.5f), grads(params.size(), 0.0f);
  std::vector<int32_t> y{0, 1};
  MlpWorkspace workspace = *MlpWorkspace::Create(*model, 2, kernels::CpuDevice());
  std::vector<int> ready;
  double loss_sum = 0;
  model->ForwardBackward({}, params.data(), x.data(), y.data(), 2, 0.5f, grads.data(), workspace,
                         [&](int b) { ready.push_back(b); }, &loss_sum);
  EXPECT_EQ(ready, (std::vector<int>{0, 1, 2}));
}

TEST(MlpModelTest, InitializationIsDeterministicAndWithinPyTorchBounds) {
  auto model = MlpModel::Create(100, {20}, 5, ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  std::vector<float> a(static_cast<size_t>(model->layout().num_params));
  std::vector<float> b(a.size()), c(a.size());
  model->InitializeParameters(42, a.data());
  model->InitializeParameters(42, b.data());
  model->InitializeParameters(43, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const LayerLayout& layer : model->layout().layers) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    for (int64_t i = 0; i < layer.num_params(); ++i) {
      ASSERT_LE(std::fabs(a[static_cast<size_t>(layer.weight_offset + i)]), bound);
    }
  }
}

TEST(MlpModelTest, EmptyBatchGivesZeroGradientsAndAllLayersReady) {
  auto model = MlpModel::Create(3, {4}, 2, ActivationType::kTanh);
  ASSERT_TRUE(model.ok());
  std::vector<float> params(static_cast<size_t>(model->layout().num_params));
  model->InitializeParameters(1, params.data());
  std::vector<float> grads(params.size(), 5.0f);
  MlpWorkspace workspace = *MlpWorkspace::Create(*model, 1, kernels::CpuDevice());
  int ready = 0;
  double loss = 0;
  model->ForwardBackward({}, params.data(), nullptr, nullptr, 0, 1.0f, grads.data(), workspace,
                         [&](int) { ++ready; }, &loss);
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(ready, 2);
  for (float g : grads) EXPECT_EQ(g, 0.0f);
}

// Micro-batches of one step: accumulated gradients are the whole batch's, up to float rounding.
TEST(MlpModelTest, AccumulatedMicroBatchGradientsEqualTheWholeBatchGradient) {
  const int64_t rows = 7, features = 5, classes = 3;
  auto model = MlpModel::Create(features, {6, 4}, classes, ActivationType::kGelu);
  ASSERT_TRUE(model.ok());
  std::vector<float> params(static_cast<size_t>(model->layout().num_params));
  model->InitializeParameters(3, params.data());
  SplitMix64 rng(11);
  std::vector<float> x(static_cast<size_t>(rows * features));
  for (float& v : x) v = rng.UniformFloat(-1, 1);
  std::vector<int32_t> y(static_cast<size_t>(rows));
  for (int32_t& label : y) label = static_cast<int32_t>(rng.Next() % classes);
  const float grad_scale = 1.0f / rows;

  MlpWorkspace whole_workspace = *MlpWorkspace::Create(*model, rows, kernels::CpuDevice());
  std::vector<float> whole(params.size());
  double whole_loss = 0;
  model->ForwardBackward({}, params.data(), x.data(), y.data(), rows, grad_scale, whole.data(),
                         whole_workspace, nullptr, &whole_loss);

  // Pieces of 3, 0 (an empty one changes nothing) and 4 rows, in a workspace of 4 rows.
  MlpWorkspace workspace = *MlpWorkspace::Create(*model, 4, kernels::CpuDevice());
  std::vector<float> accumulated(params.size(), 9.0f);  // overwritten by the first piece
  double loss = 0;
  int64_t begin = 0;
  int ready = 0;
  for (int64_t piece : {3, 0, 4}) {
    model->ForwardBackward(
        {}, params.data(), x.data() + begin * features, y.data() + begin, piece, grad_scale,
        accumulated.data(), workspace, [&](int) { ++ready; }, &loss, /*accumulate=*/begin > 0);
    begin += piece;
  }
  EXPECT_EQ(ready, 3 * model->layout().num_layers());
  EXPECT_NEAR(loss, whole_loss, 1e-9 * std::fabs(whole_loss));
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_NEAR(accumulated[i], whole[i], 1e-6f + 1e-5f * std::fabs(whole[i])) << "parameter " << i;
  }
}

TEST(MlpModelTest, RejectsZeroWidthHiddenLayer) {
  auto model = MlpModel::Create(3, {4, 0}, 2, ActivationType::kRelu);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("hidden[1]"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::trainer
