#include "worker/trainer/local_sgd.h"

#include <utility>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::trainer {
namespace {

// Copies `from` into `to` and waits for the device's copies, so `from` may change right after.
void CopyState(kernels::Device& device, const TrainingState& from, TrainingState& to) {
  CopyTrainingState(from, to);
  device.Synchronize(device.compute());
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
