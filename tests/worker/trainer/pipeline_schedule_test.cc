#include "worker/trainer/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace lockstep::trainer {
namespace {

using Kind = PipelineAction::Kind;

// Runs every stage's schedule as the pipeline would: a stage runs its actions in order, each
// as soon as the stage is free and its input exists (the forward of m on stage s needs stage
// s-1's forward of m; the backward of m needs stage s+1's backward of m). Returns the step's
// length, or -1 when no stage can go on before all are done (a deadlock).
double Simulate(PipelineSchedule schedule, int stages, int micro_batches, double forward_cost,
                double backward_cost) {
  std::vector<std::vector<PipelineAction>> plans;
  for (int s = 0; s < stages; ++s) {
    plans.push_back(StageSchedule(schedule, stages, s, micro_batches));
  }
  constexpr double kNotYet = -1;
  std::vector<std::vector<double>> forward_done(stages,
                                                std::vector<double>(micro_batches, kNotYet));
  std::vector<std::vector<double>> backward_done = forward_done;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < plans[s].size()) {
        const PipelineAction action = plans[s][next[s]];
        const int m = action.micro_batch;
        double input;
        if (action.kind == Kind::kForward) {
          input = s == 0 ? 0 : forward_done[s - 1][m];
        } else {
          input = s == stages - 1 ? forward_done[s][m] : backward_done[s + 1][m];
          if (forward_done[s][m] == kNotYet) return -2;  // a backward before its forward
        }
        if (input == kNotYet) break;
        const double start = std::max(free_at[s], input);
        free_at[s] = start + (action.kind == Kind::kForward ? forward_cost : backward_cost);
        (action.kind == Kind::kForward ? forward_done : backward_done)[s][m] = free_at[s];
        ++next[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    if (next[s] < plans[s].size()) return -1;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(PipelineScheduleTest, EveryStageRunsEachMicroBatchForwardThenBackwardOnce) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages = 1; stages <= 5; ++stages) {
      for (int micro = 1; micro <= 9; ++micro) {
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(std::string(PipelineScheduleName(schedule)) +
                       " P=" + std::to_string(stages) + " M=" + std::to_string(micro) +
                       " s=" + std::to_string(s));
          const std::vector<PipelineAction> plan = StageSchedule(schedule, stages, s, micro);
          ASSERT_EQ(plan.size(), 2u * micro);
          std::vector<int> forwards(micro, 0), backwards(micro, 0);
          for (const PipelineAction& action : plan) {
            ASSERT_GE(action.micro_batch, 0);
            ASSERT_LT(action.micro_batch, micro);
            if (action.kind == Kind::kForward) {
              ++forwards[action.micro_batch];
            } else {
              EXPECT_EQ(forwards[action.micro_batch], 1) << "backward before forward";
              ++backwards[action.micro_batch];
            }
          }
          EXPECT_EQ(forwards, std::vector<int>(micro, 1));
          EXPECT_EQ(backwards, std::vector<int>(micro, 1));
        }
      }
    }
  }
}

// Point-to-point messages between two ranks match in the order they are sent, so stage s must
// send activations in the order stage s+1 runs its forwards, and stage s+1 send gradients in
// the order stage s runs its backwards.
TEST(PipelineScheduleTest, NeighbouringStagesPassMicroBatchesInTheSameOrder) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages = 2; stages <= 5; ++stages) {
      for (int micro = 1; micro <= 9; ++micro) {
        auto order = [&](int s, Kind kind) {
          std::vector<int> ms;
          for (const PipelineAction& a : StageSchedule(schedule, stages, s, micro)) {
            if (a.kind == kind) ms.push_back(a.micro_batch);
          }
          return ms;
        };
        for (int s = 0; s + 1 < stages; ++s) {
          EXPECT_EQ(order(s, Kind::kForward), order(s + 1, Kind::kForward));
          EXPECT_EQ(order(s, Kind::kBackward), order(s + 1, Kind::kBackward));
        }
      }
    }
  }
}

// Both schedules finish a step in (M + P - 1) x (forward + backward) with equal stage costs:
// the bubble is (P - 1) / (M + P - 1) of the step, and no stage ever waits forever.
TEST(PipelineScheduleTest, BothSchedulesFinishWithTheBubbleOfAFlushedPipeline) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int micro = 1; micro <= 12; ++micro) {
        SCOPED_TRACE(std::string(PipelineScheduleName(schedule)) + " P=" + std::to_string(stages) +
                     " M=" + std::to_string(micro));
        EXPECT_DOUBLE_EQ(Simulate(schedule, stages, micro, 1.0, 2.0), (micro + stages - 1) * 3.0);
      }
    }
  }
}

