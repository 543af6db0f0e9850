// Pipeline stages on real communicators: every rank of a P-stage x D-replica job is a thread
// with two communicators of the backend under test (shared memory or Gloo over loopback): its
// pipeline's (the stages of one replica, for activations) and its stage's data-parallel group's
// (the same stage of every replica, for the gradient all-reduce). A few SGD steps end with the
// parameters one rank reaches training the whole global batch.
#include "worker/trainer/pipeline_stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/worker/comm/memory_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/prefixed_store.h"
#include "worker/comm/shm/shm_communicator.h"
#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

using kernels::ActivationType;

constexpr int64_t kFeatures = 12, kClasses = 5, kBatch = 8;  // kBatch: per replica
const std::vector<int32_t> kHidden{10, 9, 8, 7};             // 5 layers
constexpr int kSteps = 3;
constexpr float kLearningRate = 0.2f;
constexpr int64_t kTimeoutMs = 20000;

enum class Backend { kShm, kGloo };

StatusOr<std::unique_ptr<comm::Communicator>> Connect(Backend backend, int rank, int size,
                                                      rendezvous::KeyValueStore& store) {
  if (backend == Backend::kShm) {
    comm::ShmOptions options;
    options.rank = rank;
    options.size = size;
    options.job_name = "pipeline-test";
    options.connect_timeout_ms = kTimeoutMs;
    return comm::CreateShmCommunicator(options, store);
  }
  comm::GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.connect_timeout_ms = kTimeoutMs;
  return comm::CreateGlooCommunicator(options, store);
}

struct Data {
  std::vector<float> x;  // kSteps global batches of D * kBatch rows
  std::vector<int32_t> y;
};

Data MakeData(int replicas) {
  SplitMix64 rng(23);
  Data data;
  const int64_t rows = kSteps * replicas * kBatch;
  data.x.resize(static_cast<size_t>(rows * kFeatures));
  for (float& v : data.x) v = rng.UniformFloat(-2.0f, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    data.y.push_back(static_cast<int32_t>(rng.UniformFloat(0.0f, 1.0f) * kClasses) % kClasses);
  }
  return data;
}

MlpModel Model() { return *MlpModel::Create(kFeatures, kHidden, kClasses, ActivationType::kGelu); }

// One rank training the whole global batch with plain SGD.
std::vector<float> OneRank(const Data& data, int replicas, int64_t rows = kBatch) {
  MlpModel model = Model();
  std::vector<float> params(static_cast<size_t>(model.layout().num_params));
  model.InitializeParameters(3, params.data());
  const int64_t global = replicas * rows;
  MlpWorkspace workspace = *MlpWorkspace::Create(model, global, kernels::CpuDevice());
  std::vector<float> grads(params.size());
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    model.ForwardBackward({}, params.data(), data.x.data() + step * global * kFeatures,
                          data.y.data() + step * global, global, 1.0f / global, grads.data(),
                          workspace, nullptr, &loss);
    for (size_t i = 0; i < params.size(); ++i) params[i] -= kLearningRate * grads[i];
  }
  return params;
}

