#include "worker/trainer/training_state.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/rendezvous/kv_store.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace lockstep::trainer {
namespace {

constexpr int64_t kTimeoutMs = 20000;

// A member's state, recognisable by `tag` in every field.
TrainingState MakeState(int64_t step, float tag) {
  spec::OptimizerSpec optimizer_spec;
  TrainingState state = *MakeTrainingState(100, optimizer_spec, kernels::CpuDevice());
  state.step = step;
  state.cursor = DataCursor{step / 10, step % 10};
  state.samples = step * 64;
  state.loss_scale = 1024.0f * tag;
  state.loss_scale_good_steps = step;
  const std::vector<float> params(100, tag);
  EXPECT_TRUE(state.params.CopyFromHost(params.data(), 100).ok());
  // The CPU device's memory is host memory: the test writes the optimizer state directly.
  for (auto [buffer, count] : state.optimizer.StateBuffers()) {
    for (int64_t i = 0; i < count; ++i) buffer[i] = -tag;
  }
  state.optimizer.set_steps_taken(step);
  return state;
}

// Runs the agreement on `world` Gloo ranks in threads; returns each rank's source and state.
void RunAgreement(std::vector<TrainingState>& states, const std::vector<bool>& has_state,
                  std::vector<int>& sources) {
  const int world = static_cast<int>(states.size());
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  sources.assign(states.size(), -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.rank = rank;
      options.size = world;
      options.connect_timeout_ms = kTimeoutMs;
      auto communicator = comm::CreateGlooCommunicator(options, *store);
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      auto source = AgreeOnTrainingState(**communicator, has_state[static_cast<size_t>(rank)],
                                         states[static_cast<size_t>(rank)], kTimeoutMs);
      ASSERT_TRUE(source.ok()) << source.status();
      sources[static_cast<size_t>(rank)] = *source;
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST(AgreeOnTrainingStateTest, NewestStepWinsAndTiesGoToTheLowestRank) {
  std::vector<TrainingState> states;
  states.push_back(MakeState(3, 1.0f));
  states.push_back(MakeState(9, 2.0f));
  states.push_back(MakeState(9, 3.0f));
  std::vector<int> sources;
  RunAgreement(states, {true, true, true}, sources);
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    const TrainingState& state = states[static_cast<size_t>(rank)];
    EXPECT_EQ(sources[static_cast<size_t>(rank)], 1);
    EXPECT_EQ(state.step, 9);
    EXPECT_EQ(state.cursor, (DataCursor{0, 9}));
    EXPECT_EQ(state.samples, 9 * 64);
    EXPECT_EQ(state.loss_scale, 2048.0f);
    EXPECT_EQ(*state.params.ToHost(), std::vector<float>(100, 2.0f));
    auto buffers = const_cast<TrainingState&>(state).optimizer.StateBuffers();
    EXPECT_EQ(buffers[0].first[99], -2.0f);
    EXPECT_EQ(state.optimizer.steps_taken(), 9);
  }
}

TEST(AgreeOnTrainingStateTest, MemberWithoutStateReceivesItFromOneThatHasIt) {
  std::vector<TrainingState> states;
  states.push_back(MakeState(0, 0.0f));  // a newcomer: nothing in memory
  states.push_back(MakeState(42, 5.0f));
  std::vector<int> sources;
  RunAgreement(states, {false, true}, sources);
  EXPECT_EQ(sources, (std::vector<int>{1, 1}));
  EXPECT_EQ(states[0].step, 42);
  EXPECT_EQ(*states[0].params.ToHost(), std::vector<float>(100, 5.0f));
}

}  // namespace
}  // namespace lockstep::trainer
