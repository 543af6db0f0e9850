// The optimizer of the built-in trainer: one fused pass over the flat parameter buffer
// (SGD with momentum, or AdamW), and the learning-rate schedule.
//
//   Optimizer optimizer(job.spec.trainer->optimizer, layout.num_params);
//   LOCKSTEP_RETURN_IF_ERROR(optimizer.Allocate(device));     // state on the device, zeroed
//   float lr = LearningRate(job.spec.trainer->optimizer, step, global_batch / batch_size);
//   optimizer.Step(device.compute(), lr, params, grads);     // device pointers
//
// Thread safety: an Optimizer is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "worker/trainer/buckets.h"

namespace lockstep::trainer {

// The learning rate of the optimizer step with 0-based index `step` whose global batch holds
// `batches_per_step` batches of batchSize (spec::GlobalBatchSize / batchSize).
//  - lrScaling linear multiplies the manifest's rate by batches_per_step (Goyal et al. 2017, "the
//    linear scaling rule": the rate grows with the global batch). With globalBatch fixed that is
//    replicas x ranksPerWorker at every world size, so a failure does not change the rate; with
//    scaleWithWorld it is the CURRENT world size, so an elastic job's rate tracks its membership.
//  - warmupSteps W > 0 ramps linearly: step s uses rate * (s + 1) / W for s < W, so the first
//    step is already non-zero and step W - 1 reaches the full rate.
double LearningRate(const spec::OptimizerSpec& optimizer, int64_t step, int64_t batches_per_step);

class Optimizer {
 public:
  Optimizer(const spec::OptimizerSpec& spec, int64_t num_params);

  // Allocates the zeroed state buffers on `device` (RESOURCE_EXHAUSTED when they do not fit).
  // Call once, before anything else.
  Status Allocate(kernels::Device& device);

  // Applies one update with learning rate `lr`; params and grads are memory of ctx's device.
  // SGD updates the slices in `momentum_free` (ascending, disjoint) with neither momentum nor
  // weight decay, and keeps their momentum buffer zero: their gradients already carry both (dgc's
  // momentum correction, gradient_synchronizer.h), and a later step with the momentum (a
  // generation of one rank sends nothing and so compresses nothing) starts it afresh.
  void Step(const kernels::ExecutionContext& ctx, float lr, float* params, const float* grads,
            const std::vector<ParamRange>& momentum_free = {});

  // Updates applied so far (AdamW's bias correction and SGD's "first step" depend on it).
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }

  // The state buffers (momentum; or AdamW's first and second moments), in a fixed order, for
  // broadcasting and checkpointing: device memory.
  std::vector<std::pair<float*, int64_t>> StateBuffers();
  std::vector<std::pair<const float*, int64_t>> StateBuffers() const;
  // The name of each state buffer, in StateBuffers' order ("momentum"; "exp_avg", "exp_avg_sq").
  std::vector<std::string> StateBufferNames() const;
  // "sgd" or "adamw".
  std::string TypeName() const;

 private:
  spec::OptimizerSpec spec_;
  int64_t num_params_;
  int64_t steps_taken_ = 0;
  kernels::DeviceArray<float> state_a_;  // sgd: momentum buffer; adamw: exp_avg
  kernels::DeviceArray<float> state_b_;  // adamw: exp_avg_sq; empty for sgd
};

}  // namespace lockstep::trainer
