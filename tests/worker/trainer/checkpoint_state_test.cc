#include "worker/trainer/checkpoint_state.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/storage/storage.h"
#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

namespace fs = std::filesystem;

spec::TrainerSpec AdamWSpec() {
  spec::TrainerSpec spec;
  spec.seed = 11;
  spec.optimizer.type = spec::OptimizerType::kAdamW;
  return spec;
}

// A state in which every field holds a value a fresh state would not.
TrainingState DistinctState(const spec::TrainerSpec& spec, const ParameterLayout& layout,
                            uint64_t seed) {
  TrainingState state = *MakeTrainingState(layout.num_params, spec.optimizer, kernels::CpuDevice());
  state.step = 1234;
  state.cursor = DataCursor{3, 77};
  state.samples = 98765;
  state.loss_scale = 512.0f;
  state.loss_scale_good_steps = 17;
  SplitMix64 rng(seed);
  std::vector<float> params(static_cast<size_t>(layout.num_params));
  for (float& value : params) value = rng.UniformFloat(-1, 1);
  EXPECT_TRUE(state.params.CopyFromHost(params.data(), layout.num_params).ok());
  // The CPU device's memory is host memory: the test writes the optimizer state directly.
  for (auto [buffer, count] : state.optimizer.StateBuffers()) {
    for (int64_t i = 0; i < count; ++i) buffer[i] = rng.UniformFloat(-1, 1);
  }
  state.optimizer.set_steps_taken(1230);
  state.sample_counts.resize(100);
  for (int32_t& count : state.sample_counts) count = static_cast<int32_t>(rng.Next() % 2);
  return state;
}

TEST(CheckpointStateTest, SavedAndLoadedStateIsIdenticalToTheTrainersState) {
  const spec::TrainerSpec spec = AdamWSpec();
  auto model = MlpModel::Create(20, {16, 8}, 4, kernels::ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  const ParameterLayout& layout = model->layout();
  const TrainingState saved = DistinctState(spec, layout, 1);

  std::string pattern = (fs::temp_directory_path() / "lockstep-ckptstate-XXXXXX").string();
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  const std::string root = pattern + "/ckpt";
  auto storage = checkpoint::OpenStorage("file://" + root, {});
  ASSERT_TRUE(storage.ok());
  checkpoint::CheckpointState written;
  FillCheckpointState(saved, layout, spec, &written);
  // Two ranks write their shards; rank 0 commits.
  checkpoint::CheckpointWriter rank1(**storage, root, 1, 2, {});
  ASSERT_TRUE(rank1.Write(written, Deadline::AfterMs(20000)).ok());
  checkpoint::CheckpointWriter rank0(**storage, root, 0, 2, {});
  ASSERT_TRUE(rank0.Write(written, Deadline::AfterMs(20000)).ok());

  auto loaded = checkpoint::LoadNewestValid(**storage, root, Deadline::AfterMs(20000));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  TrainingState restored = DistinctState(spec, layout, 2);  // every value different
  restored.step = 0;
  restored.cursor = DataCursor{};
  ASSERT_TRUE(RestoreFromCheckpointState(loaded->state, layout, spec, &restored).ok());

  EXPECT_EQ(restored.step, saved.step);
  EXPECT_EQ(restored.cursor, saved.cursor);
  EXPECT_EQ(restored.samples, saved.samples);
  EXPECT_EQ(restored.loss_scale, saved.loss_scale);
  EXPECT_EQ(restored.loss_scale_good_steps, saved.loss_scale_good_steps);
  EXPECT_EQ(*restored.params.ToHost(), *saved.params.ToHost());
  EXPECT_EQ(restored.optimizer.steps_taken(), saved.optimizer.steps_taken());
  const auto saved_buffers = saved.optimizer.StateBuffers();
  const auto restored_buffers = std::as_const(restored.optimizer).StateBuffers();
  ASSERT_EQ(saved_buffers.size(), 2u);
  ASSERT_EQ(restored_buffers.size(), 2u);
  for (size_t k = 0; k < saved_buffers.size(); ++k) {
    EXPECT_EQ(std::vector<float>(saved_buffers[k].first,
                                 saved_buffers[k].first + saved_buffers[k].second),
              std::vector<float>(restored_buffers[k].first,
                                 restored_buffers[k].first + restored_buffers[k].second));
  }
  EXPECT_EQ(restored.sample_counts, saved.sample_counts);
  EXPECT_EQ(loaded->state.rng_state, "splitmix64 seed=11");
  fs::remove_all(pattern);
}

// Two MLPs that differ in their hidden width, and a checkpoint of the small one (AdamW).
class AnotherModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(small.ok() && large.ok());
    FillCheckpointState(DistinctState(spec, small->layout(), 1), small->layout(), spec, &written);
  }
  const spec::TrainerSpec spec = AdamWSpec();
  StatusOr<MlpModel> small = MlpModel::Create(20, {16}, 4, kernels::ActivationType::kRelu);
  StatusOr<MlpModel> large = MlpModel::Create(20, {32}, 4, kernels::ActivationType::kRelu);
  checkpoint::CheckpointState written;
};