// Each rank's final slice of the parameters, by world rank (replica * stages + stage).
std::vector<std::vector<float>> Pipelined(Backend backend, const Data& data, int stages,
                                          int replicas, const PipelinePlan& plan,
                                          int64_t rows = kBatch,
                                          std::vector<StageStepTimes>* times = nullptr) {
  MlpModel model = Model();
  std::vector<float> initial(static_cast<size_t>(model.layout().num_params));
  model.InitializeParameters(3, initial.data());
  testing::MemoryKeyValueStore store;
  const int world = stages * replicas;
  std::vector<std::vector<float>> slices(static_cast<size_t>(world));
  std::vector<Status> results(static_cast<size_t>(world));
  if (times != nullptr) times->assign(static_cast<size_t>(world), {});
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      const int stage = rank % stages, replica = rank / stages;
      Status& result = results[static_cast<size_t>(rank)];
      comm::PrefixedStore pipe_store(store, "pipe/" + std::to_string(replica) + "/");
      comm::PrefixedStore group_store(store, "stage/" + std::to_string(stage) + "/");
      auto pipe = Connect(backend, stage, stages, pipe_store);
      auto group = Connect(backend, replica, replicas, group_store);
      if (!pipe.ok() || !group.ok()) {
        result = pipe.ok() ? group.status() : pipe.status();
        return;
      }
      auto runner = PipelineStage::Create(model, plan, stage, kBatch, kernels::CpuDevice());
      if (!runner.ok()) {
        result = runner.status();
        return;
      }
      const LayerRange layers = (*runner)->layers();
      const int64_t offset = RangeOffset(model.layout(), layers);
      std::vector<float> params(initial.begin() + offset,
                                initial.begin() + offset + RangeCount(model.layout(), layers));
      std::vector<float> grads(params.size());
      const int64_t global = replicas * rows;
      for (int step = 0; step < kSteps && result.ok(); ++step) {
        const int64_t first_row = step * global + replica * rows;
        double loss = 0;
        result = (*runner)->RunStep(
            **pipe, params.data(), data.x.data() + first_row * kFeatures, data.y.data() + first_row,
            rows, 1.0f / global, grads.data(), &loss, kTimeoutMs,
            times != nullptr ? &(*times)[static_cast<size_t>(rank)] : nullptr);
        if (!result.ok()) break;
        result = (*group)->AllReduce(grads.data(), grads.size(), comm::DataType::kFloat32,
                                     comm::ReduceOp::kSum, kTimeoutMs);
        for (size_t i = 0; i < params.size(); ++i) params[i] -= kLearningRate * grads[i];
      }
      slices[static_cast<size_t>(rank)] = std::move(params);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_TRUE(results[static_cast<size_t>(rank)].ok())
        << "rank " << rank << ": " << results[static_cast<size_t>(rank)];
  }
  return slices;
}

std::vector<LayerRange> EvenStages(int stages) {
  // 5 layers: 2 stages as [0, 3) [3, 5); 4 stages as [0, 2) [2, 3) [3, 4) [4, 5).
  std::vector<LayerRange> ranges;
  const int layers = static_cast<int>(kHidden.size()) + 1;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int size = layers / stages + (s < layers % stages ? 1 : 0);
    ranges.push_back({first, first + size});
    first += size;
  }
  return ranges;
}

// Every rank's slice (rank = replica * stages + stage) equals its part of `expected`, up to the
// reassociation of sums over micro-batches and replicas.
void ExpectSlicesOf(const std::vector<float>& expected,
                    const std::vector<std::vector<float>>& slices, const PipelinePlan& plan) {
  MlpModel model = Model();
  const size_t stages = plan.stages.size();
  for (size_t rank = 0; rank < slices.size(); ++rank) {
    const LayerRange layers = plan.stages[rank % stages];
    const int64_t offset = RangeOffset(model.layout(), layers);
    const std::vector<float>& slice = slices[rank];
    ASSERT_EQ(slice.size(), static_cast<size_t>(RangeCount(model.layout(), layers)));
    for (size_t i = 0; i < slice.size(); ++i) {
      const float want = expected[static_cast<size_t>(offset) + i];
      ASSERT_NEAR(slice[i], want, 1e-5 * (1 + std::fabs(want)))
          << "rank " << rank << ", parameter " << offset + static_cast<int64_t>(i);
    }
  }
}

// backend, stages, replicas, schedule, recompute, micro-batches
using PipelineCase = std::tuple<Backend, int, int, PipelineSchedule, bool, int>;

