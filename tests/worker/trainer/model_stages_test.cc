// The model split into pipeline stages: each stage holds only its layers' slice of the
// parameters and runs Forward and Backward over them; the stages' outputs and input gradients
// pass from one to the next. Over micro-batches, with gradients accumulated, the stages end with
// the gradient one rank computes for the whole batch.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels/test_util.h"
#include "worker/trainer/model.h"
#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

using kernels::ActivationType;

constexpr int64_t kFeatures = 12, kClasses = 5, kRows = 12;
const std::vector<int32_t> kHidden{10, 9, 8, 7};  // 5 layers

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch MakeBatch() {
  SplitMix64 rng(11);
  Batch batch;
  batch.x.resize(static_cast<size_t>(kRows * kFeatures));
  for (float& v : batch.x) v = rng.UniformFloat(-2.0f, 2.0f);
  for (int64_t r = 0; r < kRows; ++r) batch.y.push_back(static_cast<int32_t>(r % kClasses));
  return batch;
}

// Layer ranges from stage boundaries {0, b1, ..., layers}.
std::vector<LayerRange> Stages(const std::vector<int>& bounds) {
  std::vector<LayerRange> stages;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) stages.push_back({bounds[s], bounds[s + 1]});
  return stages;
}

struct Result {
  std::vector<float> grads;  // the whole flat layout
  double loss_sum = 0;
};

Result WholeBatch(const MlpModel& model, const std::vector<float>& params, const Batch& batch) {
  MlpWorkspace workspace = *MlpWorkspace::Create(model, kRows, kernels::CpuDevice());
  Result result;
  result.grads.resize(params.size());
  model.ForwardBackward({}, params.data(), batch.x.data(), batch.y.data(), kRows, 1.0f / kRows,
                        result.grads.data(), workspace, nullptr, &result.loss_sum);
  return result;
}

// Each stage's parameters and gradients in a buffer of their own, as a stage's rank holds them;
// micro-batches run forward through every stage, then backward in reverse (GPipe's order). With
// `recompute`, a stage keeps only its input per micro-batch and runs its forward again, on one
// shared workspace, right before the backward.
Result Pipelined(const MlpModel& model, const std::vector<float>& params, const Batch& batch,
                 const std::vector<LayerRange>& stages, int micro_batches, bool recompute,
                 std::vector<int>* ready_order = nullptr) {
  const ParameterLayout& layout = model.layout();
  const int64_t rows = kRows / micro_batches;
  const auto num_stages = stages.size();
  std::vector<std::vector<float>> stage_params(num_stages), stage_grads(num_stages);
  // Per stage: its workspace per micro-batch (or one when recomputing), and per micro-batch the
  // input it read and the gradient of its output.
  std::vector<std::vector<MlpWorkspace>> workspaces(num_stages);
  std::vector<std::vector<std::vector<float>>> inputs(num_stages), grad_outputs(num_stages);
  for (size_t s = 0; s < num_stages; ++s) {
    const int64_t offset = RangeOffset(layout, stages[s]), count = RangeCount(layout, stages[s]);
    stage_params[s].assign(params.begin() + offset, params.begin() + offset + count);
    stage_grads[s].assign(static_cast<size_t>(count), -1.0f);  // overwritten by micro-batch 0
    for (int m = 0; m < (recompute ? 1 : micro_batches); ++m) {
      workspaces[s].push_back(*MlpWorkspace::Create(model, rows, kernels::CpuDevice(), stages[s]));
    }
    inputs[s].resize(static_cast<size_t>(micro_batches));
    grad_outputs[s].resize(static_cast<size_t>(micro_batches));
  }
  auto workspace = [&](size_t s, int m) -> MlpWorkspace& {
    return workspaces[s][recompute ? 0 : static_cast<size_t>(m)];
  };
  for (int m = 0; m < micro_batches; ++m) {
    const float* first = batch.x.data() + m * rows * kFeatures;
    inputs[0][static_cast<size_t>(m)].assign(first, first + rows * kFeatures);
    for (size_t s = 0; s < num_stages; ++s) {
      const std::vector<float>& in = inputs[s][static_cast<size_t>(m)];
      const float* out =
          model.Forward({}, stage_params[s].data(), in.data(), rows, workspace(s, m));
      if (s + 1 < num_stages) {
        const int64_t width = layout.layers[static_cast<size_t>(stages[s].last) - 1].out;
        inputs[s + 1][static_cast<size_t>(m)].assign(out, out + rows * width);
      }
    }
  }
  Result result;
  for (int m = 0; m < micro_batches; ++m) {
    for (size_t s = num_stages; s-- > 0;) {
      const std::vector<float>& in = inputs[s][static_cast<size_t>(m)];
      if (recompute) model.Forward({}, stage_params[s].data(), in.data(), rows, workspace(s, m));
      MlpModel::OutputGradient from;
      if (s + 1 == num_stages) {
        from.labels = batch.y.data() + m * rows;
        from.grad_scale = 1.0f / kRows;
        from.loss_sum = &result.loss_sum;
      } else {
        from.grad_output = grad_outputs[s][static_cast<size_t>(m)].data();
      }
      std::vector<float> grad_input;
      if (s > 0) {
        grad_input.resize(in.size());
      }
      model.Backward(
          {}, stage_params[s].data(), in.data(), rows, from, stage_grads[s].data(), workspace(s, m),
          [&](int backward_index) {
            if (ready_order != nullptr && m == 0) ready_order->push_back(backward_index);
          },
          /*accumulate=*/m > 0, s > 0 ? grad_input.data() : nullptr);
      if (s > 0) grad_outputs[s - 1][static_cast<size_t>(m)] = std::move(grad_input);
    }
  }
  result.grads.assign(params.size(), 0.0f);
  for (size_t s = 0; s < num_stages; ++s) {
    std::copy(stage_grads[s].begin(), stage_grads[s].end(),
              result.grads.begin() + RangeOffset(layout, stages[s]));
  }
  return result;
}

