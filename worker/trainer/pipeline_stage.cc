#include "worker/trainer/pipeline_stage.h"

#include <algorithm>
#include <string>

#include "common/deadline.h"

namespace lockstep::trainer {

namespace {

PipelineSchedule ToSchedule(spec::PipelineSchedule schedule) {
  return schedule == spec::PipelineSchedule::kGpipe ? PipelineSchedule::kGPipe
                                                    : PipelineSchedule::k1F1B;
}

// Micro-batch m of `rows` split into `count`: its first row and its rows.
struct MicroBatch {
  int64_t offset = 0;
  int64_t rows = 0;
};
MicroBatch MicroBatchOf(int64_t rows, int count, int m) {
  const int64_t base = rows / count, extra = rows % count;
  return {m * base + std::min<int64_t>(m, extra), base + (m < extra ? 1 : 0)};
}

}  // namespace

StatusOr<PipelinePlan> MakePipelinePlan(const spec::PipelineSpec& spec,
                                        const ParameterLayout& layout) {
  std::vector<int64_t> ins, outs;
  for (const LayerLayout& layer : layout.layers) {
    ins.push_back(layer.in);
    outs.push_back(layer.out);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int> first, PipelineStageBoundaries(spec, ins, outs));
  PipelinePlan plan;
  for (size_t s = 0; s + 1 < first.size(); ++s) plan.stages.push_back({first[s], first[s + 1]});
  plan.micro_batches = spec.micro_batches;
  plan.schedule = ToSchedule(spec.schedule);
  plan.recompute = spec.recompute;
  return plan;
}

StatusOr<std::unique_ptr<PipelineStage>> PipelineStage::Create(const MlpModel& model,
                                                               const PipelinePlan& plan, int stage,
                                                               int64_t max_rows,
                                                               kernels::Device& device) {
  const int stages = static_cast<int>(plan.stages.size());
  int next = 0;
  for (const LayerRange& range : plan.stages) {
    if (range.first != next || range.size() < 1) break;
    next = range.last;
  }
  if (stages < 1 || next != model.layout().num_layers()) {
    return InvalidArgumentError(
        "pipeline: the stages' layers must be contiguous ranges that "
        "cover the model's " +
        std::to_string(model.layout().num_layers()) + " layers in order");
  }
  if (stage < 0 || stage >= stages) {
    return InvalidArgumentError("pipeline: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages));
  }
  if (plan.micro_batches < 1 || max_rows < plan.micro_batches) {
    return InvalidArgumentError("pipeline: " + std::to_string(plan.micro_batches) +
                                " micro-batches of a batch of " + std::to_string(max_rows) +
                                ": every micro-batch needs a sample");
  }
  std::unique_ptr<PipelineStage> self(new PipelineStage(model, plan, stage, device));
  self->max_rows_ = max_rows;
  self->max_micro_rows_ = MicroBatchOf(max_rows, plan.micro_batches, 0).rows;
  self->actions_ = StageSchedule(plan.schedule, stages, stage, plan.micro_batches);
  self->slots_ = PeakActivationsHeld(self->actions_);
  const LayerRange layers = self->layers();
  const ParameterLayout& layout = model.layout();
  const int64_t in = layout.layers[static_cast<size_t>(layers.first)].in;
  const int64_t out = layout.layers[static_cast<size_t>(layers.last) - 1].out;
  const int workspaces = plan.recompute ? 1 : self->slots_;
  for (int i = 0; i < workspaces; ++i) {
    LOCKSTEP_ASSIGN_OR_RETURN(MlpWorkspace workspace,
                              MlpWorkspace::Create(model, self->max_micro_rows_, device, layers));
    self->workspaces_.push_back(std::move(workspace));
  }
  if (!self->first()) {
    self->inputs_.resize(static_cast<size_t>(self->slots_));
    for (kernels::DeviceArray<float>& input : self->inputs_) {
      LOCKSTEP_RETURN_IF_ERROR(input.Allocate(device, self->max_micro_rows_ * in));
    }
    LOCKSTEP_RETURN_IF_ERROR(self->grad_input_.Allocate(device, self->max_micro_rows_ * in));
  }
  if (!self->last()) {
    LOCKSTEP_RETURN_IF_ERROR(self->grad_output_.Allocate(device, self->max_micro_rows_ * out));
  }
  int64_t floats = self->grad_input_.size() + self->grad_output_.size();
  for (const kernels::DeviceArray<float>& input : self->inputs_) floats += input.size();
  for (const MlpWorkspace& workspace : self->workspaces_) floats += workspace.floats();
  self->workspace_bytes_ = floats * static_cast<int64_t>(sizeof(float));
  return self;
}

Status PipelineStage::RunStep(comm::Communicator& pipe, const float* params, const float* features,
                              const int32_t* labels, int64_t rows, float grad_scale, float* grads,
                              double* loss_sum, int64_t timeout_ms, StageStepTimes* times,
                              const MlpModel::LayerReadyFn& on_layer_ready) {
  const int stages = static_cast<int>(plan_.stages.size());
  if (pipe.size() != stages || pipe.rank() != stage_) {
    return InvalidArgumentError("pipeline: stage " + std::to_string(stage_) + " of " +
                                std::to_string(stages) + " given a communicator of rank " +
                                std::to_string(pipe.rank()) + " of " + std::to_string(pipe.size()));
  }
  const int micro_batches = plan_.micro_batches;
  if (rows < 0 || MicroBatchOf(rows, micro_batches, 0).rows > max_micro_rows_) {
    return InvalidArgumentError("pipeline: a batch of " + std::to_string(rows) +
                                " samples where the stage was made for micro-batches of " +
                                std::to_string(max_micro_rows_));
  }
  StageStepTimes local;
  StageStepTimes& t = times != nullptr ? *times : local;
  t = {};
  const ParameterLayout& layout = model_.layout();
  const LayerRange range = layers();
  const int64_t in = layout.layers[static_cast<size_t>(range.first)].in;
  const int64_t out = layout.layers[static_cast<size_t>(range.last) - 1].out;
  const kernels::ExecutionContext& ctx = device_.compute();

  // Slots: which micro-batch's activations (or input) each holds; -1 free.
  std::vector<int> slot_of(static_cast<size_t>(micro_batches), -1);
  std::vector<int> holder(static_cast<size_t>(slots_), -1);
  auto take_slot = [&](int m) {
    const auto free = std::find(holder.begin(), holder.end(), -1);
    const int slot = static_cast<int>(free - holder.begin());
    *free = m;
    slot_of[static_cast<size_t>(m)] = slot;
    return slot;
  };
  auto input_of = [&](int m) -> const float* {
    if (first()) return features + MicroBatchOf(rows, micro_batches, m).offset * in;
    return inputs_[static_cast<size_t>(slot_of[static_cast<size_t>(m)])].device_data();
  };
  auto workspace_of = [&](int m) -> MlpWorkspace& {
    return workspaces_[plan_.recompute ? 0 : static_cast<size_t>(slot_of[static_cast<size_t>(m)])];
  };

  // What the next action needs from a neighbour: where it goes and from whom.
  struct Message {
    const void* send = nullptr;
    void* recv = nullptr;
    size_t send_bytes = 0, recv_bytes = 0;
    int send_peer = -1, recv_peer = -1;
  };
  auto want_input = [&](const PipelineAction& action, Message& message) {
    const int64_t micro_rows = MicroBatchOf(rows, micro_batches, action.micro_batch).rows;
    if (action.kind == PipelineAction::kForward) {
      const int slot = take_slot(action.micro_batch);
      if (first()) return;
      message.recv = inputs_[static_cast<size_t>(slot)].device_data();
      message.recv_bytes = static_cast<size_t>(micro_rows * in) * sizeof(float);
      message.recv_peer = stage_ - 1;
    } else if (!last()) {
      message.recv = grad_output_.device_data();
      message.recv_bytes = static_cast<size_t>(micro_rows * out) * sizeof(float);
      message.recv_peer = stage_ + 1;
    }
  };
  auto exchange = [&](const Message& message) -> Status {
    if (message.send_peer < 0 && message.recv_peer < 0) return OkStatus();
    const double start = MonotonicSeconds();
    Status s;
    if (message.send_peer >= 0 && message.recv_peer >= 0 &&
        message.send_peer != message.recv_peer) {
      // Forwards or backwards in a row: two neighbours, and the send goes first.
      s = pipe.Send(message.send, message.send_bytes, message.send_peer, timeout_ms);
      if (s.ok()) s = pipe.Recv(message.recv, message.recv_bytes, message.recv_peer, timeout_ms);
    } else {
      s = pipe.SendRecv(message.send, message.send_bytes, message.send_peer, message.recv,
                        message.recv_bytes, message.recv_peer, timeout_ms);
    }
    t.wait_seconds += MonotonicSeconds() - start;
    if (s.ok() && message.send_peer >= 0) t.bytes_sent += static_cast<int64_t>(message.send_bytes);
    return s;
  };

  Message message;
  want_input(actions_.front(), message);
  LOCKSTEP_RETURN_IF_ERROR(exchange(message));
  int backwards = 0;
  for (size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction& action = actions_[i];
    const int m = action.micro_batch;
    const MicroBatch micro = MicroBatchOf(rows, micro_batches, m);
    message = {};
    const double start = MonotonicSeconds();
    if (action.kind == PipelineAction::kForward) {
      const float* output = model_.Forward(ctx, params, input_of(m), micro.rows, workspace_of(m));
      if (!last()) {
        message.send = output;
        message.send_bytes = static_cast<size_t>(micro.rows * out) * sizeof(float);
        message.send_peer = stage_ + 1;
      }
    } else {
      if (plan_.recompute) model_.Forward(ctx, params, input_of(m), micro.rows, workspace_of(m));
      MlpModel::OutputGradient from;
      if (last()) {
        from.labels = labels + micro.offset;
        from.grad_scale = grad_scale;
        from.loss_sum = loss_sum;
      } else {
        from.grad_output = grad_output_.device_data();
      }
      // Every schedule ends with a backward: the one that makes the gradients final.
      const bool final_backward = i + 1 == actions_.size();
      model_.Backward(ctx, params, input_of(m), micro.rows, from, grads, workspace_of(m),
                      final_backward ? on_layer_ready : MlpModel::LayerReadyFn(),
                      /*accumulate=*/backwards++ > 0,
                      first() ? nullptr : grad_input_.device_data());
      holder[static_cast<size_t>(slot_of[static_cast<size_t>(m)])] = -1;
      if (!first()) {
        message.send = grad_input_.device_data();
        message.send_bytes = static_cast<size_t>(micro.rows * in) * sizeof(float);
        message.send_peer = stage_ - 1;
      }
    }
    t.compute_seconds += MonotonicSeconds() - start;
    if (i + 1 < actions_.size()) want_input(actions_[i + 1], message);
    LOCKSTEP_RETURN_IF_ERROR(exchange(message));
  }
  return OkStatus();
}

}  // namespace lockstep::trainer
