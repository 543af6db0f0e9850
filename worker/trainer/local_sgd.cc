#include "worker/trainer/local_sgd.h"

#include <utility>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::trainer {
namespace {

// Copies everything of `from` into `to` (same layout): the counters, the data cursor, the sample
// counts, and the parameters and optimizer state on the device (queued on `ctx`, then waited for,
// so `from` may change right after).
void CopyState(kernels::Device& device, const TrainingState& from, TrainingState& to) {
  const kernels::ExecutionContext& ctx = device.compute();
  to.step = from.step;
  to.cursor = from.cursor;
  to.samples = from.samples;
  to.loss_scale = from.loss_scale;
  to.loss_scale_good_steps = from.loss_scale_good_steps;
  to.sample_counts = from.sample_counts;
  to.optimizer.set_steps_taken(from.optimizer.steps_taken());
  device.CopyOnDevice(ctx, to.params.device_data(), from.params.device_data(),
                      static_cast<size_t>(from.params.size()) * sizeof(float));
  const auto sources = from.optimizer.StateBuffers();
  const auto targets = to.optimizer.StateBuffers();
  for (size_t i = 0; i < sources.size() && i < targets.size(); ++i) {
    device.CopyOnDevice(ctx, targets[i].first, sources[i].first,
                        static_cast<size_t>(sources[i].second) * sizeof(float));
  }
  device.Synchronize(ctx);
}

// Averages `count` floats of device memory over the ranks: a SUM all-reduce, then x 1/W.
Status AverageBuffer(comm::Communicator& communicator, kernels::Device& device, float* data,
                     int64_t count, int64_t timeout_ms, int64_t* wire_bytes) {
  LOCKSTEP_RETURN_IF_ERROR(communicator.AllReduce(data, static_cast<size_t>(count),
                                                  comm::DataType::kFloat32, comm::ReduceOp::kSum,
                                                  timeout_ms));
  kernels::Scale(device.compute(), count, 1.0f / static_cast<float>(communicator.size()), data);
  *wire_bytes += count * static_cast<int64_t>(sizeof(float));
  return OkStatus();
}

}  // namespace

StatusOr<LocalSgd> LocalSgd::Create(const spec::LocalSgdSpec& spec, int64_t num_params,
                                    const spec::OptimizerSpec& optimizer,
                                    kernels::Device& device) {
  LOCKSTEP_ASSIGN_OR_RETURN(TrainingState saved, MakeTrainingState(num_params, optimizer, device));
  return LocalSgd(spec, device, std::move(saved));
}

StatusOr<LocalSgd::Outcome> LocalSgd::Synchronize(comm::Communicator& communicator,
                                                  TrainingState& state, bool full,
                                                  bool leave_vote, int64_t timeout_ms) {
  Outcome outcome;
  int64_t vote = leave_vote ? 1 : 0;
  LOCKSTEP_RETURN_IF_ERROR(communicator
                               .AllReduce(&vote, 1, comm::DataType::kInt64, comm::ReduceOp::kMax,
                                          timeout_ms)
                               .WithContext("local SGD: all-reduce of the leave vote"));
  outcome.leave_agreed = vote > 0;
  // The optimizer's update of this step must be in the parameters before they travel.
  device_->Synchronize(device_->compute());
  LOCKSTEP_RETURN_IF_ERROR(AverageBuffer(communicator, *device_, state.params.device_data(),
                                         state.params.size(), timeout_ms, &outcome.wire_bytes)
                               .WithContext("local SGD: average of the parameters"));
  if (full || outcome.leave_agreed) {
    for (const auto& [buffer, count] : state.optimizer.StateBuffers()) {
      LOCKSTEP_RETURN_IF_ERROR(
          AverageBuffer(communicator, *device_, buffer, count, timeout_ms, &outcome.wire_bytes)
              .WithContext("local SGD: average of the optimizer state"));
    }
  }
  Save(state);
  return outcome;
}

void LocalSgd::Save(const TrainingState& state) {
  CopyState(*device_, state, saved_);
  diverged_ = false;
}

void LocalSgd::RollBack(TrainingState& state) {
  if (!diverged_) return;
  CopyState(*device_, saved_, state);
  diverged_ = false;
}

}  // namespace lockstep::trainer
