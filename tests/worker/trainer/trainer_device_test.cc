// The built-in trainer on a CUDA device against the same trainer on the CPU (label "gpu": every
// test skips where no CUDA device can be used, so CI builds and runs this binary and sees skips;
// scripts/gpu-check.sh runs it on a GPU machine).
//
// What only a GPU can show about the trainer: that the device layer's copies, streams and events
// order the work correctly (a race shows up as a mismatch against the CPU run), that the fp16
// overflow check reads device memory, that checkpoints move between device types, and that an
// NCCL generation can be aborted and replaced while the state stays on the GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "common/deadline.h"
#include "common/rendezvous/kv_store.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/communicator_factory.h"
#include "worker/trainer/checkpoint_state.h"
#include "worker/trainer/gradient_synchronizer.h"
#include "worker/trainer/random.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/training_checkpointer.h"

namespace lockstep::trainer {
namespace {

constexpr int64_t kTimeoutMs = 60000;

#define SKIP_WITHOUT_CUDA()                                          \
  do {                                                               \
    if (Status usable = kernels::CudaUsable(); !usable.ok()) {       \
      GTEST_SKIP() << "no usable CUDA device: " << usable.message(); \
    }                                                                \
  } while (0)

// A classification problem with structure to learn: the label is the index of the largest of
// the first `classes` features, plus noise features. Fresh for every seed.
Dataset MakeDataset(int64_t samples, int64_t features, int32_t classes, uint64_t seed) {
  Dataset data;
  data.num_samples = samples;
  data.num_features = features;
  data.num_classes = classes;
  data.features.resize(static_cast<size_t>(samples * features));
  data.labels.resize(static_cast<size_t>(samples));
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < samples; ++i) {
    float* row = data.features.data() + i * features;
    for (int64_t f = 0; f < features; ++f) row[f] = rng.UniformFloat(-1, 1);
    int32_t label = 0;
    for (int32_t c = 1; c < classes; ++c) {
      if (row[c] > row[label]) label = c;
    }
    data.labels[static_cast<size_t>(i)] = label;
  }
  data.description = "synthetic";
  return data;
}

spec::TrainingJob MakeJob(spec::Device device, spec::OptimizerType optimizer,
                          spec::Precision precision = spec::Precision::kFp32) {
  spec::TrainingJob job;
  job.metadata.name = "device-test";
  job.spec.replicas = 1;
  spec::TrainerSpec trainer;
  trainer.model.hidden = {128, 64};
  trainer.model.activation = spec::Activation::kGelu;
  trainer.batch_size = 32;
  trainer.steps = 200;
  trainer.optimizer.type = optimizer;
  trainer.optimizer.learning_rate = optimizer == spec::OptimizerType::kAdamW ? 1e-3 : 0.05;
  trainer.optimizer.momentum = 0.9;
  trainer.seed = 5;
  trainer.device = device;
  trainer.precision = precision;
  trainer.log_interval_steps = 20;
  job.spec.trainer = trainer;
  return job;
}

DataSplits MakeSplits() {
  DataSplits splits;
  splits.train = MakeDataset(4096, 48, 8, 101);
  splits.test = MakeDataset(1000, 48, 8, 202);
  return splits;
}

// A world of one on `trainer`'s device: NCCL on a GPU, shared memory on the CPU.
std::unique_ptr<comm::Communicator> OneRankCommunicator(Trainer& trainer,
                                                        rendezvous::KeyValueStore& store,
                                                        int64_t generation) {
  comm::CommunicatorOptions options;
  options.job_name = "device-test";
  options.generation = generation;
  options.connect_timeout_ms = kTimeoutMs;
  if (trainer.device().type() == kernels::DeviceType::kCuda) {
    options.cuda = true;
    options.cuda_stream = trainer.device().side().cuda_stream;
  }
  auto communicator = comm::CreateCommunicator(options, store);
  EXPECT_TRUE(communicator.ok()) << communicator.status();
  return communicator.ok() ? std::move(communicator).value() : nullptr;
}

struct RunOutcome {
  std::vector<float> params;
  double last_loss = 0;
  EvalResult eval;
};

RunOutcome TrainToTheEnd(const spec::TrainingJob& job) {
  auto trainer = Trainer::Create(job, MakeSplits(), nullptr);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  std::unique_ptr<comm::Communicator> comm = OneRankCommunicator(**trainer, *store, 1);
  const GenerationInfo info{1, 0, 1};
  EXPECT_TRUE((*trainer)->AgreeOnState(*comm, info).ok());
  std::atomic<bool> stop{false};
  RunOutcome outcome;
  Status trained = (*trainer)->Train(*comm, info, stop, [&](const TrainingProgress& progress) {
    outcome.last_loss = progress.loss;
  });
  EXPECT_TRUE(trained.ok()) << trained;
  EXPECT_EQ((*trainer)->state().step, job.spec.trainer->steps);
  auto eval = (*trainer)->Evaluate(*comm, info);
  EXPECT_TRUE(eval.ok()) << eval.status();
  if (eval.ok()) outcome.eval = *eval;
  outcome.params = *(*trainer)->state().params.ToHost();
  return outcome;
}

double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

class CudaTrainingTest
    : public ::testing::TestWithParam<std::tuple<spec::OptimizerType, spec::Precision>> {};

TEST_P(CudaTrainingTest, MatchesTheCpuRunWithinItsPrecisionsToleranceOver200Steps) {
  SKIP_WITHOUT_CUDA();
  const auto [optimizer, precision] = GetParam();
  const RunOutcome cpu = TrainToTheEnd(MakeJob(spec::Device::kCpu, optimizer, precision));
  const RunOutcome cuda = TrainToTheEnd(MakeJob(spec::Device::kCuda, optimizer, precision));
  ASSERT_EQ(cpu.params.size(), cuda.params.size());
  ASSERT_FALSE(cpu.params.empty());
  for (float value : cuda.params) ASSERT_TRUE(std::isfinite(value));
  // Same seed, same data order. fp32 everywhere (TF32 off): only summation order and expf/erf
  // differ, so 200 steps drift apart by rounding only. bf16: the GPU's GEMMs run on bf16 tensor
  // cores with the CPU's operands; a different fp32 sum now and then rounds to the neighbouring
  // bf16 (a relative 2^-8), so the runs drift further, but far less than a wrong operand or
  // rounding point would move them (order 1).
  const bool bf16 = precision == spec::Precision::kBf16;
  const double drift = RelativeDifference(cuda.params, cpu.params);
  EXPECT_LT(drift, bf16 ? 2e-2 : 1e-3) << "relative parameter difference after 200 steps";
  const double loss_tolerance = bf16 ? 2e-2 : 1e-3;
  EXPECT_NEAR(cuda.last_loss, cpu.last_loss, loss_tolerance * (1 + std::fabs(cpu.last_loss)));
  EXPECT_EQ(cuda.eval.samples, cpu.eval.samples);
  EXPECT_NEAR(cuda.eval.accuracy(), cpu.eval.accuracy(), bf16 ? 0.02 : 0.01);
  // And it learned: far above chance (1/8).
  EXPECT_GT(cuda.eval.accuracy(), 0.5);
  std::printf("%s: cpu: loss %.6f accuracy %.4f | cuda: loss %.6f accuracy %.4f | drift %.3g\n",
              bf16 ? "bf16" : "fp32", cpu.last_loss, cpu.eval.accuracy(), cuda.last_loss,
              cuda.eval.accuracy(), drift);
}

INSTANTIATE_TEST_SUITE_P(
    OptimizersAndPrecisions, CudaTrainingTest,
    ::testing::Combine(::testing::Values(spec::OptimizerType::kSgd, spec::OptimizerType::kAdamW),
                       ::testing::Values(spec::Precision::kFp32, spec::Precision::kBf16)));

// Stands for two ranks holding the same gradients, on device memory: the SUM is twice the data.
// Only the 16-bit reduction the synchronizer issues and the leave vote are needed.
class TwoReplicasOnDevice : public comm::Communicator {
 public:
  explicit TwoReplicasOnDevice(kernels::Device& device) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "two-replicas"; }
  Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp,
                   int64_t) override {
    if (type == comm::DataType::kInt64) return OkStatus();  // the leave vote (host memory)
    if (type != comm::DataType::kFloat16) return UnimplementedError("fp16 only");
    // The packing was queued on the side stream; the reduction reads it after it.
    device_.Synchronize(device_.side());
    std::vector<uint16_t> host(count);
    device_.CopyToHost(device_.side(), host.data(), data, count * sizeof(uint16_t));
    device_.Synchronize(device_.side());
    for (uint16_t& value : host) {
      value = kernels::FloatToFp16(kernels::Fp16ToFloat(value) + kernels::Fp16ToFloat(value));
    }
    device_.CopyToDevice(device_.side(), data, host.data(), count * sizeof(uint16_t));
    device_.Synchronize(device_.side());
    return OkStatus();
  }
  Status Broadcast(void*, size_t, int, int64_t) override { return OkStatus(); }
  Status AllGather(const void*, size_t, void*, int64_t) override {
    return UnimplementedError("not used");
  }
  Status Barrier(int64_t) override { return OkStatus(); }
  Status SendRecv(const void*, size_t, int, void*, size_t, int, int64_t) override {
    return UnimplementedError("not used by this test");
  }
  void Abort(const std::string&) override {}

 private:
  kernels::Device& device_;
};

