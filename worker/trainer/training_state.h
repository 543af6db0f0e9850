// TrainingState: everything a worker must hold to continue training from a step, and the
// protocol by which the members of a new generation agree on it.
//
// Agreement (run by every member right after a generation's communicator is built):
//  1. all-gather each member's state step (the number of optimizer steps its state reflects;
//     -1 when it holds none);
//  2. the source is the member with the largest step, the lowest rank among ties; all members
//     compute the same source from the same gathered vector;
//  3. the source broadcasts a fixed-size header (step, data cursor, counters, fp16 loss scale,
//     parameter count), then the parameters, then each optimizer state buffer in order.
// At the first generation every member holds step 0 from the same seed, so the broadcast only
// confirms what all hold; it runs anyway, because it is the path by which survivors of an
// elastic change hand their state to newcomers. A member whose parameter count differs from
// the source's (different manifests) fails with FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
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
  std::vector<float> params;
  Optimizer optimizer;
};

// Returns the rank that was the source. Errors are the communicator's (the generation is then
// over) or FAILED_PRECONDITION for a layout mismatch.
StatusOr<int> AgreeOnTrainingState(comm::Communicator& communicator, bool has_state,
                                   TrainingState& state, int64_t timeout_ms);

}  // namespace lockstep::trainer
