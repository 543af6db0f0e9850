// What a parameter-server job's manifest (spec.parameterServers, sync.strategy parameterServer,
// model.embedding) makes of its model, its servers' tables and one worker's training.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(SparseModelSpec model, SparseModelSpecOf(job));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::vector<TableSpec> tables, JobTables(job));  // what servers hold
//   PsTrainingOptions options{.job = job, .worker = 2};
//   LOCKSTEP_ASSIGN_OR_RETURN(PsTrainingResult result,
//                             TrainThroughServers(options, train, &test, *client, on_progress));
//
// One worker's training (TrainThroughServers), by mode (docs/parameter-servers.md):
//  - every step: pull the rows its batch uses and the MLP, forward and backward, push their
//    gradients, report its clock (steps finished) to every server;
//  - sync: each step first waits until every worker has finished the step before, and its
//    gradients (each weighted 1 / workers) are deferred: the servers apply their sum when the
//    last worker reports the step, so every step trains one global batch of workers x batchSize
//    samples, as synchronous SGD does;
//  - async: no step waits for another worker's; with staleness S a step waits until the slowest
//    worker is at most S steps behind (stale synchronous parallel);
//  - geo: the worker trains copies of the rows it uses (GeoTable) and pushes their changes every
//    geoInterval steps, the MLP's weighted 1 / workers.
// Worker w's step t trains batch (t x workers + w) mod B of the log's B batches of batchSize
// samples (the last one short), so that the workers' batches of one step are one global batch. A
// worker that starts again learns its clock from the servers and goes on from there. Every worker
// ends by waiting for every other to finish (so the job's end is the last step's), and the chief
// (worker 0) then evaluates the test log with the servers' final model.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/ps/click_log.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/shard_table.h"
#include "worker/ps/sparse_model.h"

namespace lockstep::ps {

// INVALID_ARGUMENT unless the job trains through parameter servers (the manifest's parser has
// checked the rest).
StatusOr<SparseModelSpec> SparseModelSpecOf(const spec::TrainingJob& job);
// The tables every server holds its shard of: "embeddings" and "dense" (the MLP).
StatusOr<std::vector<TableSpec>> JobTables(const spec::TrainingJob& job);
// Steps each worker trains: trainer.steps, or epochs over the train log's samples in global
// batches of replicas x batchSize.
int64_t PsTotalSteps(const spec::TrainingJob& job, int64_t train_samples);

struct PsTrainingOptions {
  spec::TrainingJob job;
  int worker = 0;  // 0 .. replicas - 1
  // How long a wait for the other workers (a synchronous step, the staleness bound, the chief's
  // initialisation, the end) may last before the worker gives up: a lost worker's replacement
  // must arrive within it.
  int64_t wait_timeout_ms = 300000;
  const std::atomic<bool>* stop = nullptr;  // set: the worker returns CANCELLED at a step boundary
};

struct PsProgress {
  int64_t step = 0;  // steps this worker has finished
  int64_t total_steps = 0;
  double loss = 0;                // mean over the steps since the last report
  double samples_per_second = 0;  // this worker's
  int64_t resumed_from_step = -1;
};

// One step as the worker timed it (for its metrics).
struct PsStep {
  double seconds = 0;       // the whole step: pulls, compute, pushes and the clock's wait
  double wait_seconds = 0;  // of it, the clock report and the wait for the other workers
  int64_t samples = 0;      // this worker's batch
  int64_t wire_bytes = 0;   // pulled and pushed, serialized
};

struct PsTrainingResult {
  int64_t steps = 0;  // this worker's, all of them (a replacement's include its predecessors')
  int64_t resumed_from_step = -1;  // where this process began, when not at 0
  double last_loss = 0;
  double samples_per_second = 0;
  // The chief's evaluation of the test log (-1 when there is none, or this is not the chief).
  double test_auc = -1;
  double test_log_loss = -1;
  double test_accuracy = -1;  // click predicted at p >= 0.5
  PsTraffic traffic;
};

StatusOr<PsTrainingResult> TrainThroughServers(
    const PsTrainingOptions& options, const ClickLog& train, const ClickLog* test, PsClient& client,
    const std::function<void(const PsProgress&)>& on_progress = {},
    const std::function<void(const PsStep&)>& on_step = {});

}  // namespace lockstep::ps