TEST(PipelineScheduleTest, OneFOneBHoldsAtMostOneMicroBatchPerLaterStageWhereGPipeHoldsThemAll) {
  constexpr int kStages = 4, kMicro = 16;
  for (int s = 0; s < kStages; ++s) {
    EXPECT_EQ(PeakActivationsHeld(StageSchedule(PipelineSchedule::kGPipe, kStages, s, kMicro)),
              kMicro);
    EXPECT_EQ(PeakActivationsHeld(StageSchedule(PipelineSchedule::k1F1B, kStages, s, kMicro)),
              kStages - s);
  }
  // Fewer micro-batches than stages: never more than there are.
  EXPECT_EQ(PeakActivationsHeld(StageSchedule(PipelineSchedule::k1F1B, 8, 0, 3)), 3);
}

TEST(PipelineScheduleTest, OneFOneBOnStageZeroOfFourFillsThenAlternates) {
  using A = PipelineAction;
  const std::vector<PipelineAction> expected = {
      {A::kForward, 0},  {A::kForward, 1},  {A::kForward, 2},  {A::kForward, 3},
      {A::kBackward, 0}, {A::kForward, 4},  {A::kBackward, 1}, {A::kForward, 5},
      {A::kBackward, 2}, {A::kBackward, 3}, {A::kBackward, 4}, {A::kBackward, 5}};
  EXPECT_EQ(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 6), expected);
}

TEST(BalanceStagesTest, EqualLayersSplitEvenlyAndAHeavyLayerStandsAlone) {
  EXPECT_EQ(*BalanceStages(std::vector<double>(8, 1.0), 4), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(*BalanceStages({1, 1, 1, 10, 1, 1}, 3), (std::vector<int>{0, 3, 4, 6}));
  EXPECT_EQ(*BalanceStages({5, 1, 1}, 1), (std::vector<int>{0, 3}));
  EXPECT_EQ(*BalanceStages({5, 1, 1}, 3), (std::vector<int>{0, 1, 2, 3}));
}

// The least possible cost of the costliest stage, by trying every split.
double BruteForce(const std::vector<double>& costs, int stages) {
  const int layers = static_cast<int>(costs.size());
  double best = 1e300;
  std::function<void(int, int, double)> split = [&](int from, int left, double worst) {
    if (left == 1) {
      double last = 0;
      for (int l = from; l < layers; ++l) last += costs[l];
      best = std::min(best, std::max(worst, last));
      return;
    }
    double stage = 0;
    for (int to = from + 1; to <= layers - (left - 1); ++to) {
      stage += costs[to - 1];
      split(to, left - 1, std::max(worst, stage));
    }
  };
  split(0, stages, 0);
  return best;
}

TEST(BalanceStagesTest, TheCostliestStageIsAsCheapAsAnySplitCanMakeIt) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> cost(0, 20), count(1, 8);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = count(random);
    std::vector<double> costs(layers);
    for (double& c : costs) c = cost(random);
    for (int stages = 1; stages <= layers; ++stages) {
      StatusOr<std::vector<int>> first = BalanceStages(costs, stages);
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_EQ(first->size(), static_cast<size_t>(stages + 1));
      EXPECT_EQ(first->front(), 0);
      EXPECT_EQ(first->back(), layers);
      double worst = 0;
      for (int s = 0; s < stages; ++s) {
        ASSERT_LT((*first)[s], (*first)[s + 1]) << "an empty stage";
        double stage = 0;
        for (int l = (*first)[s]; l < (*first)[s + 1]; ++l) stage += costs[l];
        worst = std::max(worst, stage);
      }
      EXPECT_DOUBLE_EQ(worst, BruteForce(costs, stages));
    }
  }
}

TEST(BalanceStagesTest, ImpossibleSplitsAreRefusedNamingWhy) {
  StatusOr<std::vector<int>> more = BalanceStages({1, 2, 3}, 4);
  EXPECT_EQ(more.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(more.status().message().find("cannot split 3 layers into 4 stages"), std::string::npos)
      << more.status();
  EXPECT_EQ(BalanceStages({1, 2}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(BalanceStages({1, -2}, 1).status().message().find("layer 1 has cost"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::trainer
