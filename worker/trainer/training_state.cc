#include "worker/trainer/training_state.h"

#include <algorithm>
#include <string>

namespace lockstep::trainer {
namespace {

// The broadcast header. Plain fixed-width fields: every rank runs the same binary.
struct StateHeader {
  int64_t step;
  int64_t epoch;
  int64_t offset;
  int64_t samples;
  int64_t optimizer_steps;
  int64_t loss_scale_good_steps;
  int64_t num_params;
  int64_t num_sample_counts;
  double loss_scale;
};

}  // namespace

StatusOr<TrainingState> MakeTrainingState(int64_t num_params, const spec::OptimizerSpec& optimizer,
                                          kernels::Device& device) {
  TrainingState state{0, DataCursor{}, 0, 65536.0f, 0, {}, Optimizer(optimizer, num_params), {}};
  LOCKSTEP_RETURN_IF_ERROR(state.params.Allocate(device, num_params));
  LOCKSTEP_RETURN_IF_ERROR(state.optimizer.Allocate(device));
  return state;
}

void CopyTrainingState(const TrainingState& from, TrainingState& to) {
  kernels::Device& device = *from.params.device();
  const kernels::ExecutionContext& on = device.compute();
  to.step = from.step;
  to.cursor = from.cursor;
  to.samples = from.samples;
  to.loss_scale = from.loss_scale;
  to.loss_scale_good_steps = from.loss_scale_good_steps;
  to.sample_counts = from.sample_counts;  // host memory; reuses its capacity
  to.optimizer.set_steps_taken(from.optimizer.steps_taken());
  device.CopyOnDevice(on, to.params.device_data(), from.params.device_data(),
                      static_cast<size_t>(from.params.size()) * sizeof(float));
  const auto sources = from.optimizer.StateBuffers();
  const auto targets = to.optimizer.StateBuffers();
  for (size_t i = 0; i < sources.size() && i < targets.size(); ++i) {
    device.CopyOnDevice(on, targets[i].first, sources[i].first,
                        static_cast<size_t>(sources[i].second) * sizeof(float));
  }
}

int SelectStateSource(const std::vector<int64_t>& steps) {
  int source = 0;
  for (size_t r = 1; r < steps.size(); ++r) {
    if (steps[r] > steps[static_cast<size_t>(source)]) source = static_cast<int>(r);
  }
  return steps.empty() || steps[static_cast<size_t>(source)] < 0 ? -1 : source;
}

StatusOr<std::vector<int64_t>> GatherStateSteps(comm::Communicator& communicator, int64_t my_step,
                                                int64_t timeout_ms) {
  std::vector<int64_t> steps(static_cast<size_t>(communicator.size()));
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.AllGather(&my_step, sizeof(my_step), steps.data(), timeout_ms)
          .WithContext("state agreement: all-gather of state steps"));
  return steps;
}

Status BroadcastTrainingState(comm::Communicator& communicator, int source, TrainingState& state,
                              int64_t timeout_ms) {
  StateHeader header{};
  if (communicator.rank() == source) {
    header = StateHeader{state.step,
                         state.cursor.epoch,
                         state.cursor.offset,
                         state.samples,
                         state.optimizer.steps_taken(),
                         state.loss_scale_good_steps,
                         state.params.size(),
                         static_cast<int64_t>(state.sample_counts.size()),
                         static_cast<double>(state.loss_scale)};
  }
  LOCKSTEP_RETURN_IF_ERROR(communicator.Broadcast(&header, sizeof(header), source, timeout_ms)
                               .WithContext("state agreement: broadcast of the header"));
  if (header.num_params != state.params.size()) {
    // Every member sees the mismatch the same way only if all compare with the source; a member
    // that differs stops here, and the others' next broadcast fails: the job's manifests differ.
    return FailedPreconditionError("state agreement: rank " + std::to_string(source) + " holds " +
                                   std::to_string(header.num_params) + " parameters, this member " +
                                   std::to_string(state.params.size()) +
                                   " (different model in the manifests?)");
  }
  // The collectives read and write the buffers outside the compute stream's order.
  if (kernels::Device* device = state.params.device(); device != nullptr) {
    device->Synchronize(device->compute());
  }
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.Broadcast(state.params.device_data(), state.params.bytes(), source, timeout_ms)
          .WithContext("state agreement: broadcast of the parameters"));
  for (auto [buffer, count] : state.optimizer.StateBuffers()) {
    LOCKSTEP_RETURN_IF_ERROR(
        communicator
            .Broadcast(buffer, static_cast<size_t>(count) * sizeof(float), source, timeout_ms)
            .WithContext("state agreement: broadcast of the optimizer state"));
  }
  if (header.num_sample_counts > 0) {
    if (communicator.rank() != source) {
      state.sample_counts.assign(static_cast<size_t>(header.num_sample_counts), 0);
    }
    LOCKSTEP_RETURN_IF_ERROR(communicator
                                 .Broadcast(state.sample_counts.data(),
                                            state.sample_counts.size() * sizeof(int32_t), source,
                                            timeout_ms)
                                 .WithContext("state agreement: broadcast of the sample counts"));
  } else {
    // The source does not account: whatever this member counted is of another history.
    std::fill(state.sample_counts.begin(), state.sample_counts.end(), 0);
  }
  state.step = header.step;
  state.cursor = DataCursor{header.epoch, header.offset};
  state.samples = header.samples;
  state.optimizer.set_steps_taken(header.optimizer_steps);
  state.loss_scale_good_steps = header.loss_scale_good_steps;
  state.loss_scale = static_cast<float>(header.loss_scale);
  return OkStatus();
}

StatusOr<int> AgreeOnTrainingState(comm::Communicator& communicator, bool has_state,
                                   TrainingState& state, int64_t timeout_ms) {
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<int64_t> steps,
      GatherStateSteps(communicator, has_state ? state.step : -1, timeout_ms));
  const int source = SelectStateSource(steps);
  if (source < 0) {
    return FailedPreconditionError("state agreement: no member holds training state");
  }
  LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(communicator, source, state, timeout_ms));
  return source;
}

}  // namespace lockstep::trainer