TEST(CudaGradientSynchronizerTest, Fp16OverflowOnTheDeviceSkipsTheStepAndAFittingScaleDoesNot) {
  SKIP_WITHOUT_CUDA();
  auto device = kernels::CreateDevice(kernels::DeviceType::kCuda);
  ASSERT_TRUE(device.ok()) << device.status();
  TwoReplicasOnDevice comm(**device);
  const std::vector<GradientBucket> buckets{{0, 600, 0, 0}, {600, 424, 1, 1}};
  GradientSynchronizer sync(comm, **device, buckets, {spec::Compression::kFp16, kTimeoutMs});
  kernels::DeviceArray<float> grads;
  ASSERT_TRUE(grads.Allocate(**device, 1024).ok());
  SplitMix64 rng(9);
  std::vector<float> host(1024);
  for (float& value : host) value = rng.UniformFloat(-0.01f, 0.01f);

  // A scale that keeps every packed value finite: twice the gradients come back.
  ASSERT_TRUE(grads.CopyFromHost(host.data(), 1024).ok());
  sync.BeginStep(grads.device_data(), /*loss_scale=*/1024.0f);
  sync.OnLayerReady(0);
  sync.OnLayerReady(1);
  StepCommStats stats;
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_FALSE(stats.overflow);
  const std::vector<float> reduced = *grads.ToHost();
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_NEAR(reduced[i], 2 * host[i], 2e-3 * std::fabs(host[i]) + 1e-7) << i;
  }

  // 40000 x 1.0 packs to a finite fp16 (max 65504), but the sum of the two replicas, 80000,
  // does not: the unpacked gradient is infinite on the device.
  for (float& value : host) value = 1.0f;
  ASSERT_TRUE(grads.CopyFromHost(host.data(), 1024).ok());
  sync.BeginStep(grads.device_data(), /*loss_scale=*/40000.0f);
  sync.OnLayerReady(0);
  sync.OnLayerReady(1);
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_TRUE(stats.overflow) << "the sum 80000 overflows fp16: the step must be skipped";
}