void ExpectSameGradients(const Result& expected, const Result& got, double tolerance) {
  ASSERT_EQ(expected.grads.size(), got.grads.size());
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    EXPECT_NEAR(got.grads[i], expected.grads[i], tolerance * (1 + std::fabs(expected.grads[i])))
        << "parameter " << i;
  }
  EXPECT_NEAR(got.loss_sum, expected.loss_sum, 1e-5 * std::fabs(expected.loss_sum));
}

using StageCase = std::tuple<ActivationType, Precision, std::vector<int>, int>;

class ModelStagesTest : public ::testing::TestWithParam<StageCase> {};

TEST_P(ModelStagesTest, StagesOverMicroBatchesEndWithTheWholeBatchGradient) {
  const auto& [activation, precision, bounds, micro_batches] = GetParam();
  MlpModel model = *MlpModel::Create(kFeatures, kHidden, kClasses, activation, precision);
  std::vector<float> params(static_cast<size_t>(model.layout().num_params));
  model.InitializeParameters(5, params.data());
  const Batch batch = MakeBatch();
  const Result whole = WholeBatch(model, params, batch);
  // Rows are independent through forward and backward; only the sums over rows (the weight
  // and bias gradients) are added in another order.
  ExpectSameGradients(whole, Pipelined(model, params, batch, Stages(bounds), micro_batches, false),
                      2e-6);
}

TEST_P(ModelStagesTest, RecomputingTheForwardGivesTheSameBits) {
  const auto& [activation, precision, bounds, micro_batches] = GetParam();
  MlpModel model = *MlpModel::Create(kFeatures, kHidden, kClasses, activation, precision);
  std::vector<float> params(static_cast<size_t>(model.layout().num_params));
  model.InitializeParameters(5, params.data());
  const Batch batch = MakeBatch();
  const Result kept = Pipelined(model, params, batch, Stages(bounds), micro_batches, false);
  const Result recomputed = Pipelined(model, params, batch, Stages(bounds), micro_batches, true);
  EXPECT_EQ(kept.grads, recomputed.grads);
  EXPECT_EQ(kept.loss_sum, recomputed.loss_sum);
}