TEST_F(AnotherModelTest, CheckpointOfAnotherModelIsRefusedNamingTheTensor) {
  TrainingState other = DistinctState(spec, large->layout(), 2);
  const std::vector<float> before = *other.params.ToHost();
  Status status = RestoreFromCheckpointState(written, large->layout(), spec, &other);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("layers.1.weight"), std::string::npos) << status;
  EXPECT_EQ(*other.params.ToHost(), before);  // nothing changed
}

TEST_F(AnotherModelTest, ManifestOfAnotherModelOrOptimizerDoesNotFitNamingTheDifference) {
  const checkpoint::Manifest manifest = checkpoint::BuildManifest(written, 1, false);

  EXPECT_TRUE(
      CheckpointFitsModel(manifest, DistinctState(spec, small->layout(), 2), small->layout()).ok());

  Status larger =
      CheckpointFitsModel(manifest, DistinctState(spec, large->layout(), 2), large->layout());
  EXPECT_EQ(larger.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(larger.message().find("tensor layers.1.weight is f32[4,16], this model's f32[4,32]"),
            std::string::npos)
      << larger;

  spec::TrainerSpec sgd = spec;
  sgd.optimizer.type = spec::OptimizerType::kSgd;
  Status optimizer =
      CheckpointFitsModel(manifest, DistinctState(sgd, small->layout(), 2), small->layout());
  EXPECT_EQ(optimizer.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(optimizer.message().find("holds adamw optimizer state"), std::string::npos)
      << optimizer;
}

TEST(CheckpointStateTest, StagesCheckpointTheWholeStateBetweenThemEachItsLayersByName) {
  const spec::TrainerSpec spec = AdamWSpec();
  auto model = MlpModel::Create(20, {16, 12, 8}, 4, kernels::ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  const ParameterLayout& layout = model->layout();
  const TrainingState whole = DistinctState(spec, layout, 3);
  checkpoint::CheckpointState written;
  FillCheckpointState(whole, layout, spec, &written);

  // Two stages: layers 0..1 and 2..3. Each stage's state is its slice of the whole one.
  const std::vector<LayerRange> stages = {{0, 2}, {2, 4}};
  std::map<std::string, std::vector<uint8_t>> by_stage;
  for (int s = 0; s < 2; ++s) {
    const LayerRange layers = stages[static_cast<size_t>(s)];
    const int64_t offset = RangeOffset(layout, layers), count = RangeCount(layout, layers);
    TrainingState stage = *MakeTrainingState(count, spec.optimizer, kernels::CpuDevice());
    stage.samples = whole.samples;
    stage.loss_scale = whole.loss_scale;
    stage.loss_scale_good_steps = whole.loss_scale_good_steps;
    stage.sample_counts = whole.sample_counts;
    std::vector<float> slice = *whole.params.ToHost();
    ASSERT_TRUE(stage.params.CopyFromHost(slice.data() + offset, count).ok());
    const auto from = whole.optimizer.StateBuffers();
    const auto to = stage.optimizer.StateBuffers();
    for (size_t k = 0; k < from.size(); ++k) {
      std::copy(from[k].first + offset, from[k].first + offset + count, to[k].first);
    }
    checkpoint::CheckpointState part;
    FillCheckpointState(stage, layout, spec, &part, nullptr, StageScope(stages, s));
    // What the stage fills is what every rank computes its table to be.
    const std::vector<checkpoint::TensorEntry> table =
        CheckpointTable(layout, StageScope(stages, s), stage.optimizer,
                        static_cast<int64_t>(stage.sample_counts.size()));
    ASSERT_EQ(part.tensors.size(), table.size());
    for (size_t k = 0; k < table.size(); ++k) {
      EXPECT_EQ(part.tensors[k].name, table[k].name);
      EXPECT_EQ(part.tensors[k].shape, table[k].shape);
      EXPECT_EQ(static_cast<int64_t>(part.tensors[k].bytes.size()), table[k].bytes);
      EXPECT_TRUE(by_stage.emplace(part.tensors[k].name, part.tensors[k].bytes).second)
          << part.tensors[k].name << " in two stages";
    }
    // Only stage 0 holds the trainer's own tensors.
    const bool has_samples = std::any_of(part.tensors.begin(), part.tensors.end(),
                                         [](const auto& t) { return t.name == "trainer/samples"; });
    EXPECT_EQ(has_samples, s == 0);

    // And a stage restores its layers from the whole model's checkpoint.
    TrainingState restored = *MakeTrainingState(count, spec.optimizer, kernels::CpuDevice());
    ASSERT_TRUE(
        RestoreFromCheckpointState(written, layout, spec, &restored, StageScope(stages, s)).ok());
    EXPECT_EQ(*restored.params.ToHost(), *stage.params.ToHost());
    EXPECT_EQ(restored.step, whole.step);
  }
  // Between them, the stages hold every tensor of the whole state, byte for byte.
  ASSERT_EQ(by_stage.size(), written.tensors.size());
  for (const checkpoint::NamedTensor& tensor : written.tensors) {
    EXPECT_EQ(by_stage[tensor.name], tensor.bytes) << tensor.name;
  }
}

}  // namespace
}  // namespace lockstep::trainer
