#include "worker/ps/ps_job.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/trainer/trainer.h"

namespace lockstep::ps {

static_assert(ShardTable::kMaxShardBytes == spec::kMaxParameterServerShardBytes,
              "the manifest's bound on a server's table is the table's own");

namespace {

// One clock call's bound inside a longer wait: a server that went away is noticed this soon.
constexpr int64_t kClockSliceMs = 2000;

// Reports `clock` and waits until every worker's clock is >= wait_for (with -1: at once), in
// calls of at most kClockSliceMs, until options.wait_timeout_ms has passed.
StatusOr<PsClock> ReportClock(PsClient& client, const PsTrainingOptions& options, int64_t clock,
                              int64_t wait_for, bool initialized = false) {
  ClockOptions call;
  call.worker = options.worker;
  call.workers = options.job.spec.replicas;
  call.clock = clock;
  call.wait_for = wait_for;
  call.initialized = initialized;
  const Deadline deadline = Deadline::AfterMs(options.wait_timeout_ms);
  while (true) {
    call.timeout_ms = std::max<int64_t>(1, std::min(kClockSliceMs, deadline.remaining_ms()));
    StatusOr<PsClock> answer = client.Clock(call);
    if (answer.ok()) return answer;
    // A wait that ran out, or a server that stopped while this call waited (it is being
    // restarted), is asked again until the deadline.
    const StatusCode code = answer.status().code();
    if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kCancelled) return answer;
    if (deadline.expired()) {
      if (code != StatusCode::kDeadlineExceeded) return answer;
      return DeadlineExceededError("worker " + std::to_string(options.worker) + " waited " +
                                   std::to_string(options.wait_timeout_ms) +
                                   " ms for the other workers: " + answer.status().message());
    }
    if (options.stop != nullptr && options.stop->load()) return CancelledError("stopped");
  }
}

}  // namespace

StatusOr<SparseModelSpec> SparseModelSpecOf(const spec::TrainingJob& job) {
  if (!job.spec.trainer.has_value() ||
      job.spec.trainer->sync.strategy != spec::SyncStrategy::kParameterServer ||
      !job.spec.trainer->model.embedding.has_value()) {
    return InvalidArgumentError(
        "spec.trainer.sync.strategy: the job does not train through parameter servers");
  }
  const spec::TrainerSpec& trainer = *job.spec.trainer;
  SparseModelSpec model;
  model.fields = trainer.model.embedding->fields;
  model.dim = trainer.model.embedding->dim;
  model.table_rows = trainer.model.embedding->rows;
  model.hidden = trainer.model.hidden;
  model.activation = trainer::ToKernelActivation(trainer.model.activation);
  model.learning_rate = static_cast<float>(trainer.optimizer.learning_rate);
  model.seed = trainer.seed;
  model.max_batch = trainer.batch_size;
  return model;
}

StatusOr<std::vector<TableSpec>> JobTables(const spec::TrainingJob& job) {
  LOCKSTEP_ASSIGN_OR_RETURN(SparseModelSpec spec, SparseModelSpecOf(job));
  // The MLP's size, from the model itself (a batch of one: its workspace is not used).
  spec.max_batch = 1;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SparseModel> model, SparseModel::Create(spec));
  return std::vector<TableSpec>{EmbeddingTable(spec),
                                DenseTable(spec, static_cast<int64_t>(model->mlp_params().size()))};
}

int64_t PsTotalSteps(const spec::TrainingJob& job, int64_t train_samples) {
  const spec::TrainerSpec& trainer = *job.spec.trainer;
  if (trainer.steps > 0) return trainer.steps;
  const int64_t global = std::max<int64_t>(1, trainer.batch_size * job.spec.replicas);
  return trainer.epochs * ((std::max<int64_t>(train_samples, 1) + global - 1) / global);
}

