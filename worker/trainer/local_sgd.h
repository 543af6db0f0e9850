// Local SGD (sync.strategy localSGD; Stich, ICLR 2019; post-local SGD: Lin et al., ICLR 2020):
// every rank applies its own gradient, and the ranks average their parameters every `period`
// steps instead of summing gradients at every step.
//
// The trainer's loop (trainer.cc) with a LocalSgd:
//   - steps before `startStep` all-reduce gradients as strategy allreduce does (post-local SGD);
//   - a local step computes this rank's gradient scaled by W / G (its slice's sum over the
//     global batch size, times the world size: the global-mean gradient's estimate; on equal
//     slices, exactly the mean of its own slice) and applies it with the optimizer, with no
//     communication at all;
//   - after a step that AverageDue names, Synchronize averages the parameters (one float32
//     all-reduce, then x 1/W), after a MAX all-reduce of the leave votes (gradient_synchronizer.h
//     carries them at every step of the other strategies; here a vote waits for the next
//     average, at most `period` steps). A full average also averages the optimizer state, which
//     then is identical on every rank: at checkpoint steps, the last step and when leaving, so
//     checkpoints, the final model and the state a new generation agrees on are everybody's.
//
// With period 1 the loop is synchronous SGD: the parameters after an average are the old ones
// minus lr x the mean over ranks of each rank's (momentum-)update, which is linear in the
// gradients, so they equal the all-reduce's to float rounding (momentum and weight decay
// included; AdamW is not linear, and only approximates it).
//
// Failures: the state between averages differs from rank to rank, so it is no state a new
// generation can agree on. Each rank keeps a copy of its state as of the last average (Save), and
// a generation that ends between averages (a failed collective, a stop) rolls every survivor back
// to it (RollBack): the parameters, step, data cursor and sample counts of every survivor are then
// the same again, and the steps since are trained again by the next generation, so no sample is
// lost or counted twice. The momentum a survivor keeps is its own; the state agreement then gives
// every member the source's (training_state.h).
//
// Thread safety: one thread (the training thread).
#pragma once

#include <cstdint>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {

class LocalSgd {
 public:
  // RESOURCE_EXHAUSTED when the copy of the state does not fit on the device.
  static StatusOr<LocalSgd> Create(const spec::LocalSgdSpec& spec, int64_t num_params,
                                   const spec::OptimizerSpec& optimizer, kernels::Device& device);

  // Whether step `step` (0-based index of the step being trained) is a local step.
  bool IsLocal(int64_t step) const { return step >= spec_.start_step; }
  // Whether the parameters are averaged after `steps_done` steps by the period alone (the caller
  // adds the full averages of checkpoint steps, the last step and a leave).
  bool AverageDue(int64_t steps_done) const {
    return steps_done > spec_.start_step && (steps_done - spec_.start_step) % spec_.period == 0;
  }

  struct Outcome {
    bool leave_agreed = false;  // some rank voted to leave: the average was full
    int64_t wire_bytes = 0;     // bytes handed to the all-reduces
  };
  // Averages the parameters over the ranks, and the optimizer state too when `full` or when a
  // rank votes to leave, then saves the state (Save). Every rank calls it at the same steps.
  // Errors are the communicator's (the generation is over; RollBack).
  StatusOr<Outcome> Synchronize(comm::Communicator& communicator, TrainingState& state, bool full,
                                bool leave_vote, int64_t timeout_ms);

  // Keeps a copy of `state` as the point to roll back to (the generation's agreed state, and
  // after every average).
  void Save(const TrainingState& state);
  // A local step changed the state: it now differs from the other ranks' until the next average.
  void MarkLocalStep() { diverged_ = true; }
  bool diverged() const { return diverged_; }
  // The step of the saved state.
  int64_t saved_step() const { return saved_.step; }
  // Restores the saved state into `state` when a local step changed it since (a no-op
  // otherwise: the steps before startStep keep every rank's state equal at every step).
  void RollBack(TrainingState& state);

 private:
  LocalSgd(const spec::LocalSgdSpec& spec, kernels::Device& device, TrainingState saved)
      : spec_(spec), device_(&device), saved_(std::move(saved)) {}

  spec::LocalSgdSpec spec_;
  kernels::Device* device_;
  TrainingState saved_;
  bool diverged_ = false;
};

}  // namespace lockstep::trainer