// An asynchronous checkpoint on a GPU copies the state within the device at the step boundary
// and captures from the copy (TrainingCheckpointerOptions::device_copy): kernels the trainer
// queues right after the snapshot, which rewrite the state in place, must not reach the
// checkpoint. The state is large (4.5 M parameters, SGD momentum) so that the capture to the
// host takes long enough for them to run during it.
TEST(CudaCheckpointTest, AnAsynchronousCheckpointHoldsItsStepWhileTheNextStepsRewriteTheState) {
  SKIP_WITHOUT_CUDA();
  auto device = kernels::CreateDevice(kernels::DeviceType::kCuda);
  ASSERT_TRUE(device.ok()) << device.status();
  auto model = MlpModel::Create(1024, {2048, 1024}, 10, kernels::ActivationType::kRelu);
  ASSERT_TRUE(model.ok());
  const ParameterLayout& layout = model->layout();
  spec::TrainerSpec spec;
  spec.optimizer.type = spec::OptimizerType::kSgd;
  spec.optimizer.momentum = 0.9;
  auto state = MakeTrainingState(layout.num_params, spec.optimizer, **device);
  ASSERT_TRUE(state.ok());
  std::vector<float> ones(static_cast<size_t>(layout.num_params), 1.0f);
  ASSERT_TRUE(state->params.CopyFromHost(ones.data(), layout.num_params).ok());
  for (auto [buffer, count] : state->optimizer.StateBuffers()) {
    (*device)->CopyToDevice((*device)->compute(), buffer, ones.data(),
                            static_cast<size_t>(count) * sizeof(float));
  }
  (*device)->Synchronize((*device)->compute());
  state->step = 50;

  const std::string dir = ::testing::TempDir() + "/cuda-device-copy-" + std::to_string(::getpid());
  TrainingCheckpointerOptions options;
  options.checkpoint.uri = "file://" + dir;
  options.checkpoint.interval_steps = 50;
  options.checkpoint.async = true;  // device_copy: kAuto, on for a GPU
  auto checkpointer = TrainingCheckpointer::Create(options, spec, layout, nullptr);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  (*checkpointer)->BeginGeneration("g1-device-copy", 0, 1, *state);
  (*checkpointer)->SnapshotFinal(*state);
  (*checkpointer)->WaitForCapture();  // what the trainer calls before its next update
  // The next steps' updates: in place, on the compute stream, queued at once.
  for (int i = 0; i < 20; ++i) {
    kernels::Scale((*device)->compute(), layout.num_params, 3.0f, state->params.device_data());
    for (auto [buffer, count] : state->optimizer.StateBuffers()) {
      kernels::Scale((*device)->compute(), count, -2.0f, buffer);
    }
  }
  ASSERT_TRUE((*checkpointer)->WaitForFinal(Deadline::AfterMs(120000)).ok());

  auto restored = MakeTrainingState(layout.num_params, spec.optimizer, kernels::CpuDevice());
  ASSERT_TRUE(restored.ok());
  auto step = (*checkpointer)->Restore(*restored);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 50);
  // Held: a range-for over *ToHost() would read a vector its temporary StatusOr took with it.
  const StatusOr<std::vector<float>> params = restored->params.ToHost();
  ASSERT_TRUE(params.ok()) << params.status();
  for (float value : *params) ASSERT_EQ(value, 1.0f);
  for (auto [buffer, count] : restored->optimizer.StateBuffers()) {
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(buffer[i], 1.0f) << "momentum " << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(CudaCheckpointTest, StateWrittenOnCudaResumesOnCpuAndBackBitForBit) {
  SKIP_WITHOUT_CUDA();
  spec::TrainingJob job = MakeJob(spec::Device::kCuda, spec::OptimizerType::kAdamW);
  job.spec.trainer->steps = 30;
  auto trainer = Trainer::Create(job, MakeSplits(), nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  std::unique_ptr<comm::Communicator> comm = OneRankCommunicator(**trainer, *store, 1);
  const GenerationInfo info{1, 0, 1};
  ASSERT_TRUE((*trainer)->AgreeOnState(*comm, info).ok());
  std::atomic<bool> stop{false};
  ASSERT_TRUE((*trainer)->Train(*comm, info, stop, nullptr).ok());
  const TrainingState& trained = (*trainer)->state();
  const ParameterLayout& layout = (*trainer)->model().layout();
  const spec::TrainerSpec& spec = *job.spec.trainer;

  checkpoint::CheckpointState written_on_cuda;
  FillCheckpointState(trained, layout, spec, &written_on_cuda);
  auto on_cpu = MakeTrainingState(layout.num_params, spec.optimizer, kernels::CpuDevice());
  ASSERT_TRUE(on_cpu.ok());
  ASSERT_TRUE(RestoreFromCheckpointState(written_on_cuda, layout, spec, &*on_cpu).ok());
  EXPECT_EQ(on_cpu->step, 30);
  EXPECT_EQ(*on_cpu->params.ToHost(), *trained.params.ToHost());

  checkpoint::CheckpointState written_on_cpu;
  FillCheckpointState(*on_cpu, layout, spec, &written_on_cpu);
  auto device = kernels::CreateDevice(kernels::DeviceType::kCuda);
  ASSERT_TRUE(device.ok());
  auto back_on_cuda = MakeTrainingState(layout.num_params, spec.optimizer, **device);
  ASSERT_TRUE(back_on_cuda.ok());
  ASSERT_TRUE(RestoreFromCheckpointState(written_on_cpu, layout, spec, &*back_on_cuda).ok());
  EXPECT_EQ(*back_on_cuda->params.ToHost(), *trained.params.ToHost());
  ASSERT_EQ(written_on_cpu.tensors.size(), written_on_cuda.tensors.size());
  for (size_t k = 0; k < written_on_cpu.tensors.size(); ++k) {
    EXPECT_EQ(written_on_cpu.tensors[k].bytes, written_on_cuda.tensors[k].bytes)
        << written_on_cpu.tensors[k].name;
  }
}

TEST(CudaGenerationTest, AnAbortedNcclCommunicatorIsReplacedAndTrainingGoesOnFromDeviceState) {
  SKIP_WITHOUT_CUDA();
  spec::TrainingJob job = MakeJob(spec::Device::kCuda, spec::OptimizerType::kSgd);
  job.spec.trainer->steps = 60;
  auto trainer = Trainer::Create(job, MakeSplits(), nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  // Generation 1: train until step 20, then the generation ends (a peer was lost): abort.
  std::unique_ptr<rendezvous::KeyValueStore> first_store = rendezvous::NewInMemoryStore();
  std::unique_ptr<comm::Communicator> first = OneRankCommunicator(**trainer, *first_store, 1);
  ASSERT_EQ(first->backend(), "nccl");
  ASSERT_TRUE((*trainer)->AgreeOnState(*first, {1, 0, 1}).ok());
  std::atomic<bool> stop{false};
  Status trained =
      (*trainer)->Train(*first, {1, 0, 1}, stop, nullptr, [&](const TrainingState& state) {
        if (state.step == 20) first->Abort("peer lost");
        return OkStatus();
      });
  // The abort shows at the next collective (the loss all-reduce of step 40's log interval).
  EXPECT_FALSE(trained.ok());
  EXPECT_EQ(trained.code(), StatusCode::kAborted) << trained;
  const int64_t kept_step = (*trainer)->state().step;
  EXPECT_GE(kept_step, 20);
  double scalar = 1;
  EXPECT_EQ(
      first->AllReduce(&scalar, 1, comm::DataType::kFloat64, comm::ReduceOp::kSum, 1000).code(),
      StatusCode::kAborted);
  first.reset();

  // Generation 2: a fresh unique id in a fresh store; the state on the GPU is kept.
  std::unique_ptr<rendezvous::KeyValueStore> second_store = rendezvous::NewInMemoryStore();
  std::unique_ptr<comm::Communicator> second = OneRankCommunicator(**trainer, *second_store, 2);
  ASSERT_TRUE((*trainer)->AgreeOnState(*second, {2, 0, 1}).ok());
  EXPECT_EQ((*trainer)->state().step, kept_step);
  EXPECT_EQ((*trainer)->resumed_from_step(), -1) << "nothing was restored from a checkpoint";
  ASSERT_TRUE((*trainer)->Train(*second, {2, 0, 1}, stop, nullptr).ok());
  EXPECT_EQ((*trainer)->state().step, 60);
}

}  // namespace
}  // namespace lockstep::trainer