StatusOr<PsTrainingResult> TrainThroughServers(
    const PsTrainingOptions& options, const ClickLog& train, const ClickLog* test, PsClient& client,
    const std::function<void(const PsProgress&)>& on_progress,
    const std::function<void(const PsStep&)>& on_step) {
  const spec::TrainingJob& job = options.job;
  LOCKSTEP_ASSIGN_OR_RETURN(SparseModelSpec spec, SparseModelSpecOf(job));
  const int workers = job.spec.replicas;
  if (options.worker < 0 || options.worker >= workers) {
    return InvalidArgumentError("worker " + std::to_string(options.worker) + " of a job of " +
                                std::to_string(workers) + " workers");
  }
  if (train.samples < 1) return InvalidArgumentError("the train log holds no samples");
  const spec::ParameterServerSyncSpec& sync = job.spec.trainer->sync.parameter_server;
  const int64_t batch = job.spec.trainer->batch_size;
  const int64_t total = PsTotalSteps(job, train.samples);
  const int64_t log_interval = std::max<int64_t>(1, job.spec.trainer->log_interval_steps);
  // The log in batches, the last one short: global batch k of a pass is batches k x workers ..
  // k x workers + workers - 1.
  const int64_t batches_per_pass = (train.samples + batch - 1) / batch;

  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SparseModel> model, SparseModel::Create(spec));
  ServerTable embeddings(client, EmbeddingTable(spec));
  ServerTable dense(client, DenseTable(spec, static_cast<int64_t>(model->mlp_params().size())));
  GeoTable geo_embeddings(embeddings, spec.learning_rate, 1.0f);
  GeoTable geo_dense(dense, spec.learning_rate, 1.0f / static_cast<float>(workers));
  const bool geo = sync.mode == spec::ParameterServerMode::kGeo;
  TableRows& step_embeddings = geo ? static_cast<TableRows&>(geo_embeddings) : embeddings;
  TableRows& step_dense = geo ? static_cast<TableRows&>(geo_dense) : dense;
  SparseStepOptions step_options;
  if (sync.mode == spec::ParameterServerMode::kSync) {
    step_options.push = PushKind::kDeferred;
    step_options.share = 1.0f / static_cast<float>(workers);
  }

  // Where this worker is: 0, or where its predecessor got to.
  LOCKSTEP_ASSIGN_OR_RETURN(PsClock where, ReportClock(client, options, -1, -1));
  PsTrainingResult result;
  if (where.clock > 0) {
    result.resumed_from_step = where.clock;
    LOCKSTEP_LOG(INFO) << "worker " << options.worker << " resumes at step " << where.clock
                       << " of " << total << ", where the servers' clock has it";
  }
  if (options.worker == 0 && !where.initialized) {
    LOCKSTEP_RETURN_IF_ERROR(model->InitializeDense(dense));
    LOCKSTEP_RETURN_IF_ERROR(ReportClock(client, options, -1, -1, /*initialized=*/true).status());
  }
  // The step before which a step may not start: sync waits for every worker's previous step,
  // bounded staleness for the one S before it; every first step for the chief's initial values.
  auto wait_for = [&](int64_t step, bool first) -> int64_t {
    int64_t bound = -1;
    if (sync.mode == spec::ParameterServerMode::kSync) bound = step;
    if (sync.mode == spec::ParameterServerMode::kAsync && sync.staleness >= 0) {
      bound = std::max<int64_t>(0, step - sync.staleness);
    }
    return first ? std::max<int64_t>(bound, 0) : bound;
  };

  int64_t step = std::max<int64_t>(where.clock, 0);
  if (step < total) {
    // Where this worker is, told to every server again: a predecessor lost while it reported
    // may have reached only some of them, and the others would wait for it for ever.
    LOCKSTEP_RETURN_IF_ERROR(ReportClock(client, options, step, wait_for(step, true)).status());
  }
  double loss_sum = 0;
  int64_t loss_steps = 0, samples = 0;
  double report_started = MonotonicSeconds();
  const double started = report_started;
  while (step < total) {
    if (options.stop != nullptr && options.stop->load()) return CancelledError("stopped");
    const double step_started = MonotonicSeconds();
    const PsTraffic traffic_before = on_step ? client.traffic() : PsTraffic();
    const int64_t first = ((step * workers + options.worker) % batches_per_pass) * batch;
    const int64_t rows = std::min(batch, train.samples - first);
    LOCKSTEP_ASSIGN_OR_RETURN(
        double loss, model->Step(train, first, rows, step_embeddings, &step_dense, step_options));
    ++step;
    loss_sum += loss;
    ++loss_steps;
    samples += rows;
    if (geo && (step % sync.geo_interval == 0 || step == total)) {
      LOCKSTEP_RETURN_IF_ERROR(geo_embeddings.Sync());
      LOCKSTEP_RETURN_IF_ERROR(geo_dense.Sync());
    }
    // This step is done (its pushes acknowledged): report it, and wait for what the next needs.
    const double reported = MonotonicSeconds();
    LOCKSTEP_RETURN_IF_ERROR(
        ReportClock(client, options, step, step < total ? wait_for(step, false) : -1).status());
    result.last_loss = loss;
    if (on_step) {
      const PsTraffic traffic_after = client.traffic();
      const double now = MonotonicSeconds();
      PsStep done;
      done.seconds = now - step_started;
      done.wait_seconds = now - reported;
      done.samples = rows;
      done.wire_bytes =
          static_cast<int64_t>((traffic_after.request_bytes + traffic_after.response_bytes) -
                               (traffic_before.request_bytes + traffic_before.response_bytes));
      on_step(done);
    }
    if (step % log_interval == 0 || step == total) {
      const double now = MonotonicSeconds();
      PsProgress progress;
      progress.step = step;
      progress.total_steps = total;
      progress.loss = loss_sum / static_cast<double>(loss_steps);
      progress.samples_per_second =
          now > report_started ? static_cast<double>(samples) / (now - report_started) : 0;
      progress.resumed_from_step = result.resumed_from_step;
      if (on_progress) on_progress(progress);
      loss_sum = 0;
      loss_steps = 0;
      samples = 0;
      report_started = now;
    }
  }
  const double trained_seconds = MonotonicSeconds() - started;
  const int64_t trained_steps = step - std::max<int64_t>(where.clock, 0);
  result.steps = step;
  result.samples_per_second =
      trained_seconds > 0 ? static_cast<double>(trained_steps * batch) / trained_seconds : 0;
  // The job ends when every worker has: the chief's model is then the final one.
  LOCKSTEP_RETURN_IF_ERROR(ReportClock(client, options, step, total).status());
  if (options.worker == 0 && test != nullptr && test->samples > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<double> p,
                              model->Predict(*test, 0, test->samples, embeddings, &dense));
    double log_loss = 0;
    int64_t correct = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double q = std::clamp(p[i], 1e-12, 1.0 - 1e-12);
      log_loss -= test->labels[i] == 1 ? std::log(q) : std::log(1.0 - q);
      correct += (p[i] >= 0.5) == (test->labels[i] == 1) ? 1 : 0;
    }
    result.test_auc = Auc(p, test->labels);
    result.test_log_loss = log_loss / static_cast<double>(p.size());
    result.test_accuracy = static_cast<double>(correct) / static_cast<double>(p.size());
  }
  result.traffic = client.traffic();
  return result;
}

}  // namespace lockstep::ps