class PipelineEquivalenceTest : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(PipelineEquivalenceTest, StagesAndReplicasEndWithTheParametersOfOneRankOnTheGlobalBatch) {
  const auto& [backend, stages, replicas, schedule, recompute, micro_batches] = GetParam();
  const Data data = MakeData(replicas);
  PipelinePlan plan;
  plan.stages = EvenStages(stages);
  plan.micro_batches = micro_batches;
  plan.schedule = schedule;
  plan.recompute = recompute;
  const std::vector<float> expected = OneRank(data, replicas);
  const std::vector<std::vector<float>> slices = Pipelined(backend, data, stages, replicas, plan);
  ExpectSlicesOf(expected, slices, plan);
}

std::string CaseName(const ::testing::TestParamInfo<PipelineCase>& info) {
  const auto& [backend, stages, replicas, schedule, recompute, micro_batches] = info.param;
  return std::string(backend == Backend::kShm ? "Shm" : "Gloo") + std::to_string(stages) +
         "Stages" + std::to_string(replicas) + "Replicas" +
         (schedule == PipelineSchedule::kGPipe ? "GPipe" : "1F1B") +
         (recompute ? "Recompute" : "") + std::to_string(micro_batches) + "Micro";
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineEquivalenceTest,
                         ::testing::Combine(::testing::Values(Backend::kShm, Backend::kGloo),
                                            ::testing::Values(2, 4), ::testing::Values(1, 2),
                                            ::testing::Values(PipelineSchedule::kGPipe,
                                                              PipelineSchedule::k1F1B),
                                            ::testing::Bool(), ::testing::Values(1, 4, 8)),
                         CaseName);

TEST(PipelineStageTest, AShortBatchSplitsIntoUnevenMicroBatchesAndStillMatches) {
  // The last batch of an epoch: 7 samples in 4 micro-batches of 2, 2, 2 and 1; and 3 samples,
  // whose last micro-batch is empty (its messages carry no bytes).
  for (const int64_t rows : {7, 3}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const Data data = MakeData(2);
    PipelinePlan plan;
    plan.stages = EvenStages(2);
    plan.micro_batches = 4;
    plan.schedule = rows == 7 ? PipelineSchedule::k1F1B : PipelineSchedule::kGPipe;
    const std::vector<float> expected = OneRank(data, 2, rows);
    std::vector<StageStepTimes> times;
    const std::vector<std::vector<float>> slices =
        Pipelined(Backend::kShm, data, 2, 2, plan, rows, &times);
    ExpectSlicesOf(expected, slices, plan);
    // Stage 0's output and stage 1's input gradient are both `rows` rows of layer 2's 8 outputs.
    for (const StageStepTimes& stage : times) {
      EXPECT_EQ(stage.bytes_sent, rows * 8 * static_cast<int64_t>(sizeof(float)));
      EXPECT_GT(stage.compute_seconds, 0);
    }
  }
}

// The stage group's all-reduce overlaps the step's last backward: each layer is reported once,
// in backward order, when its gradient is final.
TEST(PipelineStageTest, TheLastBackwardReportsEachLayerOnceWithItsFinalGradient) {
  MlpModel model = Model();
  PipelinePlan plan;
  plan.stages = {{0, 5}};  // one stage: every action is this rank's
  plan.micro_batches = 4;
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    plan.schedule = schedule;
    auto stage = PipelineStage::Create(model, plan, 0, kBatch, kernels::CpuDevice());
    ASSERT_TRUE(stage.ok()) << stage.status();
    testing::MemoryKeyValueStore store;
    auto alone = Connect(Backend::kShm, 0, 1, store);
    ASSERT_TRUE(alone.ok()) << alone.status();
    const Data data = MakeData(1);
    std::vector<float> params(static_cast<size_t>(model.layout().num_params));
    model.InitializeParameters(3, params.data());
    std::vector<float> grads(params.size());
    std::vector<int> reported;
    std::vector<std::vector<float>> at_report;
    double loss = 0;
    Status s = (*stage)->RunStep(
        **alone, params.data(), data.x.data(), data.y.data(), kBatch, 1.0f / kBatch, grads.data(),
        &loss, kTimeoutMs, nullptr, [&](int backward_layer) {
          reported.push_back(backward_layer);
          const LayerLayout& layer =
              model.layout()
                  .layers[static_cast<size_t>(model.layout().ForwardIndex(backward_layer))];
          at_report.emplace_back(grads.begin() + layer.weight_offset,
                                 grads.begin() + layer.weight_offset + layer.num_params());
        });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(reported, (std::vector<int>{0, 1, 2, 3, 4}));
    for (size_t i = 0; i < reported.size(); ++i) {
      const LayerLayout& layer =
          model.layout().layers[static_cast<size_t>(model.layout().ForwardIndex(reported[i]))];
      EXPECT_EQ(at_report[i],
                std::vector<float>(grads.begin() + layer.weight_offset,
                                   grads.begin() + layer.weight_offset + layer.num_params()))
          << "layer " << reported[i];
    }
  }
}

