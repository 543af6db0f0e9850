// What one rank of the built-in trainer holds in memory, estimated before anything starts, so
// that `lockstep validate` and `lockstep run` refuse a model or batch that cannot be allocated
// (instead of workers aborting with bad_alloc minutes later).
//
//   trainer::DataShape shape;
//   LOCKSTEP_RETURN_IF_ERROR(trainer::CheckDatasets(job, &shape));
//   trainer::MemoryEstimate rank = trainer::EstimateRankMemory(*job.spec.trainer, shape);
//   if (rank.total() * job.spec.ranks_per_worker > limit) ... rank.Describe() ...
//
// The estimate counts the buffers the trainer allocates (trainer.cc, model.cc, optimizer.cc,
// batch_stager.cc): the data sets (every rank loads both splits), the parameters with their
// gradients, optimizer state and the host copy a checkpoint is taken from, and the per-batch
// activations and staged inputs. It leaves out what does not scale with the manifest (code, the
// communicator's fixed buffers), so it is a lower bound: what it refuses cannot run. It is of host
// memory: for `device: cuda` the parameters, gradients, optimizer state and activations live on
// the GPU and are left out (only the host copy and the staged batches count).
//
// With a pipeline (spec.trainer.pipeline.stages > 1) a rank holds its stage's layers, their
// state, and the activations of the micro-batches its schedule keeps (pipeline_stage.h): the
// estimate is that of the stage that needs the most.
#pragma once

#include <cstdint>
#include <string>

#include "common/spec/training_job.h"
#include "worker/trainer/dataset.h"

namespace lockstep::trainer {

// Bytes, as doubles: a hostile manifest (hidden: [2147483647]) must not overflow the arithmetic.
struct MemoryEstimate {
  double data_bytes = 0;   // both splits' features and labels
  double model_bytes = 0;  // parameters, gradients, optimizer state, host copy
  double batch_bytes = 0;  // activations, backward scratch, staged input batches
  int64_t parameters = 0;  // saturates at INT64_MAX
  int stage = -1;          // with a pipeline: the stage estimated (the largest), of `stages`
  int stages = 1;

  double total() const { return data_bytes + model_bytes + batch_bytes; }
  // "214 MiB (model 3.1 MiB for 203530 parameters; batch 851 KiB; data 210 MiB)", with a
  // pipeline "... (stage 0 of 2: model ...".
  std::string Describe() const;
};

MemoryEstimate EstimateRankMemory(const spec::TrainerSpec& trainer, const DataShape& shape);
// The same model and batch trained without a pipeline (what the pipeline saves).
MemoryEstimate EstimateRankMemoryWithoutPipeline(const spec::TrainerSpec& trainer,
                                                 const DataShape& shape);

// Physical memory of this machine, or the cgroup v2 memory.max when that is lower (a container's
// limit); 0 when neither can be read.
double MachineMemoryBytes();

// "1.5 GiB", "640 MiB": a byte count for messages.
std::string FormatBytes(double bytes);

}  // namespace lockstep::trainer
