// The Trainer with a pipeline of 2 stages x 2 replicas, its four ranks as threads of the test on
// shared memory, generation by generation as TrainingWorker drives them: a generation that ends
// in a step's commit, with one stage past it and the other before it, and a generation whose ranks
// are renumbered (each rank another stage than it holds), both end with the parameters of an
// undisturbed run, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous/host_placement.h"
#include "common/rendezvous/kv_store.h"
#include "worker/comm/communicator_factory.h"
#include "worker/trainer/pipeline_communicators.h"
#include "worker/trainer/random.h"
#include "worker/trainer/trainer.h"

namespace lockstep::trainer {
namespace {

constexpr int kStages = 2, kReplicas = 2, kWorld = kStages * kReplicas;
constexpr int64_t kSteps = 8;
constexpr int64_t kTimeoutMs = 30000;

Dataset MakeDataset(int64_t samples, int64_t features, int32_t classes, uint64_t seed) {
  Dataset data;
  data.num_samples = samples;
  data.num_features = features;
  data.num_classes = classes;
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < samples * features; ++i) data.features.push_back(rng.UniformFloat(-1, 1));
  for (int64_t i = 0; i < samples; ++i) {
    data.labels.push_back(static_cast<int32_t>(i % classes));
  }
  data.description = "synthetic";
  return data;
}

spec::TrainingJob MakeJob() {
  spec::TrainingJob job;
  job.metadata.name = "pipeline-test";
  job.spec.replicas = kWorld;
  spec::TrainerSpec trainer;
  trainer.model.hidden = {32, 24, 16};
  trainer.batch_size = 16;
  trainer.steps = kSteps;
  trainer.optimizer.learning_rate = 0.1;
  trainer.seed = 9;
  trainer.log_interval_steps = 2;
  trainer.pipeline.stages = kStages;
  trainer.pipeline.micro_batches = 4;
  job.spec.trainer = trainer;
  job.spec.elastic.min_replicas = job.spec.elastic.max_replicas = kWorld;
  return job;
}

std::vector<std::unique_ptr<Trainer>> MakeTrainers() {
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < kWorld; ++r) {
    DataSplits splits;
    splits.train = MakeDataset(512, 20, 5, 3);
    auto trainer = Trainer::Create(MakeJob(), std::move(splits), nullptr);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    trainers.push_back(std::move(trainer).value());
  }
  return trainers;
}

// A world communicator that forwards everything; on the n-th commit of its rank (the per-step
// all-reduce of two doubles), `on_commit` decides what the caller sees after it completed.
class WatchedCommunicator : public comm::Communicator {
 public:
  using CommitHook = std::function<Status(int commit)>;
  WatchedCommunicator(std::unique_ptr<comm::Communicator> inner, CommitHook on_commit)
      : inner_(std::move(inner)), on_commit_(std::move(on_commit)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                   int64_t timeout_ms) override {
    Status s = inner_->AllReduce(data, count, type, op, timeout_ms);
    if (!s.ok() || count != 2 || type != comm::DataType::kFloat64) return s;
    return on_commit_(commits_++);
  }
  Status ReduceScatter(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                       int64_t timeout_ms) override {
    return inner_->ReduceScatter(data, count, type, op, timeout_ms);
  }
  Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) override {
    return inner_->Broadcast(data, bytes, root, timeout_ms);
  }
  Status AllGather(const void* in, size_t bytes, void* out, int64_t timeout_ms) override {
    return inner_->AllGather(in, bytes, out, timeout_ms);
  }
  Status Barrier(int64_t timeout_ms) override { return inner_->Barrier(timeout_ms); }
  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv, size_t recv_bytes,
                  int recv_peer, int64_t timeout_ms) override {
    return inner_->SendRecv(send, send_bytes, send_peer, recv, recv_bytes, recv_peer, timeout_ms);
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  std::unique_ptr<comm::Communicator> inner_;
  CommitHook on_commit_;
  int commits_ = 0;
};

