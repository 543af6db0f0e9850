// Pipeline parallelism's plan, before any data moves: which layers each stage holds, and the
// order in which a stage runs its micro-batches' forward and backward passes in one step.
//
//   std::vector<double> costs = ...;  // per layer, e.g. FLOPs of forward and backward
//   LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int> first, BalanceStages(costs, 4));
//   // stage s holds layers [first[s], first[s + 1]), first.back() == costs.size()
//   for (const PipelineAction& action : StageSchedule(PipelineSchedule::k1F1B, 4, s, 8)) ...
//
// Schedules (both end the step with a flush: every micro-batch's backward is done before the
// optimizer step, so the result is that of one rank on the whole batch):
//  - GPipe (Huang et al., 2019): every micro-batch's forward, then every backward in reverse
//    order. A stage holds the activations of all M micro-batches at once.
//  - 1F1B (PipeDream-Flush, Narayanan et al., 2021; the schedule Megatron-LM runs): stage s of P
//    runs P - 1 - s forwards to fill the pipeline, then alternates one forward and one backward,
//    then drains the remaining backwards. A stage holds at most P - s micro-batches' activations,
//    whatever M is; the bubble is the same as GPipe's, (P - 1) / (M + P - 1) of the step with
//    equal stage costs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::trainer {

enum class PipelineSchedule { kGPipe, k1F1B };
const char* PipelineScheduleName(PipelineSchedule schedule);  // "gpipe" | "1f1b"

struct PipelineAction {
  enum Kind { kForward, kBackward };
  Kind kind;
  int micro_batch;
  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch;
  }
};

// The order in which stage `stage` of `stages` runs the forward and backward passes of
// micro-batches 0..micro_batches-1 in one step. Stage s's forward of m needs stage s-1's
// forward of m (its activations); its backward of m needs stage s+1's backward of m (the
// gradient of its output) and its own forward of m.
std::vector<PipelineAction> StageSchedule(PipelineSchedule schedule, int stages, int stage,
                                          int micro_batches);

// The most micro-batches whose activations a stage holds at once under `actions` (forwards
// done whose backward is not).
int PeakActivationsHeld(const std::vector<PipelineAction>& actions);

// Where each of `stages` contiguous stages begins in a model of `layer_costs.size()` layers, so
// that the costliest stage costs as little as possible (the pipeline runs at its slowest
// stage's pace); ties go to the split whose earlier stages are the larger. Returns stages + 1
// indices: stage s holds layers [first[s], first[s + 1]). INVALID_ARGUMENT for more stages than
// layers, fewer than one stage, or a negative cost.
StatusOr<std::vector<int>> BalanceStages(const std::vector<double>& layer_costs, int stages);

// Where each stage of spec.trainer.pipeline begins, as BalanceStages returns it, for a model of
// layers with `layer_ins[l]` inputs and `layer_outs[l]` outputs: its stageLayers, or stages that
// balance the layers' compute (3 x in x out multiply-adds per sample: the forward and backward
// GEMMs; bias, activation and messages are small beside them). INVALID_ARGUMENT naming the field
// for a split the model cannot have.
StatusOr<std::vector<int>> PipelineStageBoundaries(const spec::PipelineSpec& spec,
                                                   const std::vector<int64_t>& layer_ins,
                                                   const std::vector<int64_t>& layer_outs);

}  // namespace lockstep::trainer