std::string CaseName(const ::testing::TestParamInfo<StageCase>& info) {
  const auto& [activation, precision, bounds, micro_batches] = info.param;
  std::string name = activation == ActivationType::kRelu   ? "Relu"
                     : activation == ActivationType::kGelu ? "Gelu"
                                                           : "Tanh";
  name += precision == Precision::kBf16 ? "Bf16" : "Fp32";
  name += "Stages";
  for (size_t s = 0; s + 1 < bounds.size(); ++s) name += std::to_string(bounds[s + 1] - bounds[s]);
  return name + "Micro" + std::to_string(micro_batches);
}

INSTANTIATE_TEST_SUITE_P(
    Splits, ModelStagesTest,
    ::testing::Combine(::testing::Values(ActivationType::kRelu, ActivationType::kGelu,
                                         ActivationType::kTanh),
                       ::testing::Values(Precision::kFp32, Precision::kBf16),
                       ::testing::Values(std::vector<int>{0, 5}, std::vector<int>{0, 2, 5},
                                         std::vector<int>{0, 1, 3, 4, 5}),
                       ::testing::Values(1, 4)),
    CaseName);

TEST(ModelStagesTest, EachStageReportsItsLayersReadyInTheModelsBackwardOrder) {
  MlpModel model = *MlpModel::Create(kFeatures, kHidden, kClasses, ActivationType::kRelu);
  std::vector<float> params(static_cast<size_t>(model.layout().num_params));
  model.InitializeParameters(5, params.data());
  std::vector<int> order;
  Pipelined(model, params, MakeBatch(), Stages({0, 2, 5}), 2, false, &order);
  // The last stage (layers 2..4) finishes first; indices are the whole model's.
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ModelStagesTest, AStageOfNoRowsZeroesOnlyItsOwnGradients) {
  MlpModel model = *MlpModel::Create(kFeatures, kHidden, kClasses, ActivationType::kRelu);
  const LayerRange stage{1, 3};
  const int64_t count = RangeCount(model.layout(), stage);
  std::vector<float> params(static_cast<size_t>(count), 0.5f);
  // One float past the slice on each side: Backward must not touch them.
  std::vector<float> grads(static_cast<size_t>(count) + 2, 7.0f);
  MlpWorkspace workspace = *MlpWorkspace::Create(model, 4, kernels::CpuDevice(), stage);
  MlpModel::OutputGradient from;
  std::vector<float> grad_output(1);
  from.grad_output = grad_output.data();
  model.Backward({}, params.data(), nullptr, 0, from, grads.data() + 1, workspace, nullptr, false);
  EXPECT_EQ(grads.front(), 7.0f);
  EXPECT_EQ(grads.back(), 7.0f);
  for (int64_t i = 1; i <= count; ++i) EXPECT_EQ(grads[static_cast<size_t>(i)], 0.0f);
  EXPECT_EQ(count, model.layout().layers[1].num_params() + model.layout().layers[2].num_params());
}

TEST(ModelStagesTest, AWorkspaceOutsideTheModelIsRefused) {
  MlpModel model = *MlpModel::Create(kFeatures, kHidden, kClasses, ActivationType::kRelu);
  for (LayerRange range : {LayerRange{0, 6}, LayerRange{3, 3}, LayerRange{-1, 2}}) {
    auto workspace = MlpWorkspace::Create(model, 4, kernels::CpuDevice(), range);
    ASSERT_FALSE(workspace.ok());
    EXPECT_EQ(workspace.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(workspace.status().message().find("not a range of the model's 5 layers"),
              std::string::npos)
        << workspace.status();
  }
}

}  // namespace
}  // namespace lockstep::trainer
