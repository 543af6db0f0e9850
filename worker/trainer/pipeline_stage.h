// PipelineStage: one stage of a pipeline-parallel model running one step: the forward and
// backward passes of every micro-batch over its layers, in the order StageSchedule gives,
// passing activations to the next stage and their gradients to the previous one over the
// pipeline's communicator (Send/Recv, communicator.h).
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto stage, PipelineStage::Create(model, plan, stage_index,
//                                                               batch_size, device));
//   // per step, on every stage of the pipeline (pipe.rank() == stage index):
//   LOCKSTEP_RETURN_IF_ERROR(stage->RunStep(pipe, params, features, labels, rows,
//                                           1.0f / global_batch, grads, loss_sum, timeout));
//   // then all-reduce grads over the stage's data-parallel group and step the optimizer.
//
// `params` and `grads` are the stage's slice of the flat buffers (model.h): a stage holds only
// its own layers. After RunStep, grads holds the sum over the micro-batches, which is the
// gradient of the whole batch (up to float rounding), as one rank would compute it.
//
// Messages (the pairing Megatron-LM's 1F1B uses): after each action, the message that action
// produces (a forward's output to the next stage, a backward's input gradient to the previous
// one) goes in one SendRecv with the message the next action needs from the same neighbour (a
// backward's output gradient from the next stage, a forward's input from the previous one).
// When the two messages are with different neighbours (forwards in a row, backwards in a row)
// the send comes first; forwards flow one way and backwards the other, so every send meets its
// receive and no stage waits in a cycle. Message sizes follow from `rows`, which every stage of
// the pipeline is given alike: micro-batch m holds rows / M samples, one more for the first
// rows % M.
//
// Memory: without recompute a stage keeps each micro-batch's activations (a workspace) from its
// forward to its backward, so it holds PeakActivationsHeld(schedule) of them: M under GPipe,
// at most stages - stage under 1F1B. With recompute it keeps only each micro-batch's input and
// runs the forward again, into one workspace, right before the backward (GPipe's
// re-materialisation): one more forward per micro-batch for activation memory of one.
//
// Thread safety: one thread drives a PipelineStage.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/model.h"
#include "worker/trainer/pipeline_schedule.h"

namespace lockstep::trainer {

// What every rank of a pipeline-parallel job agrees on.
struct PipelinePlan {
  std::vector<LayerRange> stages;  // contiguous, covering the model's layers in order
  int micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  bool recompute = false;
};

// The plan of spec.trainer.pipeline for a model of `layout`: its stageLayers, or stages that
// balance the layers' compute (BalanceStages over each layer's 3 x in x out multiply-adds per
// sample: forward and backward GEMMs). INVALID_ARGUMENT naming the field for a plan the model
// cannot have.
StatusOr<PipelinePlan> MakePipelinePlan(const spec::PipelineSpec& spec,
                                        const ParameterLayout& layout);

// Where a rank sits in a pipeline-parallel world: rank = replica * stages + stage, so that a
// replica's stages are consecutive ranks (the same pod or node where ranksPerWorker allows).
struct PipelinePlace {
  int stage = 0;
  int replica = 0;
};

// Where one step's time went on a stage.
struct StageStepTimes {
  double compute_seconds = 0;  // forward and backward passes (recomputed forwards included)
  double wait_seconds = 0;     // in Send/Recv: the bubble, and the transfers
  int64_t bytes_sent = 0;      // activations and activation gradients
};

class PipelineStage {
 public:
  // Stage `stage` of `plan` for batches of up to `max_rows` samples, its buffers on `device`.
  // INVALID_ARGUMENT when the plan's stages are not contiguous ranges covering the model, or
  // stage, micro_batches or max_rows is out of range; RESOURCE_EXHAUSTED when the buffers do not
  // fit.
  static StatusOr<std::unique_ptr<PipelineStage>> Create(const MlpModel& model,
                                                         const PipelinePlan& plan, int stage,
                                                         int64_t max_rows, kernels::Device& device);

  LayerRange layers() const { return plan_.stages[static_cast<size_t>(stage_)]; }
  int stage() const { return stage_; }
  // The largest batch a step may have (Create's max_rows).
  int64_t max_rows() const { return max_rows_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == static_cast<int>(plan_.stages.size()); }
  // Micro-batches whose activations (or, with recompute, inputs) this stage holds at most.
  int activation_slots() const { return slots_; }
  // Bytes of the stage's activation buffers: its workspaces, kept inputs and message buffers
  // (what the schedule and recompute change).
  int64_t workspace_bytes() const { return workspace_bytes_; }

  // One step over `rows` (<= max_rows) samples. `features` ([rows, input features]) is read by
  // the first stage only and `labels` ([rows]) by the last only; the others may pass nullptr.
  // Loss: grad_scale * sum of the rows' cross-entropy; the last stage ADDS the unscaled sum to
  // *loss_sum (device memory). `pipe` holds the pipeline's stages as ranks 0..stages-1. Errors:
  // the communicator's (the step is lost: grads are partial); INVALID_ARGUMENT when pipe does
  // not match the plan.
  // `on_layer_ready` (may be empty) is called as MlpModel::Backward calls it, during the step's
  // last backward, once each of the stage's layers has its final gradient: the stage group's
  // all-reduce of a bucket may start while the rest of that backward runs.
  Status RunStep(comm::Communicator& pipe, const float* params, const float* features,
                 const int32_t* labels, int64_t rows, float grad_scale, float* grads,
                 double* loss_sum, int64_t timeout_ms, StageStepTimes* times = nullptr,
                 const MlpModel::LayerReadyFn& on_layer_ready = nullptr);

 private:
  PipelineStage(const MlpModel& model, PipelinePlan plan, int stage, kernels::Device& device)
      : model_(model), plan_(std::move(plan)), stage_(stage), device_(device) {}

  const MlpModel& model_;
  PipelinePlan plan_;
  int stage_ = 0;
  kernels::Device& device_;
  int64_t max_rows_ = 0;
  int64_t max_micro_rows_ = 0;
  int slots_ = 0;
  int64_t workspace_bytes_ = 0;
  std::vector<PipelineAction> actions_;
  // Per slot: a workspace (one in all with recompute) and the received input (not for the first
  // stage, which reads `features`).
  std::vector<MlpWorkspace> workspaces_;
  std::vector<kernels::DeviceArray<float>> inputs_;
  kernels::DeviceArray<float> grad_output_;  // from the next stage; Backward's scratch
  kernels::DeviceArray<float> grad_input_;   // to the previous stage
};

}  // namespace lockstep::trainer
