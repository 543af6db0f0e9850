// TrainingCheckpointer's asynchronous snapshots (worker/trainer/training_checkpointer.h): what a
// checkpoint holds when the trainer changes its state right after the step it was taken at, with
// the state's copy on its device (what a GPU uses) and without it (the CPU's default).
#include "worker/trainer/training_checkpointer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "kernels/device.h"
#include "worker/trainer/model.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {
namespace {

using DeviceCopy = TrainingCheckpointerOptions::DeviceCopy;

class TrainingCheckpointerTest : public ::testing::TestWithParam<DeviceCopy> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("training-checkpointer-" + std::to_string(::getpid()) + "-" +
            std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(dir_);
    spec_.optimizer.type = spec::OptimizerType::kSgd;
    spec_.optimizer.momentum = 0.9;
    auto model = MlpModel::Create(6, {5}, 3, kernels::ActivationType::kRelu);
    ASSERT_TRUE(model.ok()) << model.status();
    layout_ = model->layout();
    auto device = kernels::CreateDevice(kernels::DeviceType::kCpu);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<TrainingCheckpointer> Checkpointer() {
    TrainingCheckpointerOptions options;
    options.checkpoint.uri = "file://" + dir_.string();
    options.checkpoint.interval_steps = 10;
    options.checkpoint.keep = 3;
    options.checkpoint.async = true;
    options.device_copy = GetParam();
    auto checkpointer = TrainingCheckpointer::Create(options, spec_, layout_, nullptr);
    EXPECT_TRUE(checkpointer.ok()) << checkpointer.status();
    return checkpointer.ok() ? std::move(checkpointer).value() : nullptr;
  }

  TrainingState State() {
    auto state = MakeTrainingState(layout_.num_params, spec_.optimizer, *device_);
    EXPECT_TRUE(state.ok()) << state.status();
    return std::move(state).value();
  }

  // Every parameter and momentum value `value`, and the trainer's fields from `step`.
  void Fill(TrainingState& state, float value, int64_t step) {
    std::vector<float> host(static_cast<size_t>(layout_.num_params), value);
    ASSERT_TRUE(state.params.CopyFromHost(host.data(), layout_.num_params).ok());
    for (auto [buffer, count] : state.optimizer.StateBuffers()) {
      std::vector<float> momentum(static_cast<size_t>(count), -value);
      device_->CopyToDevice(device_->compute(), buffer, momentum.data(),
                            momentum.size() * sizeof(float));
    }
    device_->Synchronize(device_->compute());
    state.step = step;
    state.samples = step * 64;
    state.cursor = DataCursor{step / 100, step % 100};
    state.optimizer.set_steps_taken(step);
  }

  std::filesystem::path dir_;
  spec::TrainerSpec spec_;
  ParameterLayout layout_;
  std::unique_ptr<kernels::Device> device_;
};

TEST_P(TrainingCheckpointerTest, ACheckpointHoldsItsStepsStateWhateverTheTrainerDoesNext) {
  TrainingState state = State();
  Fill(state, 1.5f, 40);
  auto checkpointer = Checkpointer();
  checkpointer->BeginGeneration("g1-test", /*rank=*/0, /*world_size=*/1, state);
  checkpointer->SnapshotFinal(state);
  // What the trainer does before its next optimizer update: with the device copy this returns
  // at once, without it, once the capture has read the state.
  checkpointer->WaitForCapture();
  Fill(state, -7.0f, 41);
  ASSERT_TRUE(checkpointer->WaitForFinal(Deadline::AfterMs(30000)).ok());
  EXPECT_EQ(checkpointer->last_checkpoint_step(), 40);

  TrainingState restored = State();
  auto step = checkpointer->Restore(restored);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 40);
  EXPECT_EQ(restored.step, 40);
  EXPECT_EQ(restored.samples, 40 * 64);
  EXPECT_EQ(restored.optimizer.steps_taken(), 40);
  auto params = restored.params.ToHost();
  ASSERT_TRUE(params.ok());
  for (float value : *params) ASSERT_EQ(value, 1.5f);
  for (auto [buffer, count] : restored.optimizer.StateBuffers()) {
    std::vector<float> momentum(static_cast<size_t>(count));
    device_->CopyToHost(device_->compute(), momentum.data(), buffer,
                        momentum.size() * sizeof(float));
    device_->Synchronize(device_->compute());
    for (float value : momentum) ASSERT_EQ(value, -1.5f);
  }
}

TEST_P(TrainingCheckpointerTest, SnapshotsOfSuccessiveStepsEachHoldTheirOwnState) {
  TrainingState state = State();
  auto checkpointer = Checkpointer();
  checkpointer->BeginGeneration("g1-test", 0, 1, state);
  for (int64_t step : {10, 20, 30}) {
    Fill(state, static_cast<float>(step), step);
    checkpointer->SnapshotFinal(state);
    checkpointer->WaitForCapture();
    Fill(state, -1.0f, step + 1);  // the next step's update, at once
    ASSERT_TRUE(checkpointer->WaitForFinal(Deadline::AfterMs(30000)).ok());
  }
  TrainingState restored = State();
  ASSERT_TRUE(checkpointer->Restore(restored).ok());
  EXPECT_EQ(restored.step, 30);
  auto params = restored.params.ToHost();
  ASSERT_TRUE(params.ok());
  for (float value : *params) ASSERT_EQ(value, 30.0f);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutTheDeviceCopy, TrainingCheckpointerTest,
                         ::testing::Values(DeviceCopy::kAlways, DeviceCopy::kNever),
                         [](const ::testing::TestParamInfo<DeviceCopy>& info) {
                           return info.param == DeviceCopy::kAlways ? "DeviceCopy"
                                                                    : "StateDirectly";
                         });

}  // namespace
}  // namespace lockstep::trainer