TEST(PipelineStageTest, OneFOneBHoldsFewerActivationsThanGPipe) {
  MlpModel model = Model();
  PipelinePlan plan;
  plan.stages = EvenStages(4);
  plan.micro_batches = 8;
  for (int stage = 0; stage < 4; ++stage) {
    plan.schedule = PipelineSchedule::kGPipe;
    auto gpipe = PipelineStage::Create(model, plan, stage, 16, kernels::CpuDevice());
    plan.schedule = PipelineSchedule::k1F1B;
    auto one_f_one_b = PipelineStage::Create(model, plan, stage, 16, kernels::CpuDevice());
    ASSERT_TRUE(gpipe.ok() && one_f_one_b.ok());
    EXPECT_EQ((*gpipe)->activation_slots(), 8);
    EXPECT_EQ((*one_f_one_b)->activation_slots(), 4 - stage);
  }
}

TEST(PipelineStageTest, APlanThatDoesNotCoverTheModelIsRefused) {
  MlpModel model = Model();
  for (const std::vector<LayerRange>& stages :
       {std::vector<LayerRange>{{0, 2}, {3, 5}}, std::vector<LayerRange>{{0, 2}, {2, 4}},
        std::vector<LayerRange>{{0, 3}, {3, 3}, {3, 5}}, std::vector<LayerRange>{}}) {
    PipelinePlan plan;
    plan.stages = stages;
    auto stage = PipelineStage::Create(model, plan, 0, kBatch, kernels::CpuDevice());
    ASSERT_FALSE(stage.ok());
    EXPECT_NE(stage.status().message().find("cover the model's 5 layers"), std::string::npos)
        << stage.status();
  }
  PipelinePlan plan;
  plan.stages = EvenStages(2);
  plan.micro_batches = 9;
  auto stage = PipelineStage::Create(model, plan, 0, kBatch, kernels::CpuDevice());
  ASSERT_FALSE(stage.ok());
  EXPECT_NE(stage.status().message().find("9 micro-batches of a batch of 8"), std::string::npos)
      << stage.status();
}

TEST(PipelineStageTest, ACommunicatorThatIsNotThePipelinesIsRefused) {
  MlpModel model = Model();
  PipelinePlan plan;
  plan.stages = EvenStages(2);
  auto stage = PipelineStage::Create(model, plan, 1, kBatch, kernels::CpuDevice());
  ASSERT_TRUE(stage.ok());
  testing::MemoryKeyValueStore store;
  auto alone = Connect(Backend::kGloo, 0, 1, store);
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::vector<float> params(static_cast<size_t>(RangeCount(model.layout(), (*stage)->layers())));
  std::vector<float> grads(params.size());
  double loss = 0;
  Status s = (*stage)->RunStep(**alone, params.data(), nullptr, nullptr, kBatch, 1.0f, grads.data(),
                               &loss, kTimeoutMs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("stage 1 of 2 given a communicator of rank 0 of 1"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace lockstep::trainer