// One generation: trainer i is rank ranks[i]. Returns each trainer's Train status.
struct Generation {
  std::vector<Status> trained;
  std::vector<comm::Communicator*> communicators;  // every rank's world, pipe and group
  std::mutex mu;
  void AbortAll(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    for (comm::Communicator* c : communicators) c->Abort(why);
  }
};

void RunGeneration(
    std::vector<std::unique_ptr<Trainer>>& trainers, int64_t number, const std::vector<int>& ranks,
    const std::function<WatchedCommunicator::CommitHook(int rank, Generation&)>& hook_for,
    Generation& generation) {
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  generation.trained.assign(trainers.size(), OkStatus());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < trainers.size(); ++i) {
    threads.emplace_back([&, i] {
      const int rank = ranks[i];
      comm::CommunicatorOptions options;
      options.rank = rank;
      options.size = kWorld;
      options.placement = rendezvous::PlaceOnHosts(
          std::vector<std::string>(kWorld, "h"))[static_cast<size_t>(rank)];
      options.job_name = "pipeline-test";
      options.generation = number;
      options.connect_timeout_ms = kTimeoutMs;
      Status& result = generation.trained[i];
      auto inner = comm::CreateCommunicator(options, *store);
      if (!inner.ok()) {
        result = inner.status();
        return;
      }
      WatchedCommunicator world(
          std::move(inner).value(),
          hook_for ? hook_for(rank, generation) : [](int) { return OkStatus(); });
      auto pipeline = ConnectPipeline(world, *store, options, kStages, kTimeoutMs);
      if (!pipeline.ok()) {
        result = pipeline.status();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(generation.mu);
        generation.communicators.insert(generation.communicators.end(),
                                        {&world, pipeline->pipe.get(), pipeline->group.get()});
      }
      Trainer& trainer = *trainers[i];
      trainer.SetPipelineCommunicators(pipeline->pipe.get(), pipeline->group.get());
      const GenerationInfo info{number, rank, kWorld};
      result = trainer.AgreeOnState(world, info);
      std::atomic<bool> stop{false};
      if (result.ok()) result = trainer.Train(world, info, stop, nullptr);
      // Nobody may use a communicator another rank is done with.
      if (!result.ok()) generation.AbortAll("generation over");
      trainer.SetPipelineCommunicators(nullptr, nullptr);
      std::lock_guard<std::mutex> lock(generation.mu);
      for (comm::Communicator* mine : {static_cast<comm::Communicator*>(&world),
                                       pipeline->pipe.get(), pipeline->group.get()}) {
        auto& all = generation.communicators;
        all.erase(std::remove(all.begin(), all.end(), mine), all.end());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// The whole model from the ranks of replica 0 of the last generation (trainer i was rank
// ranks[i]).
std::vector<float> AssembledParameters(const std::vector<std::unique_ptr<Trainer>>& trainers,
                                       const std::vector<int>& ranks) {
  const ParameterLayout layout =
      MlpModel::Create(20, {32, 24, 16}, 5, kernels::ActivationType::kRelu)->layout();
  std::vector<float> params(static_cast<size_t>(layout.num_params));
  for (size_t i = 0; i < trainers.size(); ++i) {
    const PipelinePlace place = Trainer::PlaceInPipeline(ranks[i], kStages);
    if (place.replica != 0) continue;
    const LayerRange layers = trainers[i]->pipeline_plan().stages[static_cast<size_t>(place.stage)];
    std::vector<float> slice = *trainers[i]->state().params.ToHost();
    std::copy(slice.begin(), slice.end(), params.begin() + RangeOffset(layout, layers));
  }
  return params;
}

std::vector<float> Undisturbed() {
  std::vector<std::unique_ptr<Trainer>> trainers = MakeTrainers();
  Generation generation;
  const std::vector<int> ranks{0, 1, 2, 3};
  RunGeneration(trainers, 1, ranks, nullptr, generation);
  for (const Status& s : generation.trained) EXPECT_TRUE(s.ok()) << s;
  for (const auto& trainer : trainers) EXPECT_EQ(trainer->state().step, kSteps);
  return AssembledParameters(trainers, ranks);
}

// A job built in code must say how many replicas it has: the global batch is batchSize x
// replicas, and without them a step would train on one sample.
TEST(TrainerCreateTest, AJobWithoutReplicasIsRefusedNamingTheField) {
  spec::TrainingJob job = MakeJob();
  job.spec.replicas = 0;
  DataSplits splits;
  splits.train = MakeDataset(64, 20, 5, 3);
  auto trainer = Trainer::Create(job, std::move(splits), nullptr);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("spec.replicas: must be >= 1 (got 0)"),
            std::string::npos)
      << trainer.status();
}

TEST(TrainerPipelineTest, RanksThatMissedACommitOthersCompletedStepFromTheirHeldGradients) {
  const std::vector<float> undisturbed = Undisturbed();
  std::vector<std::unique_ptr<Trainer>> trainers = MakeTrainers();
  const std::vector<int> ranks{0, 1, 2, 3};
  // Generation 1: the commit of step 3 completes everywhere, but both replicas of stage 1
  // (ranks 1 and 3) are told it failed once stage 0's ranks returned from it; then the
  // generation ends, as a lost member ends it. No rank holds stage 1 at step 4: only its held
  // gradients can bring it there.
  constexpr int kMissedCommit = 3;
  std::atomic<int> completed{0};
  Generation first;
  RunGeneration(
      trainers, 1, ranks,
      [&](int rank, Generation& generation) -> WatchedCommunicator::CommitHook {
        return [&, rank](int commit) -> Status {
          if (commit != kMissedCommit) return OkStatus();
          if (rank % kStages == 0) {
            ++completed;
            return OkStatus();
          }
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (completed.load() < kReplicas && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
          }
          generation.AbortAll("a member was lost");
          return AbortedError("test: this rank missed the commit of step 3");
        };
      },
      first);
  EXPECT_EQ(completed.load(), kReplicas);
  for (int i = 0; i < kWorld; ++i) {
    EXPECT_EQ(trainers[static_cast<size_t>(i)]->state().step, i % kStages == 0 ? 4 : 3) << i;
  }

  Generation second;
  RunGeneration(trainers, 2, ranks, nullptr, second);
  for (const Status& s : second.trained) EXPECT_TRUE(s.ok()) << s;
  for (const auto& trainer : trainers) EXPECT_EQ(trainer->state().step, kSteps);
  EXPECT_EQ(AssembledParameters(trainers, ranks), undisturbed);
}

TEST(TrainerPipelineTest, RanksRenumberedIntoOtherStagesTakeThemFromTheirHolders) {
  const std::vector<float> undisturbed = Undisturbed();
  std::vector<std::unique_ptr<Trainer>> trainers = MakeTrainers();
  // Generation 1 ends after the commit of step 2 on every rank.
  Generation first;
  RunGeneration(
      trainers, 1, {0, 1, 2, 3},
      [&](int, Generation& generation) -> WatchedCommunicator::CommitHook {
        return [&](int commit) -> Status {
          if (commit == 2) {
            generation.AbortAll("a member left");
            return AbortedError("test: generation 1 ends");
          }
          return OkStatus();
        };
      },
      first);
  for (const auto& trainer : trainers) EXPECT_EQ(trainer->state().step, 2);
  // Generation 2: trainer i is rank (i + 1) % 4, so every trainer is now the other stage.
  const std::vector<int> renumbered{1, 2, 3, 0};
  Generation second;
  RunGeneration(trainers, 2, renumbered, nullptr, second);
  for (const Status& s : second.trained) EXPECT_TRUE(s.ok()) << s;
  for (const auto& trainer : trainers) EXPECT_EQ(trainer->state().step, kSteps);
  EXPECT_EQ(AssembledParameters(trainers, renumbered), undisturbed);
}

}  // namespace
}  // namespace lockstep::trainer
