// TrainingState: everything a worker must hold to continue training from a step, and the
// protocol by which the members of a new generation agree on it.
//
// Agreement (run by every member right after a generation's communicator is built):
//  1. all-gather each member's state step (the number of optimizer steps its state reflects;
//     -1 when it holds none: a process that just started);
//  2. the source is the member with the largest step, the lowest rank among ties; all members
//     compute the same source from the same gathered vector (SelectStateSource);
//  3. when NO member holds state (every process of the job was restarted), rank 0 restores it
//     (the newest valid checkpoint, else the seed: Trainer::AgreeOnState) and becomes the
//     source; the other members never read storage, so all of them end with exactly the state
//     rank 0 read, even while some other writer adds a checkpoint concurrently;
//  4. the source broadcasts a fixed-size header (step, data cursor, counters, fp16 loss scale,
//     parameter and sample-count sizes), then the parameters, each optimizer state buffer in
//     order, and the per-sample counts of the current epoch when it keeps them.
// A member whose parameter count differs from the source's (different manifests) fails with
// FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/device.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/optimizer.h"
#include "worker/trainer/sampler.h"

namespace lockstep::trainer {

struct TrainingState {
  int64_t step = 0;     // optimizer steps (global batches) completed
  DataCursor cursor;    // next sample of the global order
  int64_t samples = 0;  // global samples consumed
  // fp16 dynamic loss scaling (PyTorch GradScaler's policy): scale, and steps since it last
  // changed.
  float loss_scale = 65536.0f;
  int64_t loss_scale_good_steps = 0;
  // On the trainer's device (kernels/device.h), like the optimizer's state.
  kernels::DeviceArray<float> params;
  Optimizer optimizer;
  // Sample accounting (LOCKSTEP_SAMPLE_ACCOUNTING; empty when off): how many times each sample
  // id was trained in the current epoch (cursor.epoch). Part of the state so that it survives
  // membership changes (broadcast) and restarts (checkpointed).
  std::vector<int32_t> sample_counts;
};

// A state at step 0 for `num_params` parameters and `optimizer`'s buffers, all zero, on `device`.
// RESOURCE_EXHAUSTED when it does not fit.
StatusOr<TrainingState> MakeTrainingState(int64_t num_params, const spec::OptimizerSpec& optimizer,
                                          kernels::Device& device);

// Copies everything of `from` into `to` (the same layout, on the same device): the counters, the
// data cursor, the sample counts, and the parameters and optimizer state, which are queued on the
// device's compute stream: done once it passes them (Synchronize, or an event recorded after).
void CopyTrainingState(const TrainingState& from, TrainingState& to);

// The source of the agreement given every member's state step (-1: none): the largest step,
// the lowest rank among ties; -1 when no member holds state.
int SelectStateSource(const std::vector<int64_t>& steps);

// All-gathers each member's state step (`my_step`, -1 for none) in rank order.
StatusOr<std::vector<int64_t>> GatherStateSteps(comm::Communicator& communicator, int64_t my_step,
                                                int64_t timeout_ms);

// Step 4 of the agreement: every member calls it with the same `source`; afterwards every
// member holds the source's state. The parameters and optimizer state go from device memory to
// device memory (NCCL on a GPU) once the work queued on the device's compute stream is done. A receiver whose sample accounting is off takes the source's
// counts anyway (so that it can report if it becomes rank 0); counts the source lacks are reset.
Status BroadcastTrainingState(comm::Communicator& communicator, int source, TrainingState& state,
                              int64_t timeout_ms);

// Steps 1, 2 and 4 for members of which at least one holds state. Returns the rank that was
// the source; FAILED_PRECONDITION when no member holds state. Errors are the communicator's (the
// generation is then over) or FAILED_PRECONDITION for a layout mismatch.
StatusOr<int> AgreeOnTrainingState(comm::Communicator& communicator, bool has_state,
                                   TrainingState& state, int64_t timeout_ms);

}  // namespace lockstep::trainer
