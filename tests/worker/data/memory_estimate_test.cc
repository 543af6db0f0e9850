#include "worker/trainer/memory_estimate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "worker/trainer/model.h"

namespace lockstep::trainer {
namespace {

spec::TrainerSpec Mlp(std::vector<int32_t> hidden, int64_t batch_size,
                      spec::OptimizerType optimizer = spec::OptimizerType::kSgd) {
  spec::TrainerSpec trainer;
  trainer.model.hidden = std::move(hidden);
  trainer.batch_size = batch_size;
  trainer.optimizer.type = optimizer;
  return trainer;
}

const DataShape kFashion{60000, 10000, 784, 10};

TEST(MemoryEstimateTest, CountsTheParametersTheModelAllocates) {
  StatusOr<MlpModel> model = MlpModel::Create(784, {256, 128}, 10, kernels::ActivationType::kRelu);
  ASSERT_TRUE(model.ok()) << model.status();
  const MemoryEstimate estimate = EstimateRankMemory(Mlp({256, 128}, 64), kFashion);
  EXPECT_EQ(estimate.parameters, model->layout().num_params);
  // Parameters, gradients, the host copy and SGD's momentum: four floats a parameter.
  EXPECT_EQ(estimate.model_bytes, 4.0 * 4 * model->layout().num_params);
  EXPECT_EQ(estimate.data_bytes, 70000.0 * 785 * 4);
}

TEST(MemoryEstimateTest, AdamWKeepsTwoStateBuffersAndTheBatchScalesWithItsSize) {
  const MemoryEstimate sgd = EstimateRankMemory(Mlp({256}, 64), kFashion);
  const MemoryEstimate adamw = EstimateRankMemory(Mlp({256}, 64, spec::OptimizerType::kAdamW),
                                                  kFashion);
  EXPECT_EQ(adamw.model_bytes, sgd.model_bytes * 5 / 4);
  const MemoryEstimate big_batch = EstimateRankMemory(Mlp({256}, 640), kFashion);
  EXPECT_DOUBLE_EQ(big_batch.batch_bytes, 10 * sgd.batch_bytes);
}

// bf16 mixed precision keeps fp32 storage and adds the rounded copies the model reads: the
// parameters once, and a batch's features.
TEST(MemoryEstimateTest, Bf16AddsTheRoundedParametersAndFeatures) {
  spec::TrainerSpec mixed = Mlp({256}, 64);
  mixed.precision = spec::Precision::kBf16;
  const MemoryEstimate fp32 = EstimateRankMemory(Mlp({256}, 64), kFashion);
  const MemoryEstimate bf16 = EstimateRankMemory(mixed, kFashion);
  EXPECT_EQ(bf16.model_bytes, fp32.model_bytes * 5 / 4);
  EXPECT_DOUBLE_EQ(bf16.batch_bytes, fp32.batch_bytes + 64.0 * 784 * 4);
  EXPECT_EQ(bf16.data_bytes, fp32.data_bytes);
}

// Four equal hidden layers split in two stages: a rank holds about half the model, and its
// schedule decides how many micro-batches' activations it keeps.
TEST(MemoryEstimateTest, APipelineStageHoldsItsLayersAndTheActivationsItsScheduleKeeps) {
  spec::TrainerSpec trainer = Mlp({1024, 1024, 1024, 1024}, 256);
  const MemoryEstimate whole = EstimateRankMemory(trainer, kFashion);
  EXPECT_EQ(whole.stages, 1);
  trainer.pipeline.stages = 2;
  trainer.pipeline.micro_batches = 8;
  const MemoryEstimate one_f_one_b = EstimateRankMemory(trainer, kFashion);
  EXPECT_EQ(one_f_one_b.stages, 2);
  EXPECT_LT(one_f_one_b.parameters, whole.parameters * 0.6);
  EXPECT_GT(one_f_one_b.parameters, whole.parameters * 0.4);
  EXPECT_LT(one_f_one_b.model_bytes, whole.model_bytes * 0.6);
  EXPECT_EQ(EstimateRankMemoryWithoutPipeline(trainer, kFashion).total(), whole.total());
  EXPECT_NE(one_f_one_b.Describe().find("of 2: model"), std::string::npos)
      << one_f_one_b.Describe();
  // GPipe keeps all 8 micro-batches' activations; 1F1B at most 2 on the first stage.
  trainer.pipeline.schedule = spec::PipelineSchedule::kGpipe;
  const MemoryEstimate gpipe = EstimateRankMemory(trainer, kFashion);
  EXPECT_GT(gpipe.batch_bytes, 2 * one_f_one_b.batch_bytes);
  // Recompute keeps one workspace, and the micro-batches' inputs.
  trainer.pipeline.recompute = true;
  EXPECT_LT(EstimateRankMemory(trainer, kFashion).batch_bytes, gpipe.batch_bytes);
}

TEST(MemoryEstimateTest, AHostileWidthGivesAFiniteHugeEstimateNotAnOverflow) {
  const MemoryEstimate estimate = EstimateRankMemory(Mlp({2147483647, 2147483647}, 2147483647),
                                                     kFashion);
  EXPECT_TRUE(std::isfinite(estimate.total()));
  EXPECT_GT(estimate.total(), 1e18);
  EXPECT_GT(estimate.parameters, int64_t{4'000'000'000'000'000'000});
  EXPECT_NE(estimate.Describe().find("EiB"), std::string::npos) << estimate.Describe();
}

TEST(MemoryEstimateTest, FormatBytesPicksAReadableUnit) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(64.0 * 1024 * 1024), "64 MiB");
  EXPECT_EQ(FormatBytes(3.25 * 1024 * 1024 * 1024), "3.2 GiB");
}

}  // namespace
}  // namespace lockstep::trainer
