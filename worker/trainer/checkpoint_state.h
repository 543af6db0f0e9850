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
#pragma once

#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/manifest.h"
#include "worker/trainer/model.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {

// Writes `state` into `out`, reusing out's buffers when it already has this layout (a repeated
// snapshot then costs one copy and no allocation). The parameters and optimizer state are copied
// from the device: after everything queued on its compute stream when `ready` is null, else on
// its side stream once `ready` (an event recorded on the compute stream at the step boundary) is
// reached, so a capture thread copies while the training thread queues the next step. Returns
// once the copies are done.
void FillCheckpointState(const TrainingState& state, const ParameterLayout& layout,
                         const spec::TrainerSpec& spec, checkpoint::CheckpointState* out,
                         const kernels::DeviceEvent* ready = nullptr);

// Whether the checkpoint that `manifest` describes fits this model and optimizer: the same
// optimizer type, and every tensor of `state` present with the same dtype and shape (the sample
// counts excepted: they are reset when they do not fit). FAILED_PRECONDITION naming the first
// difference. The loader skips a checkpoint that does not fit, as it skips a damaged one.
Status CheckpointFitsModel(const checkpoint::Manifest& manifest, const TrainingState& state,
                           const ParameterLayout& layout);

// Restores `state` from `checkpoint`. FAILED_PRECONDITION naming the tensor when the checkpoint
// does not fit this model or optimizer (the manifest changed). Sample counts are restored when
// both sides keep them, and reset otherwise. The tensors go to the state's device (a checkpoint
// written on one device type resumes on the other: the bytes are the same float32).
Status RestoreFromCheckpointState(const checkpoint::CheckpointState& checkpoint,
                                  const ParameterLayout& layout, const spec::TrainerSpec& spec,
                                  TrainingState* state);

}  // namespace lockstep::trainer
