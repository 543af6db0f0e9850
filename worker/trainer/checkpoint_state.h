// The built-in trainer's state as a checkpoint (worker/checkpoint/checkpoint.h) and back.
//
// Tensors, in this order (the state stream is then the flat buffers one after the other):
//   layers.<i>.weight [out, in], layers.<i>.bias [out]        f32, i = forward layer index, in
//                                                             the flat buffer's (backward) order
//   optimizer/<buffer>/layers.<i>.weight|bias                 f32, <buffer> = momentum (sgd) or
//                                                             exp_avg, exp_avg_sq (adamw)
//   trainer/samples [1] i64, trainer/loss_scale [1] f32, trainer/loss_scale_good_steps [1] i64
//   accounting/sample_counts [N] i32                          only with sample accounting on
// Metadata: step, the data cursor (epoch, offset), the optimizer's type and own step count, and
// rng_state "splitmix64 seed=<seed>": the data order and the initialisation are pure functions
// of the seed and the cursor, so the seed is all the random state there is.
//
// A pipeline stage holds only its layers: its part of a checkpoint is the same tensors, named by
// the same (whole-model) layer indices, of its layers only, and stage 0's part also holds the
// trainer's (CheckpointScope). A checkpoint is thus the same set of names however many stages
// wrote it, and any stage takes its layers by name from any checkpoint.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/manifest.h"
#include "worker/trainer/model.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {

// What part of the trainer's state a checkpoint part holds: the tensors of `layers` (parameters
// and optimizer state) and, with `trainer_tensors`, the trainer's own (samples, loss scale,
// sample counts). The whole state: every layer and the trainer's (WholeScope).
struct CheckpointScope {
  LayerRange layers;
  bool trainer_tensors = true;
};
CheckpointScope WholeScope(const ParameterLayout& layout);
// Stage `stage` of a pipeline whose stages hold `stages`.
CheckpointScope StageScope(const std::vector<LayerRange>& stages, int stage);

// The tensors (names, dtypes, shapes; offsets from 0) that a state of `scope` is checkpointed
// as, with `optimizer`'s state buffers and `sample_counts` per-sample counts (0: none kept).
// What a state of that scope fills (FillCheckpointState), known without holding it: every
// writer of a pipeline's checkpoint knows every stage's table.
std::vector<checkpoint::TensorEntry> CheckpointTable(const ParameterLayout& layout,
                                                     const CheckpointScope& scope,
                                                     const Optimizer& optimizer,
                                                     int64_t sample_counts);

// Writes `state` into `out`, reusing out's buffers when it already has this layout (a repeated
// snapshot then costs one copy and no allocation). The parameters and optimizer state are copied
// from the device: after everything queued on its compute stream when `ready` is null, else on
// its background stream once `ready` (an event recorded on the compute stream at the step
// boundary) is reached, so a capture thread copies while the training thread queues the next
// step. Returns once the copies are done.
// With `scope` (default: the whole state), `state` is that scope's: a pipeline stage's.
void FillCheckpointState(const TrainingState& state, const ParameterLayout& layout,
                         const spec::TrainerSpec& spec, checkpoint::CheckpointState* out,
                         const kernels::DeviceEvent* ready = nullptr,
                         const std::optional<CheckpointScope>& scope = std::nullopt);

// Whether the checkpoint that `manifest` describes fits this model and optimizer: the same
// optimizer type, and every tensor of `state` present with the same dtype and shape (the sample
// counts excepted: they are reset when they do not fit). FAILED_PRECONDITION naming the first
// difference. The loader skips a checkpoint that does not fit, as it skips a damaged one.
Status CheckpointFitsModel(const checkpoint::Manifest& manifest, const TrainingState& state,
                           const ParameterLayout& layout);
// The same check against the tensors `wanted` (CheckpointTable) and optimizer type `optimizer`.
Status CheckpointFitsTable(const checkpoint::Manifest& manifest,
                           const std::vector<checkpoint::TensorEntry>& wanted,
                           const std::string& optimizer);

// Restores `state` from `checkpoint`. FAILED_PRECONDITION naming the tensor when the checkpoint
// does not fit this model or optimizer (the manifest changed). Sample counts are restored when
// both sides keep them, and reset otherwise. The tensors go to the state's device (a checkpoint
// written on one device type resumes on the other: the bytes are the same float32).
// With `scope`, `state` is that scope's and `checkpoint` needs only its tensors.
Status RestoreFromCheckpointState(const checkpoint::CheckpointState& checkpoint,
                                  const ParameterLayout& layout, const spec::TrainerSpec& spec,
                                  TrainingState* state,
                                  const std::optional<CheckpointScope>& scope = std::nullopt);

}  // namespace lockstep::trainer
